-- A halted projection keeps its lock (so no other node takes over only to
-- halt the same way) and records why here, so `pgscribe status` can tell a
-- halt from a stop. Cleared when a node (re)acquires the lease.
ALTER TABLE {{schema}}.leases
    ADD COLUMN halted_at   timestamptz,
    ADD COLUMN halt_reason text;
