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
