// Package cursor stores what a projection version has accounted for: one
// cursor per stream (the last stream_position applied, skipped or
// dead-lettered, with per-stream counts) and one watermark per version (the
// contiguous LSN below which everything is durable, the slot and the phase).
//
// Every write takes the caller's event.Querier, so cursor advances commit in the
// batch transaction together with the read-model writes and dead letters:
// a rolled-back batch leaves the cursors where they were. An event whose
// stream_position is at or below its stream's cursor was already accounted
// for; that is exact as long as stream_position grows in commit order within
// a stream, which UNIQUE (stream_id, stream_position) with expected-version
// appends guarantees.
package cursor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// Cursor is a stream's last accounted-for event.
type Cursor struct {
	StreamPosition, Position int64
	// Parked says the stream is parked (on_error = "park"), since
	// ParkedSince: the stream_position of the dead letter that parked it
	// (0 is a position like any other: streams may start at 0).
	Parked      bool
	ParkedSince int64
}

// Advance moves one stream's cursor to the last event of a batch and adds
// how the batch's events of that stream were accounted for.
type Advance struct {
	StreamID                       string
	StreamPosition, Position       int64
	Applied, Skipped, DeadLettered int64
	Parked                         int64 // events held (on_error = "park")
	// Parks, when set, parks the stream from position ParkedSince on.
	Parks       bool
	ParkedSince int64
}

// The phases of a projection version.
const (
	PhaseBackfilling = "backfilling" // reading the table under the slot's snapshot
	PhaseLive        = "live"        // streaming from the slot
)

// Watermark is a projection version's row in the watermarks table.
//
// LSN, Position and CommitTime describe the contiguous watermark: everything
// at or below LSN is durably accounted for. Backfill events carry no LSN, so
// during backfill LSN stays zero and Position tracks progress.
type Watermark struct {
	SlotName      string
	LSN           event.LSN
	Position      int64
	CommitTime    time.Time // zero when unknown
	Phase         string
	BackfillTotal int64 // events the backfill snapshot holds
	BackfillDone  int64 // events backfilled so far
	UpdatedAt     time.Time
	// MeasuredAt, LagSeconds and Backlog are the active engine's last lag
	// measurement (pgscribe_lag_seconds, pgscribe_backlog_events), which
	// the progress view shows. A save with a zero MeasuredAt keeps the
	// stored ones; a negative Backlog stores NULL (unknown).
	MeasuredAt time.Time
	LagSeconds float64
	Backlog    int64
}

// totalsColumns are the sums of Totals, in its field order.
const totalsColumns = `count(*), coalesce(sum(applied), 0)::bigint,
  coalesce(sum(skipped), 0)::bigint, coalesce(sum(dead_lettered), 0)::bigint, coalesce(sum(adopted), 0)::bigint,
  coalesce(sum(parked), 0)::bigint, count(*) FILTER (WHERE parked_since IS NOT NULL)`

// AllTotals returns the Totals of every projection version that has
// cursors, in one statement (status reads every version's at once).
func AllTotals(ctx context.Context, q event.Querier, schema string) (map[event.VersionKey]Totals, error) {
	rows, err := q.Query(ctx, "SELECT projection, version, "+totalsColumns+" FROM "+
		pgx.Identifier{schema, "cursors"}.Sanitize()+" GROUP BY projection, version")
	if err != nil {
		return nil, fmt.Errorf("cursor totals: %w", err)
	}
	defer rows.Close()
	out := map[event.VersionKey]Totals{}
	for rows.Next() {
		var projection string
		var version int64
		var t Totals
		if err := rows.Scan(&projection, &version, &t.Streams, &t.Applied, &t.Skipped, &t.DeadLettered, &t.Adopted,
			&t.Parked, &t.ParkedStreams); err != nil {
			return nil, fmt.Errorf("cursor totals: %w", err)
		}
		out[event.VersionKey{Projection: projection, Version: version}] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("cursor totals: %w", err)
	}
	return out, nil
}

// Totals sums a projection version's cursors. Adopted counts the events a
// version took over from the projector it replaced (start_after_position).
type Totals struct {
	Streams, Applied, Skipped, DeadLettered, Adopted int64
	// Parked counts events held by parked streams, ParkedStreams those
	// streams (on_error = "park").
	Parked, ParkedStreams int64
}

// Accounted is every event the cursors account for: applied, skipped,
// dead-lettered, adopted or parked. Conservation holds when it equals the
// number of source events.
func (t Totals) Accounted() int64 {
	return t.Applied + t.Skipped + t.DeadLettered + t.Adopted + t.Parked
}

// Head is where a stream stands at an adopted position: its last event at
// or below it, and how many of its events are at or below it.
type Head struct {
	StreamID                 string
	StreamPosition, Position int64
	Events                   int64
}

// Store reads and writes one projection version's cursors and watermark in
// an engine schema. It holds no connection and no mutable state, so one Store
// is safe for concurrent use.
type Store struct {
	projection string
	version    int64

	loadSQL, advanceSQL                      string
	loadWatermarkSQL, saveWatermarkSQL       string
	saveWatermarksSQL                        string
	moveWatermarkSQL                         string
	setPhaseSQL, totalsSQL, hasSQL, resetSQL string
	loadPointSQL, savePointSQL               string
	adoptSQL                                 string
}

// The two watermark saves (one version, many versions) write the same
// columns and merge them into the stored row alike, but for the phase:
// watermarkForward keeps the stored slot name (MoveWatermark changes it)
// and moves the watermark proper only forward, watermarkProgress keeps the
// stored backfill counts and lag measurement unless the save brings new
// ones.
const (
	watermarkColumns = `  (projection, version, slot_name, lsn, position, commit_time, phase, backfill_total, backfill_done,
   measured_at, lag_seconds, backlog_events)
`
	watermarkForward = `  slot_name      = coalesce(w.slot_name, excluded.slot_name),
  lsn            = GREATEST(w.lsn, excluded.lsn),
  position       = CASE WHEN w.lsn IS NULL OR excluded.lsn >= w.lsn THEN GREATEST(w.position, excluded.position) ELSE w.position END,
  commit_time    = CASE WHEN w.lsn IS NULL OR excluded.lsn >= w.lsn THEN excluded.commit_time ELSE w.commit_time END,
`
	watermarkProgress = `  backfill_total = coalesce(excluded.backfill_total, w.backfill_total),
  backfill_done  = coalesce(excluded.backfill_done, w.backfill_done),
  measured_at    = coalesce(excluded.measured_at, w.measured_at),
  lag_seconds    = CASE WHEN excluded.measured_at IS NULL THEN w.lag_seconds ELSE excluded.lag_seconds END,
  backlog_events = CASE WHEN excluded.measured_at IS NULL THEN w.backlog_events ELSE excluded.backlog_events END,
  updated_at     = now()`
)

// New returns the store of projection version in the engine schema.
func New(schema, projection string, version int64) *Store {
	cursors := pgx.Identifier{schema, "cursors"}.Sanitize()
	watermarks := pgx.Identifier{schema, "watermarks"}.Sanitize()
	const this = "projection = $1 AND version = $2"
	return &Store{
		projection: projection,
		version:    version,

		// One primary-key probe per stream, whatever the planner knows of
		// the table: "stream_id = ANY($3)" gets a generic plan that scans
		// every cursor of the version while the table has no statistics
		// (a first backfill), and LIMIT 1 keeps the lateral from turning
		// into the same scan as a hash join.
		loadSQL: `SELECT u.stream_id, c.stream_position, c.position, c.parked, c.parked_since
FROM unnest($3::text[]) AS u (stream_id)
CROSS JOIN LATERAL (SELECT stream_position, position, parked_since IS NOT NULL AS parked, coalesce(parked_since, 0) AS parked_since FROM ` + cursors + ` AS c
  WHERE c.projection = $1 AND c.version = $2 AND c.stream_id = u.stream_id LIMIT 1) AS c`,

		// Positions take the new values; counts add up. One statement for the
		// whole batch; Advance merges duplicate streams first, because ON
		// CONFLICT cannot touch one row twice in a statement.
		advanceSQL: "INSERT INTO " + cursors + ` AS c
  (projection, version, stream_id, stream_position, position, applied, skipped, dead_lettered, parked, parked_since)
SELECT $1, $2, u.stream_id, u.stream_position, u.position, u.applied, u.skipped, u.dead_lettered, u.parked,
  CASE WHEN u.parks THEN u.parked_since END
FROM unnest($3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bool[])
  AS u (stream_id, stream_position, position, applied, skipped, dead_lettered, parked, parked_since, parks)
ON CONFLICT (projection, version, stream_id) DO UPDATE SET
  stream_position = excluded.stream_position,
  position        = excluded.position,
  applied         = c.applied + excluded.applied,
  skipped         = c.skipped + excluded.skipped,
  dead_lettered   = c.dead_lettered + excluded.dead_lettered,
  parked          = c.parked + excluded.parked,
  parked_since    = coalesce(c.parked_since, excluded.parked_since),
  updated_at      = now()`,

		loadWatermarkSQL: `SELECT coalesce(slot_name, ''), coalesce(lsn, '0/0')::text, coalesce(position, 0),
  commit_time, phase, coalesce(backfill_total, 0), coalesce(backfill_done, 0), updated_at
FROM ` + watermarks + " WHERE " + this,

		// The watermark proper (lsn, position, commit_time) only moves
		// forward: an older save (a late writer, a replayed call) keeps the
		// stored one. GREATEST ignores NULL, so the first LSN always lands.
		// An empty slot name or phase and zero backfill counts keep the
		// stored values, so a live save does not wipe backfill progress.
		saveWatermarkSQL: "INSERT INTO " + watermarks + " AS w\n" + watermarkColumns +
			`VALUES ($1, $2, NULLIF($3, ''), $4::pg_lsn, $5, $6, coalesce(NULLIF($7, ''), 'backfilling'),
  NULLIF($8::bigint, 0), NULLIF($9::bigint, 0), $10::timestamptz, $11::float8, $12::bigint)
ON CONFLICT (projection, version) DO UPDATE SET
` + watermarkForward + `  phase          = coalesce(NULLIF($7, ''), w.phase),
` + watermarkProgress,

		// saveWatermarkSQL for many versions' saves in one statement, for
		// saves that keep the stored phase (Phase ""), as the live saves
		// do: a new row starts 'backfilling' and a stored phase stays.
		saveWatermarksSQL: "INSERT INTO " + watermarks + " AS w\n" + watermarkColumns +
			`SELECT u.projection, u.version, NULLIF(u.slot_name, ''), u.lsn::pg_lsn, u.position, u.commit_time, 'backfilling',
  NULLIF(u.backfill_total, 0), NULLIF(u.backfill_done, 0), u.measured_at, u.lag_seconds, u.backlog_events
FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::timestamptz[], $7::bigint[], $8::bigint[],
  $9::timestamptz[], $10::float8[], $11::bigint[])
  AS u (projection, version, slot_name, lsn, position, commit_time, backfill_total, backfill_done, measured_at, lag_seconds, backlog_events)
ON CONFLICT (projection, version) DO UPDATE SET
` + watermarkForward + watermarkProgress,

		moveWatermarkSQL: "UPDATE " + watermarks + " SET slot_name = $3, updated_at = now() WHERE projection = $1 AND version = $2",
		setPhaseSQL: "INSERT INTO " + watermarks + ` AS w
  (projection, version, phase, backfill_total, backfill_done)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (projection, version) DO UPDATE SET
  phase = excluded.phase, backfill_total = excluded.backfill_total,
  backfill_done = excluded.backfill_done, updated_at = now(),
  backfill_lsn = NULL, backfill_upto = NULL, backfill_after = NULL`,

		loadPointSQL: `SELECT backfill_lsn::text, backfill_upto, coalesce(backfill_after, -9223372036854775808), coalesce(backfill_done, 0),
  coalesce(backfill_total, 0)
FROM ` + watermarks + " WHERE " + this + " AND phase = 'backfilling' AND backfill_lsn IS NOT NULL AND backfill_upto IS NOT NULL",
		savePointSQL: "UPDATE " + watermarks + ` SET backfill_lsn = $3::pg_lsn, backfill_upto = $4, backfill_after = $5,
  backfill_done = $6, updated_at = now()
WHERE ` + this + " AND phase = 'backfilling'",

		totalsSQL: "SELECT " + totalsColumns + " FROM " + cursors + " WHERE " + this,

		adoptSQL: "INSERT INTO " + cursors + `
  (projection, version, stream_id, stream_position, position, adopted)
SELECT $1, $2, u.stream_id, u.stream_position, u.position, u.adopted
FROM unnest($3::text[], $4::bigint[], $5::bigint[], $6::bigint[]) AS u (stream_id, stream_position, position, adopted)`,

		hasSQL: "SELECT EXISTS (SELECT 1 FROM " + cursors + " WHERE " + this + ")",

		// One statement, so the reset is atomic even outside a transaction.
		resetSQL: "WITH c AS (DELETE FROM " + cursors + " WHERE " + this + ")\n" +
			"DELETE FROM " + watermarks + " WHERE " + this,
	}
}

// Load returns the cursors of the given streams; a stream with no cursor is
// absent from the map (which is not the same as a cursor at 0).
func (s *Store) Load(ctx context.Context, q event.Querier, streams []string) (map[string]Cursor, error) {
	out := make(map[string]Cursor, len(streams))
	if len(streams) == 0 {
		return out, nil
	}
	rows, err := q.Query(ctx, s.loadSQL, s.projection, s.version, streams)
	if err != nil {
		return nil, fmt.Errorf("load cursors: %w", err)
	}
	if err := ScanInto(rows, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Statements are the statements a batch transaction runs (the cursor
// load and advance), for a caller that prepares them on each connection.
func (s *Store) Statements() []string { return []string{s.loadSQL, s.advanceSQL} }

// LoadStatement is Load as a statement and its arguments, for a caller
// that pipelines it; read its rows with ScanInto.
func (s *Store) LoadStatement(streams []string) (string, []any) {
	return s.loadSQL, []any{s.projection, s.version, streams}
}

// ScanInto reads the rows of the load statement into a map and closes them.
func ScanInto(rows pgx.Rows, into map[string]Cursor) error {
	defer rows.Close()
	for rows.Next() {
		var id string
		var c Cursor
		if err := rows.Scan(&id, &c.StreamPosition, &c.Position, &c.Parked, &c.ParkedSince); err != nil {
			return fmt.Errorf("load cursors: %w", err)
		}
		into[id] = c
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("load cursors: %w", err)
	}
	return nil
}

// Advance writes a batch's cursor advances in one statement: each stream's
// positions are replaced and its counts added. Several entries for one stream
// are merged (counts summed, positions of the highest StreamPosition, the
// later entry on a tie). Nothing is checked against the stored position;
// deciding what is a duplicate is the caller's job, before it advances.
func (s *Store) Advance(ctx context.Context, q event.Querier, adv []Advance) error {
	if len(adv) == 0 {
		return nil
	}
	merged := merge(adv)
	n := len(merged)
	ids := make([]string, n)
	spos, pos := make([]int64, n), make([]int64, n)
	applied, skipped, dead := make([]int64, n), make([]int64, n), make([]int64, n)
	parked, since, parks := make([]int64, n), make([]int64, n), make([]bool, n)
	for i, a := range merged {
		ids[i], spos[i], pos[i] = a.StreamID, a.StreamPosition, a.Position
		applied[i], skipped[i], dead[i] = a.Applied, a.Skipped, a.DeadLettered
		parked[i], since[i], parks[i] = a.Parked, a.ParkedSince, a.Parks
	}
	if _, err := q.Exec(ctx, s.advanceSQL, s.projection, s.version, ids, spos, pos, applied, skipped, dead, parked, since, parks); err != nil {
		return fmt.Errorf("advance cursors: %w", err)
	}
	return nil
}

// merge folds entries of the same stream together, keeping first-seen order.
func merge(adv []Advance) []Advance {
	at := make(map[string]int, len(adv))
	out := make([]Advance, 0, len(adv))
	for _, a := range adv {
		i, ok := at[a.StreamID]
		if !ok {
			at[a.StreamID] = len(out)
			out = append(out, a)
			continue
		}
		m := &out[i]
		if a.StreamPosition >= m.StreamPosition {
			m.StreamPosition, m.Position = a.StreamPosition, a.Position
		}
		m.Applied += a.Applied
		m.Skipped += a.Skipped
		m.DeadLettered += a.DeadLettered
		m.Parked += a.Parked
		if !m.Parks && a.Parks {
			m.Parks, m.ParkedSince = true, a.ParkedSince // the first park of the stream
		}
	}
	return out
}

// LoadWatermark returns the version's watermark; false when it has none yet.
func (s *Store) LoadWatermark(ctx context.Context, q event.Querier) (Watermark, bool, error) {
	var w Watermark
	var lsn string
	var commit *time.Time
	err := q.QueryRow(ctx, s.loadWatermarkSQL, s.projection, s.version).Scan(
		&w.SlotName, &lsn, &w.Position, &commit, &w.Phase, &w.BackfillTotal, &w.BackfillDone, &w.UpdatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Watermark{}, false, nil
	}
	if err != nil {
		return Watermark{}, false, fmt.Errorf("load watermark: %w", err)
	}
	if w.LSN, err = event.ParseLSN(lsn); err != nil {
		return Watermark{}, false, fmt.Errorf("load watermark: %w", err)
	}
	if commit != nil {
		w.CommitTime = *commit
	}
	return w, true, nil
}

// SaveWatermark upserts the version's watermark. LSN never moves backwards:
// when w.LSN is below the stored one, LSN, Position and CommitTime stay as
// stored (at an equal LSN, CommitTime is replaced, which is how backfill
// progress is recorded at LSN 0). Position never moves backwards either: a
// save at a later LSN with a lower Position (a restarted process that has
// seen no event yet) keeps the stored one. An empty SlotName or Phase keeps
// the stored value (Phase defaults to backfilling on the first save), and so
// does a zero BackfillTotal or BackfillDone; SetPhase sets all three exactly.
func (s *Store) SaveWatermark(ctx context.Context, q event.Querier, w Watermark) error {
	sql, args, err := s.SaveWatermarkStatement(w)
	if err != nil {
		return err
	}
	if _, err := q.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("save watermark: %w", err)
	}
	return nil
}

// SaveWatermarkStatement is SaveWatermark as a statement and its
// arguments, for a caller that pipelines it.
func (s *Store) SaveWatermarkStatement(w Watermark) (string, []any, error) {
	if err := checkPhase(w.Phase, true); err != nil {
		return "", nil, fmt.Errorf("save watermark: %w", err)
	}
	var commit, measured *time.Time
	if !w.CommitTime.IsZero() {
		commit = &w.CommitTime
	}
	var lagSeconds *float64
	var backlog *int64
	if !w.MeasuredAt.IsZero() {
		measured, lagSeconds = &w.MeasuredAt, &w.LagSeconds
		if w.Backlog >= 0 {
			backlog = &w.Backlog
		}
	}
	return s.saveWatermarkSQL, []any{s.projection, s.version,
		w.SlotName, w.LSN.String(), w.Position, commit, w.Phase, w.BackfillTotal, w.BackfillDone,
		measured, lagSeconds, backlog}, nil
}

// SaveWatermarksStatement is SaveWatermarkStatement for the saves ws[i]
// of stores[i] in one statement: the saves of a group's members, which the
// engine commits together. Every save must keep the stored phase (Phase
// "") and the stores must share one engine schema; each version at most
// once.
func SaveWatermarksStatement(stores []*Store, ws []Watermark) (string, []any, error) {
	if len(stores) == 0 || len(stores) != len(ws) {
		return "", nil, fmt.Errorf("save watermarks: %d stores for %d saves", len(stores), len(ws))
	}
	n := len(ws)
	projs, slots, lsns := make([]string, n), make([]string, n), make([]string, n)
	versions, positions, totals, dones := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	commits, measured := make([]*time.Time, n), make([]*time.Time, n)
	lags, backlogs := make([]*float64, n), make([]*int64, n)
	seen := make(map[string]bool, n)
	for i, w := range ws {
		st := stores[i]
		if st.saveWatermarksSQL != stores[0].saveWatermarksSQL {
			return "", nil, fmt.Errorf("save watermarks: %s v%d is in another engine schema", st.projection, st.version)
		}
		if w.Phase != "" {
			return "", nil, fmt.Errorf("save watermarks: %s v%d: a save that sets the phase (%q) is saved alone", st.projection, st.version, w.Phase)
		}
		if key := fmt.Sprintf("%s\x00%d", st.projection, st.version); seen[key] {
			return "", nil, fmt.Errorf("save watermarks: %s v%d twice", st.projection, st.version)
		} else {
			seen[key] = true
		}
		_, args, err := st.SaveWatermarkStatement(w)
		if err != nil {
			return "", nil, err
		}
		projs[i], versions[i] = st.projection, st.version
		slots[i], lsns[i], positions[i] = w.SlotName, w.LSN.String(), w.Position
		commits[i], measured[i] = args[5].(*time.Time), args[9].(*time.Time)
		totals[i], dones[i] = w.BackfillTotal, w.BackfillDone
		lags[i], backlogs[i] = args[10].(*float64), args[11].(*int64)
	}
	return stores[0].saveWatermarksSQL, []any{projs, versions, slots, lsns, positions, commits, totals, dones,
		measured, lags, backlogs}, nil
}

// MoveWatermark records the version's watermark on slot (the stream it
// reads from changed: its group's slot, or one of its own). It is the only
// write that changes a stored slot name: a save names the slot of a row
// that has none, so a save computed before a move and committed after it
// cannot put the watermark back on the slot it left.
func (s *Store) MoveWatermark(ctx context.Context, q event.Querier, slot string) error {
	sql, args := s.MoveWatermarkStatement(slot)
	if _, err := q.Exec(ctx, sql, args...); err != nil {
		return fmt.Errorf("move watermark to slot %s: %w", slot, err)
	}
	return nil
}

// MoveWatermarkStatement is MoveWatermark as a statement and its
// arguments, for a pipeline.
func (s *Store) MoveWatermarkStatement(slot string) (string, []any) {
	return s.moveWatermarkSQL, []any{s.projection, s.version, slot}
}

// SetPhase records the phase and the backfill progress (total events to read
// and events read so far), creating the watermark row if needed.
func (s *Store) SetPhase(ctx context.Context, q event.Querier, phase string, total, done int64) error {
	if err := checkPhase(phase, false); err != nil {
		return fmt.Errorf("set phase: %w", err)
	}
	if _, err := q.Exec(ctx, s.setPhaseSQL, s.projection, s.version, phase, total, done); err != nil {
		return fmt.Errorf("set phase: %w", err)
	}
	return nil
}

// BackfillPoint is where an interrupted backfill of the version resumes:
// on the same slot, which nothing confirmed past its consistent point, the
// events up to the snapshot's highest position, from the first position
// not known to be accounted for. Stored with the backfill's progress.
type BackfillPoint struct {
	LSN   event.LSN // the slot's consistent point the backfill reads up to
	UpTo  int64     // the highest position the backfill's snapshot saw
	After int64     // every event of the snapshot at or below it is accounted for (math.MinInt64: none known)
	Done  int64     // the snapshot's events at or below After
	Total int64     // the snapshot's events (loaded: backfill_total, which SetPhase records)
}

// LoadBackfillPoint returns the version's backfill point; ok is false when
// none is recorded (not backfilling, or not resumable: start again from a
// new snapshot).
func (s *Store) LoadBackfillPoint(ctx context.Context, q event.Querier) (p BackfillPoint, ok bool, err error) {
	var lsn string
	err = q.QueryRow(ctx, s.loadPointSQL, s.projection, s.version).Scan(&lsn, &p.UpTo, &p.After, &p.Done, &p.Total)
	if errors.Is(err, pgx.ErrNoRows) {
		return BackfillPoint{}, false, nil
	}
	if err != nil {
		return BackfillPoint{}, false, fmt.Errorf("load backfill point: %w", err)
	}
	if p.LSN, err = event.ParseLSN(lsn); err != nil {
		return BackfillPoint{}, false, fmt.Errorf("load backfill point: %w", err)
	}
	return p, true, nil
}

// SaveBackfillPoint records p as the version's backfill point (with its
// progress, Done) while its phase is backfilling. SetPhase clears it.
func (s *Store) SaveBackfillPoint(ctx context.Context, q event.Querier, p BackfillPoint) error {
	if _, err := q.Exec(ctx, s.savePointSQL, s.projection, s.version, p.LSN.String(), p.UpTo, p.After, p.Done); err != nil {
		return fmt.Errorf("save backfill point: %w", err)
	}
	return nil
}

func checkPhase(phase string, emptyOK bool) error {
	switch {
	case phase == PhaseBackfilling, phase == PhaseLive, phase == "" && emptyOK:
		return nil
	}
	return fmt.Errorf("unknown phase %q", phase)
}

// Adopt writes the cursors of a version's first start from heads (see
// Head): each stream's events at or below the adopted position count as
// adopted, and the batches that follow skip them like any event at or
// below a cursor. The version must have no cursor for these streams yet
// (a primary-key violation otherwise): adoption happens once, in the same
// transaction for every stream, so that a crash leaves all or none.
func (s *Store) Adopt(ctx context.Context, q event.Querier, heads []Head) error {
	if len(heads) == 0 {
		return nil
	}
	n := len(heads)
	ids := make([]string, n)
	spos, pos, count := make([]int64, n), make([]int64, n), make([]int64, n)
	for i, h := range heads {
		ids[i], spos[i], pos[i], count[i] = h.StreamID, h.StreamPosition, h.Position, h.Events
	}
	if _, err := q.Exec(ctx, s.adoptSQL, s.projection, s.version, ids, spos, pos, count); err != nil {
		return fmt.Errorf("adopt cursors: %w", err)
	}
	return nil
}

// Totals sums the version's cursors: how many streams it has seen and how
// their events were accounted for. Conservation holds when
// Totals.Accounted equals the number of source events.
func (s *Store) Totals(ctx context.Context, q event.Querier) (Totals, error) {
	var t Totals
	if err := q.QueryRow(ctx, s.totalsSQL, s.projection, s.version).Scan(
		&t.Streams, &t.Applied, &t.Skipped, &t.DeadLettered, &t.Adopted, &t.Parked, &t.ParkedStreams); err != nil {
		return Totals{}, fmt.Errorf("cursor totals: %w", err)
	}
	return t, nil
}

// HasCursors reports whether the version has any cursor, that is whether it
// ever committed a batch (a lost slot then means resync, not a fresh start).
func (s *Store) HasCursors(ctx context.Context, q event.Querier) (bool, error) {
	var has bool
	if err := q.QueryRow(ctx, s.hasSQL, s.projection, s.version).Scan(&has); err != nil {
		return false, fmt.Errorf("has cursors: %w", err)
	}
	return has, nil
}

// Reset deletes the version's cursors and watermark, atomically, so that it
// is rebuilt from the start. Dead letters and the lease stay.
func (s *Store) Reset(ctx context.Context, q event.Querier) error {
	if _, err := q.Exec(ctx, s.resetSQL, s.projection, s.version); err != nil {
		return fmt.Errorf("reset cursors: %w", err)
	}
	return nil
}
