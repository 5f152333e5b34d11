package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// ErrDrift is returned by Verify when the live read model differs from the
// rebuild (exit 1); the rows were written out.
var ErrDrift = errors.New("read model drift")

// VerifyMemoryLimit is the soft memory limit (a GC target, not a cap)
// main sets for verify when GOMEMLIMIT is not set. Verify's live heap is
// the events in flight (queues and batches, bounded by the engine
// settings) whatever the size of the tables; without a limit GOGC=200
// lets the heap grow to three times that between collections.
const VerifyMemoryLimit = 192 << 20

// ErrVerifyUsage is a verify request that cannot be served: an unknown
// projection version, or rules verify cannot rebuild safely (exit 2).
var ErrVerifyUsage = errors.New("cannot verify")

// VerifyOptions configures Verify.
type VerifyOptions struct {
	Projection string
	Version    int64
	// Streams limits the rebuild to these streams and the comparison to
	// the rows that only they write. Empty: every stream, every row.
	Streams []string
	// Limit bounds the drifted rows printed per table (all are counted).
	Limit int
	// JSON prints the result as one JSON object (VerifyResult) instead of
	// text; the progress lines still go to stderr.
	JSON bool
	// ProgressEvery is how often the rebuild reports its progress
	// (events rebuilt of total, rate, ETA) on stderr; default 5s.
	ProgressEvery time.Duration
}

// Verify rebuilds a projection version in a scratch schema from exactly
// the events its live cursors have accounted for and compares the result
// with the live read model, row by row, in PostgreSQL.
//
// It is exact while the engine keeps running, with no pause: every batch
// commits its read-model writes and its cursor advances in one transaction,
// so one REPEATABLE READ snapshot of the target sees the read model as of
// exactly the events at or below each stream's cursor. Verify copies the
// cursors and the live tables under that snapshot, then builds from those
// events (the events table is append-only, so they can be read later) in
// position order — each stream in order — through apply's Committer. Rows
// that several streams write non-commutatively (set, insert, delete; not
// inc alone) depend on the cross-stream commit order, which a rebuild
// cannot know: such a row is drift only when its presence or a column's
// value is one no writing stream's last write leaves (verifyshared.go);
// the columns that cannot be decided are reported as undecidable.
//
// Progress goes to progress (one line per step and table); the report to
// w. Drift returns ErrDrift.
func Verify(ctx context.Context, cfg *config.Config, o VerifyOptions, w, progress io.Writer) error {
	started := time.Now()
	logf := func(format string, args ...any) {
		fmt.Fprintf(progress, "verify: "+format+" (%s)\n", append(args, time.Since(started).Round(time.Millisecond))...)
	}
	var spec rules.Spec
	found := false
	for _, s := range cfg.Projections {
		if s.Name == o.Projection && s.Version == o.Version {
			spec, found = s, true
		}
	}
	if !found {
		return fmt.Errorf("%w: no projection %q version %d in %s", ErrVerifyUsage, o.Projection, o.Version, cfg.Path)
	}
	if err := checkSQLRules(spec); err != nil {
		return fmt.Errorf("%w: %w", ErrVerifyUsage, err)
	}
	for _, r := range spec.Rules {
		if r.Op == string(event.OpSQL) && len(o.Streams) > 0 {
			return fmt.Errorf("%w: rule %q: the rows an sql rule writes cannot be attributed to streams (-stream)", ErrVerifyUsage, r.Name)
		}
	}
	prog, err := rules.Compile(spec)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrVerifyUsage, err)
	}
	tables := projectionTables(prog)

	tc, err := pgx.ParseConfig(cfg.TargetURL())
	if err != nil {
		return fmt.Errorf("parse target url: %w", err)
	}
	// verify's queries scan whole tables once: compiling them costs more
	// than it saves, and the diff's hash join wants memory rather than
	// batches on disk.
	tc.RuntimeParams["jit"] = "off"
	tc.RuntimeParams["work_mem"] = "128MB"
	conn, err := pgx.ConnectConfig(ctx, tc)
	if err != nil {
		return fmt.Errorf("connect to target: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// A verify killed mid-query leaves a backend running until it next
	// talks to the client; with this it notices within a second and ends,
	// releasing the scratch schema's lock for the next verify to drop it.
	// (PostgreSQL 14 and later; an older server refuses it, harmlessly.)
	_, _ = conn.Exec(ctx, "SET client_connection_check_interval = '1s'")
	return withScratch(ctx, conn, "pgscribe_verify", tables, func(s *scratch) error {
		return verifyIn(ctx, cfg, o, conn, s, spec, prog, tables, w, logf, started)
	})
}

// verifyIn is Verify's work inside its scratch schema.
func verifyIn(ctx context.Context, cfg *config.Config, o VerifyOptions, conn *pgx.Conn, s *scratch, spec rules.Spec, prog *rules.Program,
	tables []string, w io.Writer, logf func(string, ...any), started time.Time) (err error) {
	keys := map[string][]string{}
	compared := map[string][]string{}
	for _, t := range tables {
		compared[t] = writtenColumns(spec, prog, t)
		if keys[t], err = tableKey(ctx, conn, t, prog, compared[t]); err != nil {
			return err
		}
		if keys[t] == nil && len(o.Streams) > 0 {
			return fmt.Errorf("%w: table %s has no primary key and its rules no common key: -stream cannot attribute its rows", ErrVerifyUsage, t)
		}
	}
	cursors, err := snapshotLive(ctx, conn, cfg, s, spec, tables, o.Streams)
	if err != nil {
		return err
	}
	logf("snapshot: %d streams accounted for, %d tables copied", len(cursors), len(tables))
	for _, id := range o.Streams {
		if _, ok := cursors[id]; !ok {
			logf("stream %s: no cursor, none of its events is accounted for yet", id)
		}
	}

	srcCfg, err := pgx.ParseConfig(cfg.Database.URL)
	if err != nil {
		return fmt.Errorf("parse source url: %w", err)
	}
	srcCfg.RuntimeParams["TimeZone"] = "UTC" // as the engine's replication connection
	srcCfg.RuntimeParams["jit"] = "off"
	src, err := pgx.ConnectConfig(ctx, srcCfg)
	if err != nil {
		return fmt.Errorf("connect to source: %w", err)
	}
	defer src.Close(context.WithoutCancel(ctx))

	track := newWriters(keys)
	track.cols = compared
	if track.dead, err = liveDeadLettered(ctx, conn, s); err != nil {
		return err
	}
	var total int64
	if err := conn.QueryRow(ctx, "SELECT coalesce(sum(applied + skipped + dead_lettered), 0)::bigint FROM "+
		pgx.Identifier{s.schema, "pgscribe_live_cursors"}.Sanitize()).Scan(&total); err != nil {
		return fmt.Errorf("count accounted events: %w", err)
	}
	pool, err := buildPool(ctx, cfg.TargetURL(), s.schema, cfg.Engine.Parallelism+1)
	if err != nil {
		return err
	}
	defer pool.Close()
	selected := map[string]bool{}
	for _, id := range o.Streams {
		selected[id] = true
	}
	if len(o.Streams) == 0 {
		// A full verify: rows go to the row log, not to memory.
		track.tables = map[string]int16{}
		for i, t := range tables {
			track.tables[t] = int16(i)
		}
		track.perStream = perStreamTables(spec, keys)
		for _, t := range tables {
			if why, ok := track.perStream[t]; ok {
				logf("table %s: %s: no row of it is written by two streams, its writes are not tracked", t, why)
			}
		}
		if track.log, err = startRowLog(ctx, conn, s); err != nil {
			return err
		}
	}
	var built int64
	buildStarted := time.Now()
	err = s.build(ctx, pool, spec, &scratchEval{prog: prog, tables: s.tables, seen: track.see}, buildOptions{
		// Queues of two whole batches: the feed stays ahead of the
		// partitions, so batches fill to backfill_batch_size and fold more
		// writes per row than queue_size (half a batch by default) lets a
		// backfill. The events in flight stay bounded; VerifyMemoryLimit
		// keeps the heap's slack from growing with them.
		Parallelism: cfg.Engine.Parallelism, BatchSize: cfg.Engine.BackfillBatchSize,
		QueueSize:     max(cfg.Engine.QueueSize, 2*cfg.Engine.BackfillBatchSize),
		Bytes:         int64(cfg.Engine.BufferMB) << 20,
		Retry:         apply.Options{MaxAttempts: cfg.Retry.MaxAttempts, Backoff: cfg.Retry.Backoff, MaxBackoff: cfg.Retry.MaxBackoff},
		Progress:      func(done int64) { logf("%s", rebuildProgress(done, total, time.Since(buildStarted))) },
		ProgressEvery: o.ProgressEvery,
	}, func(ctx context.Context, dispatch func(*event.Event) error) error {
		return readEvents(ctx, src, cfg.Source, cursors, o.Streams, func(ev *event.Event) error {
			built++
			return dispatch(ev)
		})
	})
	if track.log != nil {
		// Before anything else uses conn (the copy runs on it).
		if cerr := track.log.close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("rebuild: %w", err)
	}
	logf("rebuilt %d events of %d accounted for, %.0f events/s", built, total, float64(built)/max(time.Since(buildStarted).Seconds(), 1e-9))
	for t, rule := range track.untracked {
		if len(o.Streams) > 0 {
			return fmt.Errorf("%w: rule %s writes table %s by other columns than its key %v: -stream cannot attribute its rows",
				ErrVerifyUsage, rule, t, keys[t])
		}
		logf("table %s: rule %s writes rows by other columns than the key %v: which streams write a row is not tracked, so no row of it is reported as order-dependent", t, rule, keys[t])
	}
	if err := analyze(ctx, conn, s, tables); err != nil {
		return err
	}

	if track.log != nil {
		if track, err = sharedPass(ctx, conn, src, cfg, s, prog, tables, track, cursors, logf); err != nil {
			return err
		}
	}

	if len(o.Streams) > 0 {
		// Rows the selected streams write that other streams write too are
		// not theirs alone: evaluate the other streams' events (rules only,
		// no writes) and drop the keys they touch.
		others := newWriters(keys)
		others.only = track.touched()
		n := 0
		err := readEvents(ctx, src, cfg.Source, nil, nil, func(ev *event.Event) error {
			if selected[ev.StreamID] {
				return nil
			}
			intents, err := prog.Eval(ev)
			if err == nil && len(intents) > 0 {
				others.see(ev, intents)
			}
			n++
			return nil
		})
		if err != nil {
			return err
		}
		for t, rule := range others.untracked {
			return fmt.Errorf("%w: rule %s writes table %s by other columns than its key %v: -stream cannot attribute its rows",
				ErrVerifyUsage, rule, t, keys[t])
		}
		track.exclude(others)
		logf("evaluated %d events of other streams for shared rows", n)
	}

	rep := &driftReport{limit: o.Limit}
	if rep.deadDiffer, err = commitDeadLettersDiffer(ctx, conn, s); err != nil {
		return err
	}
	for _, t := range tables {
		shared, err := track.store(ctx, conn, s, t, compared[t], len(o.Streams) > 0, rep)
		if err != nil {
			return err
		}
		tstart := time.Now()
		if err := diffTable(ctx, conn, s, t, keys[t], compared[t], len(o.Streams) > 0, shared, rep); err != nil {
			return err
		}
		logf("table %s: %d rows drift, %d shared rows differ legitimately, %d undecidable, compared in %s",
			t, rep.drift[t], rep.orderDep[t], rep.undecidable[t], time.Since(tstart).Round(time.Millisecond))
	}
	if err := rep.account(ctx, conn, s); err != nil {
		return err
	}
	logf("accounting: %d streams and their dead letters compared", len(cursors))
	if o.JSON {
		return rep.writeJSON(w, spec, built, len(cursors), tables, time.Since(started))
	}
	return rep.write(w, spec, built, len(cursors), tables)
}

// snapshotLive copies, under one REPEATABLE READ snapshot of the target,
// the version's cursors and the live read-model tables into the scratch
// schema, and returns the cursors (stream → stream_position).
func snapshotLive(ctx context.Context, conn *pgx.Conn, cfg *config.Config, s *scratch, spec rules.Spec, tables, streams []string) (map[string]int64, error) {
	curTable := pgx.Identifier{s.schema, "pgscribe_live_cursors"}.Sanitize()
	if _, err := conn.Exec(ctx, "CREATE TABLE "+curTable+" (stream_id text PRIMARY KEY, stream_position bigint NOT NULL, "+
		"applied bigint NOT NULL, skipped bigint NOT NULL, dead_lettered bigint NOT NULL)"); err != nil {
		return nil, fmt.Errorf("create cursor snapshot: %w", err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE "+s.liveDeadLetters()+" (stream_id text NOT NULL, stream_position bigint NOT NULL, error_kind text NOT NULL)"); err != nil {
		return nil, fmt.Errorf("create dead-letter snapshot: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, fmt.Errorf("begin snapshot: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	// The first statement fixes the snapshot; everything below reads it.
	where := " WHERE projection = $1 AND version = $2"
	args := []any{spec.Name, spec.Version}
	if len(streams) > 0 {
		where += " AND stream_id = ANY($3)"
		args = append(args, streams)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+curTable+" SELECT stream_id, stream_position, applied, skipped, dead_lettered FROM "+
		pgx.Identifier{cfg.Engine.Schema, "cursors"}.Sanitize()+where, args...); err != nil {
		return nil, fmt.Errorf("snapshot cursors: %w", err)
	}
	// Dead letters commit in the batch transaction too.
	if _, err := tx.Exec(ctx, "INSERT INTO "+s.liveDeadLetters()+" SELECT stream_id, stream_position, error_kind FROM "+
		pgx.Identifier{cfg.Engine.Schema, "dead_letters"}.Sanitize()+where, args...); err != nil {
		return nil, fmt.Errorf("snapshot dead letters: %w", err)
	}
	for _, t := range tables {
		if _, err := tx.Exec(ctx, fmt.Sprintf("CREATE UNLOGGED TABLE %s AS SELECT * FROM %s", s.liveIdent(t), event.Table(t).Quoted())); err != nil {
			return nil, fmt.Errorf("snapshot table %s: %w", t, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit snapshot: %w", err)
	}
	rows, err := conn.Query(ctx, "SELECT stream_id, stream_position FROM "+curTable)
	if err != nil {
		return nil, fmt.Errorf("read cursor snapshot: %w", err)
	}
	defer rows.Close()
	cursors := map[string]int64{}
	for rows.Next() {
		var id string
		var pos int64
		if err := rows.Scan(&id, &pos); err != nil {
			return nil, fmt.Errorf("read cursor snapshot: %w", err)
		}
		cursors[id] = pos
	}
	return cursors, rows.Err()
}

// liveIdent is the snapshot copy of live table t.
func (s *scratch) liveIdent(t string) string {
	return pgx.Identifier{s.schema, "pgscribe_live__" + scratchTableName(t)}.Sanitize()
}

// readEvents calls fn for the events of the source table in position
// order (which is each stream's order: an append takes its position after
// the previous event of its stream committed). With cursors, only events
// at or below their stream's cursor; with streams, only those streams.
func readEvents(ctx context.Context, conn *pgx.Conn, src config.Source, cursors map[string]int64, streams []string, fn func(*event.Event) error) error {
	c := src.Columns
	id := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	// occurred_at is read as the backfill reads it (no cast: a timestamp
	// without time zone is taken as UTC, whatever the session's TimeZone).
	q := fmt.Sprintf(`SELECT %s::bigint, %s::text, %s::text, %s::bigint, %s, %s::text, %s::text, %s FROM %s`,
		id(c.Position), id(c.ID), id(c.StreamID), id(c.StreamPosition), id(c.Type), id(c.Data), id(c.Metadata), id(c.OccurredAt),
		event.Table(src.Table).Quoted())
	var args []any
	if len(streams) > 0 {
		q += fmt.Sprintf(" WHERE %s::text = ANY($1)", id(c.StreamID))
		args = append(args, streams)
	}
	q += " ORDER BY " + id(c.Position)
	rows, err := conn.Query(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	defer rows.Close()
	// data and metadata are copied once from the row's buffer (a scan into
	// a string and a conversion to bytes would copy them twice).
	var data, meta pgtype.DriverBytes
	for rows.Next() {
		ev := &event.Event{}
		if err := rows.Scan(&ev.Position, &ev.ID, &ev.StreamID, &ev.StreamPosition, &ev.Type, &data, &meta, &ev.OccurredAt); err != nil {
			return fmt.Errorf("read events: %w", err)
		}
		if cursors != nil {
			cur, ok := cursors[ev.StreamID]
			if !ok || ev.StreamPosition > cur {
				continue // not yet accounted for by the live version
			}
		}
		if data != nil {
			ev.RawData = slices.Clone([]byte(data))
		}
		if meta != nil {
			ev.RawMetadata = slices.Clone([]byte(meta))
		}
		if err := fn(ev); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	return nil
}

// writtenColumns is the columns of t that the projection's rules write,
// sorted: the columns verify compares. Others take their defaults (a
// serial id, an inserted_at DEFAULT now()), which a rebuild cannot
// reproduce. nil (every column) when the projection has sql rules, whose
// columns are not known.
func writtenColumns(spec rules.Spec, prog *rules.Program, t string) []string {
	for _, r := range spec.Rules {
		if r.Op == string(event.OpSQL) {
			return nil
		}
	}
	var cols []string
	for _, tg := range prog.Targets() {
		if tg.Table != t {
			continue
		}
		for _, group := range [][]string{tg.KeyColumns, tg.SetColumns, tg.IncColumns} {
			for _, c := range group {
				if !slices.Contains(cols, c) {
					cols = append(cols, c)
				}
			}
		}
	}
	sort.Strings(cols)
	return cols
}

// tableKey is the columns that identify a row of t: its primary key when
// the rules write all of it (compared; nil: any), else the key every rule
// writing t uses; nil when neither exists.
func tableKey(ctx context.Context, conn *pgx.Conn, t string, prog *rules.Program, compared []string) ([]string, error) {
	pk, err := queryStrings(ctx, conn, `SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY a.attname`, event.Table(t).Quoted())
	if err != nil {
		return nil, fmt.Errorf("read primary key of %s: %w", t, err)
	}
	written := len(pk) > 0
	for _, c := range pk {
		written = written && (compared == nil || slices.Contains(compared, c))
	}
	if written {
		return pk, nil
	}
	var common []string
	for _, tg := range prog.Targets() {
		if tg.Table != t {
			continue
		}
		if len(tg.KeyColumns) == 0 || (common != nil && !reflect.DeepEqual(common, tg.KeyColumns)) {
			return nil, nil
		}
		common = tg.KeyColumns
	}
	return common, nil
}

// writer is what verify knows of the writes to one row: the first stream
// that wrote it, whether another did too, and whether any of the writes
// does not commute (anything but inc).
type writer struct {
	stream   string
	multi    bool
	nonComm  bool
	keyValue []any
	writes   rowWrites // each stream's last write, for shared rows
}

// writers records, per table and row key, which streams write a row (from
// the intents the rules produce). Safe for concurrent use.
//
// It works in one of two ways. With log set (the rebuild of a full
// verify), it holds nothing per row: each write goes to the row log
// (verifyrows.go). Otherwise (a second pass over the streams that share
// rows, or -stream) it records every row it sees in memory, or with
// onlyHash set only the rows of those key hashes.
type writers struct {
	mu   sync.Mutex
	keys map[string][]string // table → key columns
	cols map[string][]string // table → compared columns
	// dead holds the events the live version dead-lettered (stream
	// id, NUL, stream position): their writes never applied live.
	dead map[string]bool
	rows map[string]map[string]*writer // table → key text → writer
	only map[string]map[string]*writer // if set, record only these rows
	// onlyHash, if set, records only the rows whose key hashes it holds
	// (table → hashes).
	onlyHash map[string]map[uint64]bool
	// log, if set, receives every write instead (tables: name → index),
	// except to the tables in perStream, whose rows no two streams write.
	log       *rowLog
	tables    map[string]int16
	perStream map[string]string
	// untracked names, per table, a rule that writes it by other columns
	// than its key: which rows it writes is not known.
	untracked map[string]string
}

func newWriters(keys map[string][]string) *writers {
	return &writers{keys: keys, rows: map[string]map[string]*writer{}, untracked: map[string]string{}}
}

// commutes reports whether an intent's effect on its row is independent of
// the order of other streams' writes: one that only adds (an update or
// upsert with inc and no set; the op table's IncAdds).
func commutes(in event.Intent) bool {
	spec, _ := in.Op.Spec()
	return spec.IncAdds && len(in.Set) == 0 && len(in.Inc) > 0
}

// keyValues is the values of an intent's key columns cols; nil when the
// intent does not name all of them.
func keyValues(in event.Intent, cols []string) []any {
	vals := make([]any, len(cols))
	for i, c := range cols {
		v, ok := columnValue(in, c)
		if !ok {
			return nil
		}
		vals[i] = v
	}
	return vals
}

func (w *writers) see(ev *event.Event, intents []event.Intent) {
	var recs []rowRec
	var sh uint64
	for _, in := range intents {
		if in.Op == event.OpSQL {
			continue
		}
		cols := w.keys[in.Table]
		if cols == nil {
			continue
		}
		if _, skip := w.perStream[in.Table]; skip && w.log != nil {
			continue
		}
		vals := keyValues(in, cols)
		if vals == nil {
			w.mu.Lock()
			if _, done := w.untracked[in.Table]; !done {
				w.untracked[in.Table] = in.Rule
			}
			w.mu.Unlock()
			continue
		}
		if w.log != nil {
			if sh == 0 {
				sh = streamHash(ev.StreamID)
			}
			recs = append(recs, rowRec{table: w.tables[in.Table], key: rowHash(vals), stream: sh, nonComm: !commutes(in)})
			continue
		}
		if w.onlyHash != nil && !w.onlyHash[in.Table][rowHash(vals)] {
			continue
		}
		b, _ := json.Marshal(vals)
		k := string(b)
		w.record(ev, in, k, vals)
	}
	if len(recs) > 0 {
		w.log.add(recs)
	}
}

// record notes intent in of ev on the row with key text k.
func (w *writers) record(ev *event.Event, in event.Intent, k string, vals []any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.only != nil {
		if _, ok := w.only[in.Table][k]; !ok {
			return
		}
	}
	m := w.rows[in.Table]
	if m == nil {
		m = map[string]*writer{}
		w.rows[in.Table] = m
	}
	wr, ok := m[k]
	if !ok {
		wr = &writer{stream: ev.StreamID, keyValue: vals}
		m[k] = wr
	}
	if wr.stream != ev.StreamID {
		wr.multi = true
	}
	if !commutes(in) {
		wr.nonComm = true
	}
	wr.writes.record(ev.StreamID, ev.StreamPosition, in, w.cols[in.Table], !w.dead[deadKey(ev.StreamID, ev.StreamPosition)])
}

func columnValue(in event.Intent, col string) (any, bool) {
	for _, group := range [][]event.Column{in.Key, in.Set} {
		for _, c := range group {
			if c.Name == col {
				return c.Value, true
			}
		}
	}
	return nil, false
}

// touched returns the rows recorded so far (for a second pass that
// records only those).
func (w *writers) touched() map[string]map[string]*writer {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rows
}

// exclude drops the rows that others recorded: written by other streams.
func (w *writers) exclude(others *writers) {
	for t, m := range others.rows {
		for k := range m {
			delete(w.rows[t], k)
		}
	}
}

// store writes table t's order-dependent row keys (and, for -stream, the
// keys of the rows the selected streams alone write) into scratch tables
// the diff joins with, typed as t's own key columns. It reports whether t
// has order-dependent rows: without, it creates nothing and the diff
// joins nothing.
func (w *writers) store(ctx context.Context, conn *pgx.Conn, s *scratch, t string, compared []string, streams bool, rep *driftReport) (bool, error) {
	cols := w.keys[t]
	if cols == nil {
		return false, nil
	}
	var orderDep []*writer
	var own [][]any
	for _, wr := range w.rows[t] {
		if wr.multi && wr.nonComm {
			orderDep = append(orderDep, wr)
		}
		if streams {
			own = append(own, wr.keyValue)
		}
	}
	if len(orderDep) > 0 {
		if compared == nil {
			var err error
			if compared, err = columnNames(ctx, conn, s.ident(t)); err != nil {
				return false, err
			}
		}
		if err := storeShared(ctx, conn, s, t, cols, compared, orderDep, rep.deadDiffer); err != nil {
			return false, err
		}
		rep.shared += len(orderDep)
	}
	if streams {
		if err := storeKeys(ctx, conn, s, t, "pgscribe_own__", cols, own); err != nil {
			return false, err
		}
	}
	return len(orderDep) > 0, nil
}

func keyTable(s *scratch, prefix, t string) string {
	return pgx.Identifier{s.schema, prefix + scratchTableName(t)}.Sanitize()
}

func storeKeys(ctx context.Context, conn *pgx.Conn, s *scratch, t, prefix string, cols []string, vals [][]any) error {
	list := quoteColumns(cols)
	ident := keyTable(s, prefix, t)
	if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE TABLE %s AS SELECT %s FROM %s WITH NO DATA", ident, list, s.ident(t))); err != nil {
		return fmt.Errorf("create key table for %s: %w", t, err)
	}
	objs := make([]map[string]any, len(vals))
	for i, v := range vals {
		o := make(map[string]any, len(cols))
		for j, c := range cols {
			o[c] = v[j]
		}
		objs[i] = o
	}
	return insertJSON(ctx, conn, ident, t, objs)
}

func quoteColumns(cols []string) string {
	q := make([]string, len(cols))
	for i, c := range cols {
		q[i] = pgx.Identifier{c}.Sanitize()
	}
	return strings.Join(q, ", ")
}

// driftRow is one row that differs.
type driftRow struct {
	table, kind    string // missing | extra | different
	key            map[string]any
	live, expected map[string]any
	// orderDependent: several streams write the row (see verifyshared.go);
	// then badPresence and badColumns are what no stream's last write
	// explains (drift), undecided the differing columns verify cannot
	// decide, with reasons per column.
	orderDependent bool
	badPresence    bool
	badColumns     []string
	undecided      []string
	reasons        map[string]string
}

type driftReport struct {
	limit    int
	accounts []accountDiff
	rows     []driftRow // printed, up to limit per table
	drift    map[string]int
	orderDep map[string]int // shared rows that differ legitimately
	// undecidable counts shared rows whose only differences are in
	// columns verify cannot decide.
	undecidable map[string]int
	// shared counts the rows several streams write non-commutatively.
	shared int
	// deadDiffer: the live version and the rebuild dead-lettered
	// different events at commit time.
	deadDiffer bool
	keys       map[string][]string
}

// diffTable joins the live snapshot of t with its rebuild on the key, in
// PostgreSQL, and records the rows that differ (without a key: the rows
// of each side missing from the other, as multisets).
//
// shared says t has rows several streams write non-commutatively, stored
// by store: only then does the diff join them.
func diffTable(ctx context.Context, conn *pgx.Conn, s *scratch, t string, key, cols []string, streams, shared bool, rep *driftReport) error {
	if rep.drift == nil {
		rep.drift, rep.orderDep, rep.undecidable, rep.keys = map[string]int{}, map[string]int{}, map[string]int{}, map[string][]string{}
	}
	rep.keys[t] = key
	if cols == nil {
		var err error
		if cols, err = columnNames(ctx, conn, s.ident(t)); err != nil {
			return err
		}
	}
	// Both sides restricted to the compared columns.
	live := fmt.Sprintf("(SELECT %s FROM %s)", quoteColumns(cols), s.liveIdent(t))
	rebuilt := fmt.Sprintf("(SELECT %s FROM %s)", quoteColumns(cols), s.ident(t))
	var q string
	if key == nil {
		list := quoteColumns(cols)
		q = fmt.Sprintf(`SELECT 'extra', to_jsonb(l), NULL::jsonb, false FROM (SELECT %[1]s FROM %[2]s x EXCEPT ALL SELECT %[1]s FROM %[3]s y) l
UNION ALL SELECT 'missing', NULL::jsonb, to_jsonb(e), false FROM (SELECT %[1]s FROM %[3]s y EXCEPT ALL SELECT %[1]s FROM %[2]s x) e`,
			list, live, rebuilt)
	} else {
		on := make([]string, len(key))
		od := make([]string, len(key))
		for i, k := range key {
			c := pgx.Identifier{k}.Sanitize()
			on[i] = fmt.Sprintf("l.%s = e.%s", c, c)
			od[i] = fmt.Sprintf("o.%s = coalesce(l.%s, e.%s)", c, c, c)
		}
		lc := make([]string, len(cols))
		ec := make([]string, len(cols))
		for i, c := range cols {
			lc[i] = "l." + pgx.Identifier{c}.Sanitize()
			ec[i] = "e." + pgx.Identifier{c}.Sanitize()
		}
		k0 := pgx.Identifier{key[0]}.Sanitize()
		order := make([]string, len(key))
		for i, k := range key {
			c := pgx.Identifier{k}.Sanitize()
			order[i] = fmt.Sprintf("coalesce(l.%s, e.%s)", c, c)
		}
		where := ""
		if streams {
			own := strings.ReplaceAll(strings.Join(od, " AND "), "o.", "w.")
			where = fmt.Sprintf(" AND EXISTS (SELECT 1 FROM %s w WHERE %s)", keyTable(s, "pgscribe_own__", t), own)
		}
		// A shared row (o) differs legitimately unless its presence or a
		// column's value is one no writing stream's last write leaves.
		isShared, presence, bad, undecided, undecidable := "false", "false", "ARRAY[]::text[]", "ARRAY[]::text[]", "NULL::jsonb"
		join := ""
		if shared {
			presence, bad, undecided = sharedChecks(s, t, key, cols)
			isShared, undecidable = fmt.Sprintf("o.%s IS NOT NULL", k0), "o.pgscribe_undecidable"
			join = fmt.Sprintf(" LEFT JOIN %s o ON %s", keyTable(s, "pgscribe_orderdep__", t), strings.Join(od, " AND "))
		}
		q = fmt.Sprintf(`SELECT CASE WHEN l.%[1]s IS NULL THEN 'missing' WHEN e.%[1]s IS NULL THEN 'extra' ELSE 'different' END,
  CASE WHEN l.%[1]s IS NULL THEN NULL ELSE to_jsonb(l) END, CASE WHEN e.%[1]s IS NULL THEN NULL ELSE to_jsonb(e) END,
  %[2]s, coalesce(%[11]s, false), %[12]s, %[13]s, %[3]s
FROM %[4]s l FULL JOIN %[5]s e ON %[6]s%[14]s
WHERE (l.%[1]s IS NULL OR e.%[1]s IS NULL OR (%[7]s) IS DISTINCT FROM (%[8]s))%[9]s
ORDER BY %[10]s`,
			k0, isShared, undecidable, live, rebuilt,
			strings.Join(on, " AND "), strings.Join(lc, ", "), strings.Join(ec, ", "), where, strings.Join(order, ", "),
			presence, bad, undecided, join)
	}
	rows, err := conn.Query(ctx, q)
	if err != nil {
		return fmt.Errorf("diff %s: %w", t, err)
	}
	defer rows.Close()
	printed := 0
	for rows.Next() {
		r := driftRow{table: t}
		if key == nil {
			err = rows.Scan(&r.kind, &r.live, &r.expected, &r.orderDependent)
		} else {
			err = rows.Scan(&r.kind, &r.live, &r.expected, &r.orderDependent, &r.badPresence, &r.badColumns, &r.undecided, &r.reasons)
		}
		if err != nil {
			return fmt.Errorf("diff %s: %w", t, err)
		}
		switch {
		case !r.orderDependent || r.badPresence || len(r.badColumns) > 0:
			rep.drift[t]++
		case len(r.undecided) > 0:
			rep.undecidable[t]++
		default:
			rep.orderDep[t]++
		}
		if printed < rep.limit {
			printed++
			rep.rows = append(rep.rows, r)
		}
	}
	return rows.Err()
}

// write prints the report and returns ErrDrift when a row drifted.
func (rep *driftReport) write(w io.Writer, spec rules.Spec, events int64, streams int, tables []string) error {
	total, orderDep, undecidable := 0, 0, 0
	for _, t := range tables {
		total += rep.drift[t]
		orderDep += rep.orderDep[t]
		undecidable += rep.undecidable[t]
	}
	for _, t := range tables {
		if rep.drift[t]+rep.orderDep[t]+rep.undecidable[t] == 0 {
			fmt.Fprintf(w, "table %s: no drift\n", t)
			continue
		}
		fmt.Fprintf(w, "table %s: %d rows drift", t, rep.drift[t])
		if rep.orderDep[t] > 0 {
			fmt.Fprintf(w, ", %d shared rows differ legitimately", rep.orderDep[t])
		}
		if rep.undecidable[t] > 0 {
			fmt.Fprintf(w, ", %d undecidable", rep.undecidable[t])
		}
		fmt.Fprintln(w)
		for _, r := range rep.rows {
			if r.table == t {
				fmt.Fprintln(w, "  "+r.describe(rep.keys[t]))
			}
		}
	}
	total += rep.writeAccounting(w)
	fmt.Fprintf(w, "%s v%d: %d events of %d streams rebuilt; ", spec.Name, spec.Version, events, streams)
	var notes []string
	if orderDep > 0 {
		notes = append(notes, fmt.Sprintf("%d rows written by several streams hold another stream's last write than the rebuild: a legitimate commit order", orderDep))
	}
	if undecidable > 0 {
		notes = append(notes, fmt.Sprintf("%d rows written by several streams differ in columns verify cannot decide", undecidable))
	}
	note := ""
	if len(notes) > 0 {
		note = " (" + strings.Join(notes, "; ") + ")"
	}
	if total == 0 {
		fmt.Fprintf(w, "no drift%s\n", note)
		return nil
	}
	fmt.Fprintf(w, "%d differences (drift)%s\n", total, note)
	return fmt.Errorf("%s v%d: %d differences from a rebuild: %w", spec.Name, spec.Version, total, ErrDrift)
}

// describe renders one drifted row: its key, then what differs.
func (r driftRow) describe(key []string) string {
	side := r.live
	if side == nil {
		side = r.expected
	}
	var keyText string
	if key != nil {
		keyText = formatRow(key, side)
	} else {
		keyText = formatValue(side)
	}
	prefix := r.kind
	if r.orderDependent {
		switch {
		case r.badPresence || len(r.badColumns) > 0:
			prefix += " (shared)"
		case len(r.undecided) > 0:
			prefix += " (shared, undecidable)"
		default:
			prefix += " (shared, legitimate)"
		}
	}
	switch {
	case r.kind == "missing" && r.orderDependent && r.badPresence:
		return fmt.Sprintf("%-9s %s: not in the live table, though every writing stream's last write leaves it present; rebuilt row %s", prefix, keyText, formatValue(r.expected))
	case r.kind == "missing" && r.orderDependent:
		return fmt.Sprintf("%-9s %s: not in the live table, as a writing stream's last write can leave it; rebuilt row %s", prefix, keyText, formatValue(r.expected))
	case r.kind == "missing":
		return fmt.Sprintf("%-9s %s: not in the live table; rebuilt row %s", prefix, keyText, formatValue(r.expected))
	case r.kind == "extra" && r.orderDependent && r.badPresence:
		return fmt.Sprintf("%-9s %s: not in the rebuild, and no writing stream's last write leaves it present; live row %s", prefix, keyText, formatValue(r.live))
	case r.kind == "extra" && !r.orderDependent:
		return fmt.Sprintf("%-9s %s: not in the rebuild; live row %s", prefix, keyText, formatValue(r.live))
	}
	var cols []string
	for c := range r.live {
		cols = append(cols, c)
	}
	sort.Strings(cols)
	var ds []string
	if r.kind == "extra" {
		ds = append(ds, "not in the rebuild, but a writing stream's last write leaves it present")
	}
	for _, c := range cols {
		if r.expected != nil && reflect.DeepEqual(r.live[c], r.expected[c]) {
			continue
		}
		if !r.orderDependent {
			ds = append(ds, fmt.Sprintf("%s: live %s, expected %s", c, formatValue(r.live[c]), formatValue(r.expected[c])))
			continue
		}
		switch {
		case slices.Contains(r.badColumns, c):
			ds = append(ds, fmt.Sprintf("%s: live %s, which no writing stream's last write gives (rebuild %s)", c, formatValue(r.live[c]), formatValue(r.expected[c])))
		case slices.Contains(r.undecided, c):
			ds = append(ds, fmt.Sprintf("%s: live %s, rebuild %s (undecidable: %s)", c, formatValue(r.live[c]), formatValue(r.expected[c]), r.reasons[c]))
		case r.expected != nil:
			ds = append(ds, fmt.Sprintf("%s: live %s, rebuild %s (another writing stream's last write)", c, formatValue(r.live[c]), formatValue(r.expected[c])))
		}
	}
	if len(ds) == 0 {
		ds = append(ds, fmt.Sprintf("live %s, expected %s", formatValue(r.live), formatValue(r.expected)))
	}
	return fmt.Sprintf("%-9s %s: %s", prefix, keyText, strings.Join(ds, "; "))
}
