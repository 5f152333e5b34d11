-- progress: one row per projection version the engine knows (a lease or a
-- watermark row). state is derived like `pgscribe status` does from the
-- target database alone: stopped (nobody holds the version's advisory
-- lock), halted, paused (pgscribe pause, 0030), backfilling or live.
-- lag_seconds and backlog_events are the active engine's last measurement
-- (every lag_interval), at measured_at. A halt wins over a pause, as in
-- `pgscribe status`.
CREATE VIEW {{schema}}.progress AS
SELECT k.projection,
       k.version,
       CASE WHEN lk.pid IS NULL THEN 'stopped'
            WHEN l.halted_at IS NOT NULL THEN 'halted'
            WHEN c.paused_at IS NOT NULL THEN 'paused'
            WHEN w.phase IS DISTINCT FROM 'live' THEN 'backfilling'
            ELSE 'live' END                            AS state,
       {{schema}}.is_served(k.projection, k.version) AS served,
       CASE WHEN lk.pid IS NOT NULL THEN l.node END   AS active_node,
       w.lsn                                          AS watermark_lsn,
       w.commit_time                                  AS watermark_commit_time,
       w.updated_at                                   AS watermark_updated_at,
       w.lag_seconds,
       w.backlog_events,
       w.measured_at
FROM (SELECT projection, version FROM {{schema}}.leases
      UNION SELECT projection, version FROM {{schema}}.watermarks) AS k
LEFT JOIN {{schema}}.leases AS l ON l.projection = k.projection AND l.version = k.version
LEFT JOIN {{schema}}.watermarks AS w ON w.projection = k.projection AND w.version = k.version
LEFT JOIN {{schema}}.controls AS c ON c.projection = k.projection AND c.version = k.version
LEFT JOIN LATERAL (
    SELECT {{schema}}.lock_key(n.nspname, k.projection, k.version) AS v
    FROM pg_class AS c JOIN pg_namespace AS n ON n.oid = c.relnamespace
    WHERE c.oid = l.tableoid) AS lock ON true
LEFT JOIN LATERAL (
    SELECT min(pl.pid) AS pid FROM pg_locks AS pl
    WHERE pl.locktype = 'advisory' AND pl.granted AND pl.objsubid = 1
      AND pl.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND pl.classid::bigint = (lock.v >> 32) & 4294967295
      AND pl.objid::bigint = lock.v & 4294967295) AS lk ON true;

COMMENT ON VIEW {{schema}}.progress IS
    'pgscribe: per projection version: state, served, watermark (LSN, commit time), measured lag and backlog';
