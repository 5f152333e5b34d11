-- Zero-downtime rebuilds (issue 15): which version of a projection is
-- served, what `pgscribe migrate` ran in each version's schema, and the
-- events a version adopted from a projector it replaced.

-- One row per projection that has been promoted: the version whose tables
-- the views in serve_schema read. `pgscribe promote` writes it in the same
-- transaction as the views, so the row and the views never disagree.
CREATE TABLE {{schema}}.served (
    projection   text        PRIMARY KEY,
    version      bigint      NOT NULL,
    serve_schema text        NOT NULL,
    promoted_at  timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE {{schema}}.served IS
    'pgscribe: the projection version that pgscribe promote pointed the stable names (views in serve_schema) at';

-- One row per projection version whose read-model DDL file `pgscribe
-- migrate` ran: the version's schema (so retire can drop it even when the
-- version is no longer configured) and the file's checksum (a DDL file runs
-- once per version; a changed file is reported, never re-run).
CREATE TABLE {{schema}}.read_models (
    projection  text        NOT NULL,
    version     bigint      NOT NULL,
    schema_name text        NOT NULL,
    ddl_file    text        NOT NULL,
    ddl_sha256  text        NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, version)
);

COMMENT ON TABLE {{schema}}.read_models IS
    'pgscribe: read-model DDL that pgscribe migrate ran in a projection version''s schema';

-- Events at or below start_after_position that a version adopted on its
-- first start (the replaced projector had applied them). Conservation:
-- events == applied + skipped + dead_lettered + adopted.
ALTER TABLE {{schema}}.cursors
    ADD COLUMN adopted bigint NOT NULL DEFAULT 0;
