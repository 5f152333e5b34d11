-- Where an interrupted backfill resumes (engine/scan.go, resumeScan): the
-- slot's consistent point the backfill reads up to, the highest position
-- its snapshot saw, and the position at or below which every event of the
-- snapshot is accounted for, with the events counted up to it. NULL when
-- no backfill is recorded as resumable (before the first progress save, a
-- phase other than backfilling, a watermark written by an older binary):
-- the backfill then starts again from a new snapshot.
ALTER TABLE {{schema}}.watermarks
  ADD COLUMN backfill_lsn   pg_lsn,
  ADD COLUMN backfill_upto  bigint,
  ADD COLUMN backfill_after bigint;
