-- Reading your own writes (issue 17): wait functions, the progress view,
-- and the lag and backlog the active engine measured, kept with the
-- watermark so that SQL can show them.
--
-- Every function here is SECURITY INVOKER (the default): it reads the
-- engine tables with the caller's privileges. docs/read-your-writes.md lists
-- the grants a read-only application role needs.

ALTER TABLE {{schema}}.watermarks
    ADD COLUMN lag_seconds    double precision,
    ADD COLUMN backlog_events bigint,
    ADD COLUMN measured_at    timestamptz;

COMMENT ON COLUMN {{schema}}.watermarks.lag_seconds IS
    'pgscribe: pgscribe_lag_seconds as the active engine last measured it, at measured_at';
COMMENT ON COLUMN {{schema}}.watermarks.backlog_events IS
    'pgscribe: pgscribe_backlog_events as the active engine last measured it, at measured_at';

-- The sleep between two checks of a wait: a tenth of the time waited so
-- far, at least 1 ms and at most 50 ms, never past the deadline. Early
-- checks are close together, because most waits end within the engine's
-- own latency (milliseconds) and the overshoot is at most one sleep; a long
-- wait settles at 20 checks a second, each one index probe.
CREATE FUNCTION {{schema}}.wait_nap(started timestamptz, deadline timestamptz)
RETURNS double precision
LANGUAGE sql VOLATILE PARALLEL SAFE AS $$
    SELECT greatest(0, least(
        greatest(extract(epoch FROM clock_timestamp() - started) / 10, 0.001),
        0.05,
        extract(epoch FROM deadline - clock_timestamp())))::double precision
$$;

-- A wait polls with a fresh snapshot per check, which only READ COMMITTED
-- gives: in a REPEATABLE READ or SERIALIZABLE transaction it could never
-- see the engine's later commits and would sleep to its timeout.
CREATE FUNCTION {{schema}}.wait_require_read_committed(fn text)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgscribe: % needs READ COMMITTED: this % transaction''s snapshot never sees the engine''s later commits',
            fn, upper(current_setting('transaction_isolation'))
            USING ERRCODE = 'invalid_transaction_state';
    END IF;
END
$$;

-- wait_until is the loop of both waits: with a stream_id it waits for the
-- stream's cursor to reach stream_position, else for the watermark to
-- reach lsn while the version is live. A wait that is reached at once never
-- sleeps and needs no particular isolation level.
CREATE FUNCTION {{schema}}.wait_until(
    projection text, version bigint, stream_id text, stream_position bigint, lsn pg_lsn, timeout interval)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    started  timestamptz := clock_timestamp();
    deadline timestamptz := clock_timestamp() + timeout;
    reached  boolean;
BEGIN
    LOOP
        IF wait_until.stream_id IS NOT NULL THEN
            SELECT c.stream_position >= wait_until.stream_position INTO reached FROM {{schema}}.cursors AS c
            WHERE c.projection = wait_until.projection AND c.version = wait_until.version
              AND c.stream_id = wait_until.stream_id;
        ELSE
            SELECT w.phase = 'live' AND w.lsn >= wait_until.lsn INTO reached FROM {{schema}}.watermarks AS w
            WHERE w.projection = wait_until.projection AND w.version = wait_until.version;
        END IF;
        IF reached THEN
            RETURN true;
        END IF;
        EXIT WHEN clock_timestamp() >= deadline;
        PERFORM {{schema}}.wait_require_read_committed(
            CASE WHEN wait_until.stream_id IS NULL THEN 'wait_for_lsn' ELSE 'wait_for_stream' END);
        PERFORM pg_sleep({{schema}}.wait_nap(started, deadline));
    END LOOP;
    RETURN false;
END
$$;

-- wait_for_stream is true as soon as the projection version has accounted
-- for that position of that stream (applied, skipped or dead-lettered;
-- event_outcome below tells which), false at the timeout. Exact: it reads
-- the per-stream cursor, which commits in the batch's transaction together
-- with the read-model rows.
CREATE FUNCTION {{schema}}.wait_for_stream(
    projection text, version bigint, stream_id text, stream_position bigint,
    timeout interval DEFAULT '30s')
RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT {{schema}}.wait_until(projection, version, stream_id, stream_position, NULL, timeout)
$$;

-- event_outcome says how the projection version accounted for one event,
-- waiting up to timeout (default: not at all) for it to be accounted for:
--   'pending'       not yet (or the stream has no such position)
--   'dead_lettered' a dead letter of it is on record (dead_letters)
--   'accounted'     applied, or skipped because no rule matched
-- Exact: the per-stream cursor and the dead letter commit in the batch's
-- transaction, together with the read-model rows.
CREATE FUNCTION {{schema}}.event_outcome(
    projection text, version bigint, stream_id text, stream_position bigint,
    timeout interval DEFAULT '0')
RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF NOT {{schema}}.wait_for_stream(projection, version, stream_id, stream_position, timeout) THEN
        RETURN 'pending';
    END IF;
    -- A statement of its own: its snapshot is taken after the wait, so it
    -- sees a dead letter that committed during it.
    IF EXISTS (SELECT FROM {{schema}}.dead_letters AS d
               WHERE d.projection = event_outcome.projection AND d.version = event_outcome.version
                 AND d.stream_id = event_outcome.stream_id
                 AND d.stream_position = event_outcome.stream_position) THEN
        RETURN 'dead_lettered';
    END IF;
    RETURN 'accounted';
END
$$;

-- wait_for_lsn is true once every source transaction committed at or
-- before lsn is accounted for: the version is live and its stored
-- watermark is at or past lsn. Take lsn with pg_current_wal_lsn() on the
-- source after the append commits. The engine stores the watermark within
-- a few milliseconds of it moving, and moves it to the WAL end the server
-- reports when nothing is in flight, so waits for an idle database end too.
CREATE FUNCTION {{schema}}.wait_for_lsn(
    projection text, version bigint, lsn pg_lsn, timeout interval DEFAULT '30s')
RETURNS boolean
LANGUAGE sql VOLATILE STRICT AS $$
    SELECT {{schema}}.wait_until(projection, version, NULL, NULL, lsn, timeout)
$$;

-- Only roles granted EXECUTE may wait (the engine's owner role can).
REVOKE EXECUTE ON FUNCTION {{schema}}.event_outcome(text, bigint, text, bigint, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.wait_for_stream(text, bigint, text, bigint, interval) FROM PUBLIC;
REVOKE EXECUTE ON FUNCTION {{schema}}.wait_for_lsn(text, bigint, pg_lsn, interval) FROM PUBLIC;

-- lock_key is leader.Key in SQL: FNV-1a 64 of
-- 'pgscribe' NUL schema NUL projection NUL version, as a signed bigint.
-- The progress view finds a version's advisory lock with it.
CREATE FUNCTION {{schema}}.lock_key(schema_name text, projection text, version bigint)
RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    b  bytea := convert_to('pgscribe', 'UTF8') || '\x00'::bytea || convert_to(schema_name, 'UTF8')
                || '\x00'::bytea || convert_to(projection, 'UTF8') || '\x00'::bytea || convert_to(version::text, 'UTF8');
    h  numeric := 14695981039346656037;
    lo int;
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        lo := (h % 256)::int;
        h := ((h - lo + (lo # get_byte(b, i))) * 1099511628211) % 18446744073709551616;
    END LOOP;
    IF h >= 9223372036854775808 THEN
        h := h - 18446744073709551616;
    END IF;
    RETURN h::bigint;
END
$$;

-- is_served says whether the projection version is the one applications
-- read. Until a migration that records served versions replaces this
-- function (same signature), it returns NULL: unknown.
CREATE FUNCTION {{schema}}.is_served(projection text, version bigint)
RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT NULL::boolean
$$;

-- The progress view is created by 0031, once the operator controls (0030)
-- it reads exist.
