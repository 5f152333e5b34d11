-- Engine schema v1. {{schema}} is replaced by the quoted engine schema name.
-- Runs inside the migration transaction, after CREATE SCHEMA and under the
-- migration advisory lock.

-- One row per (projection version, stream): the last event of the stream that
-- is accounted for, and how the stream's events were accounted for. The counts
-- make conservation (events == applied + skipped + dead_lettered) checkable
-- from durable state after a crash.
CREATE TABLE {{schema}}.cursors (
    projection      text        NOT NULL,
    version         bigint      NOT NULL,
    stream_id       text        NOT NULL,
    stream_position bigint      NOT NULL,
    position        bigint      NOT NULL,
    applied         bigint      NOT NULL DEFAULT 0,
    skipped         bigint      NOT NULL DEFAULT 0,
    dead_lettered   bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, version, stream_id)
);

COMMENT ON TABLE {{schema}}.cursors IS
    'pgscribe: per-stream cursor of each projection version; an event at or below its stream''s stream_position is already accounted for';

-- One row per projection version: the contiguous watermark (everything at or
-- below lsn is durably accounted for), the slot it confirms, and the phase.
CREATE TABLE {{schema}}.watermarks (
    projection     text        NOT NULL,
    version        bigint      NOT NULL,
    slot_name      text,
    lsn            pg_lsn,
    position       bigint,
    commit_time    timestamptz,
    phase          text        NOT NULL DEFAULT 'backfilling', -- backfilling | live
    backfill_total bigint,
    backfill_done  bigint,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, version)
);

COMMENT ON TABLE {{schema}}.watermarks IS
    'pgscribe: contiguous watermark, replication slot and phase of each projection version';

-- Events that could not be applied, written in the same transaction as the
-- cursor advance that accounts for them.
CREATE TABLE {{schema}}.dead_letters (
    id               bigserial   PRIMARY KEY,
    projection       text        NOT NULL,
    version          bigint      NOT NULL,
    position         bigint      NOT NULL,
    event_id         text        NOT NULL,
    stream_id        text        NOT NULL,
    stream_position  bigint      NOT NULL,
    event_type       text        NOT NULL,
    error_kind       text        NOT NULL,
    error_message    text        NOT NULL,
    event_data       jsonb,
    event_metadata   jsonb,
    occurred_at      timestamptz,
    dead_lettered_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX dead_letters_projection_id_idx
    ON {{schema}}.dead_letters (projection, version, id);
CREATE INDEX dead_letters_projection_stream_idx
    ON {{schema}}.dead_letters (projection, version, stream_id);

COMMENT ON TABLE {{schema}}.dead_letters IS
    'pgscribe: events dead-lettered by a rule error or an integrity-class SQL error, with the event as it was';

-- Fencing: the node holding a projection version's advisory lock bumps epoch;
-- every batch transaction checks it.
CREATE TABLE {{schema}}.leases (
    projection  text        NOT NULL,
    version     bigint      NOT NULL,
    epoch       bigint      NOT NULL,
    node        text        NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, version)
);

COMMENT ON TABLE {{schema}}.leases IS
    'pgscribe: fencing epoch and active node of each projection version';
