-- Read-model tables of the demo projections in config.toml.example.
-- The events table and pgscribe's own schema are created by
-- `pgscribe migrate -events-table`; this file only holds the read models.
-- Idempotent: safe to run before every demo.

-- Projection balances v1: one row per account.
CREATE TABLE IF NOT EXISTS balances (
  account_id text        PRIMARY KEY,
  owner      text        NOT NULL,
  balance    bigint      NOT NULL DEFAULT 0,
  closed     boolean     NOT NULL DEFAULT false,
  updated_at timestamptz NOT NULL            -- occurred_at of the last event applied
);

-- Projection activity v1: one row per account event.
CREATE TABLE IF NOT EXISTS account_activity (
  event_id    uuid        PRIMARY KEY,       -- events.id
  account_id  text        NOT NULL,
  type        text        NOT NULL,
  amount      bigint      NOT NULL DEFAULT 0, -- amount, or initial for AccountOpened; else 0
  occurred_at timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS account_activity_account_idx
  ON account_activity (account_id, occurred_at);
