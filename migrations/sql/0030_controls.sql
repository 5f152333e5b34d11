-- Operator controls (pgscribe pause, resume, deadletters retry). They live in
-- the engine schema, not in a node's memory, so that they hold across
-- restarts and failovers: whichever node holds a projection version's lock
-- reads them (every half second) and obeys them.

-- One row per projection version that an operator ever paused or resumed.
-- paused_at set = paused. resume_seq grows with every `pgscribe resume`:
-- a node holding a halted projection retries at once when it sees it move.
CREATE TABLE {{schema}}.controls (
    projection   text        NOT NULL,
    version      bigint      NOT NULL,
    paused_at    timestamptz,
    pause_reason text,
    paused_by    text,
    resume_seq   bigint      NOT NULL DEFAULT 0,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, version)
);

COMMENT ON TABLE {{schema}}.controls IS
    'pgscribe: operator pause and resume of each projection version (pgscribe pause / resume)';

-- `pgscribe deadletters retry` queues a request here; the active node runs
-- it (in id order) and records what became of it. The selectors are those
-- of the command: NULL selects any.
CREATE TABLE {{schema}}.retry_requests (
    id           bigserial   PRIMARY KEY,
    projection   text        NOT NULL,
    version      bigint      NOT NULL,
    ids          bigint[],
    error_kind   text,
    stream_id    text,
    skip         boolean     NOT NULL DEFAULT false, -- deadletters skip: drop the rows, release their streams
    requested_by text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now(),
    node         text,        -- the node that ran it
    started_at   timestamptz,
    done_at      timestamptz,
    selected     bigint,      -- dead letters it found
    applied      bigint,      -- re-applied (or now skipped by the rules): row removed
    failed       bigint,      -- failed again: row kept with the new reason
    error        text         -- why the request as a whole failed, if it did
);

CREATE INDEX retry_requests_pending_idx
    ON {{schema}}.retry_requests (projection, version, id) WHERE done_at IS NULL;

COMMENT ON TABLE {{schema}}.retry_requests IS
    'pgscribe: dead-letter retries asked for by pgscribe deadletters retry, run by the active node';

-- on_error = "park": a dead-lettered event parks its stream. parked_since is
-- the stream_position of the dead letter that parked it (NULL: not parked);
-- parked counts the stream's events held in parked_events. Conservation is
-- events = applied + skipped + dead_lettered + parked.
ALTER TABLE {{schema}}.cursors
    ADD COLUMN parked       bigint NOT NULL DEFAULT 0,
    ADD COLUMN parked_since bigint;

-- The events a parked stream holds, in the stream's order, written in the
-- batch that accounts for them (memory stays bounded however many a stream
-- collects). `deadletters retry` or `skip` releases them in order.
CREATE TABLE {{schema}}.parked_events (
    projection      text        NOT NULL,
    version         bigint      NOT NULL,
    stream_id       text        NOT NULL,
    stream_position bigint      NOT NULL,
    position        bigint      NOT NULL,
    event_id        text        NOT NULL,
    event_type      text        NOT NULL,
    event_data      jsonb,
    event_metadata  jsonb,
    occurred_at     timestamptz,
    parked_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (projection, version, stream_id, stream_position)
);

COMMENT ON TABLE {{schema}}.parked_events IS
    'pgscribe: events held behind a dead letter of their stream (on_error = park), released in order by deadletters retry or skip';
