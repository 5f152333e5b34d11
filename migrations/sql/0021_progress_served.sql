-- is_served reads the served record of 0020 (promote writes it in the
-- transaction that swaps the views): NULL for a projection never promoted,
-- else whether this version is the served one. SECURITY DEFINER with a
-- fixed search_path, so that a reader of the progress view needs no grant
-- on served: the function tells only which version serves.
CREATE OR REPLACE FUNCTION {{schema}}.is_served(projection text, version bigint)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.version = is_served.version
    FROM {{schema}}.served AS s
    WHERE s.projection = is_served.projection
$$;
