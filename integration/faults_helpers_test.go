package integration

// Helpers of the fault tests (faults_test.go): a database with the engine
// schema and a projection's read model, the engine as a child process whose
// JSON log and /metrics the tests read, an event writer, and the checks that
// end every fault test — exact read model, dead letters, conservation.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/engine"
)

// faultProjection is a projection of the shape most fault tests use. For
// every event of its types it appends stream_position to the stream's trail
// (an order-sensitive record: a lost, doubled or reordered event shows) and
// inserts one row keyed by event id into <name>_rows (a double apply would be
// a unique violation). Extra rules (TOML) come after those two.
type faultProjection struct {
	name    string
	onError string   // "" = dead_letter
	types   []string // event types its rules match
	extra   []rule   // more rules
}

// ddl creates the projection's read model.
func (p faultProjection) ddl() string {
	return fmt.Sprintf(`CREATE TABLE %[1]s_rows (
    event_id        uuid   PRIMARY KEY,
    stream_id       text   NOT NULL,
    stream_position bigint NOT NULL,
    v               bigint
);
CREATE TABLE %[1]s_trail (
    stream_id text     PRIMARY KEY,
    positions bigint[] NOT NULL
);`, p.name)
}

func (p faultProjection) toml() string {
	onError := p.onError
	if onError == "" {
		onError = "dead_letter"
	}
	on := strings.Join(p.types, ",")
	return projectionTOML(p.name, 1, onError, append([]rule{
		{name: "trail", on: on, op: "sql", args: `["stream_id", "stream_position"]`,
			sql: "INSERT INTO " + p.name + "_trail AS t (stream_id, positions) VALUES ($1, ARRAY[$2::bigint]) ON CONFLICT (stream_id) DO UPDATE SET positions = t.positions || EXCLUDED.positions"},
		{name: "row", on: on, op: "insert", table: p.name + "_rows",
			set: `event_id = "id", stream_id = "stream_id", stream_position = "stream_position", v = "data.v"`},
	}, p.extra...)...)
}

// check compares the projection's read model with what the events table
// says it must be: every event of its types except those that must be
// dead-lettered (metadata.expect set), each exactly once, trails in stream
// order.
func (p faultProjection) check(t *testing.T, e *faultEnv) {
	t.Helper()
	keep := `type = ANY($1) AND metadata->>'expect' IS NULL`
	if e.scalar(t, `SELECT count(*) FROM events WHERE `+keep, p.types) == 0 {
		t.Fatalf("%s: no event must reach the read model; the check would prove nothing", p.name)
	}
	sameRows(t, e.pool, p.name+"_rows",
		`SELECT event_id::text, stream_id, stream_position, v FROM `+p.name+`_rows`,
		`SELECT id::text, stream_id, stream_position, (data->>'v')::bigint FROM events WHERE `+keep, p.types)
	sameRows(t, e.pool, p.name+"_trail",
		`SELECT stream_id, positions FROM `+p.name+`_trail`,
		`SELECT stream_id, array_agg(stream_position ORDER BY stream_position) FROM events WHERE `+keep+` GROUP BY stream_id`,
		p.types)
}

// feedMode is how a projection version reads its source. Every guarantee
// of the source and of a version's lifecycle holds in each mode, so the
// tests of those guarantees run in each (inEveryFeed): a regression that
// only one mode has (a group's stream once failed silently, because every
// source-fault test ran a projection alone) fails a test.
type feedMode string

const (
	// feedAlone: the only projection of its group, on a slot of its own.
	feedAlone feedMode = engine.FeedAlone
	// feedMember: a member of a group of two (a peer projection with the
	// same rules beside it), on the group's slot, its stream fanned out
	// by the group's hub.
	feedMember feedMode = engine.FeedMember
)

// feedModes lists every mode the matrix runs; TestFeedModesCovered checks
// it against the engine's own list of feed states.
var feedModes = []feedMode{feedAlone, feedMember}

// inEveryFeed runs body once per feed mode, as subtests named after the
// mode; newFaultEnv reads the mode from the subtest's name. Parallel
// subtests unless the test changes the shared server (restarts, settings).
func inEveryFeed(t *testing.T, parallel bool, body func(t *testing.T)) {
	t.Helper()
	for _, m := range feedModes {
		t.Run(string(m), func(t *testing.T) {
			if parallel {
				t.Parallel()
			}
			body(t)
		})
	}
}

// tickFaultTest is the start of most fault tests: body runs in parallel,
// in every feed mode, with one projection of Tick events named name.
func tickFaultTest(t *testing.T, name string, body func(t *testing.T, proj faultProjection)) {
	t.Helper()
	t.Parallel()
	inEveryFeed(t, true, func(t *testing.T) {
		body(t, faultProjection{name: name, types: []string{"Tick"}})
	})
}

// feedOf is the mode of a test that inEveryFeed runs, "" for the others
// (which set up their projections' groups themselves).
func feedOf(t *testing.T) feedMode {
	for _, m := range feedModes {
		if strings.HasSuffix(t.Name(), "/"+string(m)) {
			return m
		}
	}
	return ""
}

// faultEnv is one fault test's world: its own database (events table,
// engine schema, publication, read models), a unique slot prefix and the
// configuration file the engine runs with.
type faultEnv struct {
	dsn        string
	dir        string
	config     string // path of the configuration file
	slotPrefix string
	pool       *pgxpool.Pool
	mode       feedMode // feedMember: each projection has a peer in its group

	mu   sync.Mutex
	next map[string]int64 // stream id → next stream_position
}

// newFaultEnv creates the database, writes the configuration (header plus
// projections), runs `pgscribe migrate -events-table` and creates the read
// models of projs.
func newFaultEnv(t *testing.T, retryAttempts int, projs ...faultProjection) *faultEnv {
	t.Helper()
	return faultEnvOn(t, newDatabase(t), retryAttempts, projs...)
}

// faultEnvOn is newFaultEnv on the database dsn (of the shared server, or
// of one a test started for itself).
func faultEnvOn(t *testing.T, dsn string, retryAttempts int, projs ...faultProjection) *faultEnv {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	e := &faultEnv{dsn: dsn, dir: t.TempDir(), slotPrefix: uniqueID("flt_"), pool: pool, mode: feedOf(t), next: map[string]int64{}}
	e.config = filepath.Join(e.dir, "pgscribe.toml")
	e.writeConfig(t, retryAttempts, projs...)

	migrate(t, e.config)
	for _, p := range e.withPeers(projs) {
		e.exec(t, p.ddl())
	}
	return e
}

// withPeers is projs with, in mode feedMember, each projection's peer: the
// same rules under the name <name>_peer, in the same (default) group.
func (e *faultEnv) withPeers(projs []faultProjection) []faultProjection {
	if e.mode != feedMember {
		return projs
	}
	all := make([]faultProjection, 0, 2*len(projs))
	for _, p := range projs {
		peer := p
		peer.name += "_peer"
		all = append(all, p, peer)
	}
	return all
}

// startFault is the start of most fault tests: a fresh environment for
// projs with the extra read-model ddl (if any), the backlog appended, the
// engine started and every projection caught up (by its backfill).
func startFault(t *testing.T, retryAttempts int, ddl string, backlog []faultEvent, projs ...faultProjection) (*faultEnv, *node) {
	t.Helper()
	e := newFaultEnv(t, retryAttempts, projs...)
	if ddl != "" {
		e.exec(t, ddl)
	}
	e.appendEvents(t, backlog...)
	p := e.start(t)
	for _, pr := range e.withPeers(projs) {
		waitAccounted(t, e.pool, waitLong, pr.name, 1, p.broken)
		// The cursors account for the backlog just before the backfill
		// records phase live: a test that stops the engine next must not
		// leave an interrupted backfill behind.
		waitFor(t, waitLong, pr.name+" live", func() bool {
			return e.scalar(t, `SELECT count(*) FROM pgscribe.watermarks WHERE projection = $1 AND version = 1 AND phase = 'live'`, pr.name) == 1
		})
	}
	e.joined(t, p, 0, projs...)
	return e, p
}

// joined waits, in mode feedMember, until every projection of projs and
// its peer joined the group's stream after the log mark and dropped its
// own slot: a member streams its own slot after a backfill (or a resync)
// until it joins, and the tests go on from the steady state.
func (e *faultEnv) joined(t *testing.T, p *node, mark int, projs ...faultProjection) {
	t.Helper()
	if e.mode != feedMember {
		return
	}
	for _, pr := range e.withPeers(projs) {
		waitUntil(t, waitLong, pr.name+" to join the group's stream", func(context.Context) (bool, error) {
			return p.countLogAfter(mark, logMsg("joined the group's stream", pr.name)) > 0, nil
		}, p.broken)
		own := slotName(e.slotPrefix, pr.name, 1)
		waitFor(t, waitLong, pr.name+" to drop its own slot after joining", func() bool {
			return e.scalar(t, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, own) == 0
		})
	}
}

// writeConfig (re)writes the configuration file: small batches and
// intervals so that faults show quickly, metrics on a free port, JSON logs.
func (e *faultEnv) writeConfig(t *testing.T, retryAttempts int, projs ...faultProjection) {
	t.Helper()
	c := faultConfig(e.dsn, e.slotPrefix, retryAttempts)
	for _, p := range e.withPeers(projs) {
		c.add(p.toml())
	}
	c.write(t, e.config)
}

// faultConfig is the header of a fault test's configuration, without
// projections: small batches and short intervals, so that faults show
// quickly; retryAttempts attempts per batch.
func faultConfig(dsn, slotPrefix string, retryAttempts int) *config {
	return newConfig(dsn, slotPrefix).with("engine", map[string]string{
		"parallelism": "2", "batch_size": "100", "backfill_batch_size": "400", "lag_interval": `"200ms"`,
		"status_interval": `"1s"`, "standby_poll": `"200ms"`, "lease_timeout": `"10s"`, "shutdown_timeout": `"20s"`,
	}).with("retry", map[string]string{
		"max_attempts": fmt.Sprint(retryAttempts), "backoff": `"20ms"`, "max_backoff": `"200ms"`,
	}).set("log", "level", `"info"`)
}

// slot is the replication slot projection version 1 streams from once
// live: its own, or in mode feedMember its group's.
func (e *faultEnv) slot(projection string) string {
	if e.mode == feedMember {
		return e.slotPrefix + "_group_default"
	}
	return slotName(e.slotPrefix, projection, 1)
}

// holdRows locks proj's read model in SHARE mode in a transaction of its
// own, rolled back at the end of the test if not before: the engine's
// batches then wait inside their transactions. SHARE blocks their writes
// and, unlike ACCESS EXCLUSIVE, takes no transaction id, which a slot's
// creation would wait for.
func (e *faultEnv) holdRows(t *testing.T, proj faultProjection) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	hold, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hold.Rollback(ctx) })
	if _, err := hold.Exec(ctx, "LOCK TABLE "+proj.name+"_rows IN SHARE MODE"); err != nil {
		t.Fatal(err)
	}
	return hold
}

func (e *faultEnv) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scalar runs a one-value query.
func (e *faultEnv) scalar(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	return scalar[int64](t, e.pool, sql, args...)
}

// faultEvent is an event to append. expect, when set, is the error_kind it
// must be dead-lettered with; it travels in the event's metadata, so that
// the expected read model is computed from the events table alone.
type faultEvent struct {
	stream string
	typ    string
	data   map[string]any
	expect string
}

// ev is a plain event of type typ carrying v.
func ev(stream, typ string, v int64) faultEvent {
	return faultEvent{stream: stream, typ: typ, data: map[string]any{"v": v}}
}

// appendEvents appends evs in one transaction, in order, numbering each
// stream's events 1, 2, 3 … across calls. It returns the positions given.
func (e *faultEnv) appendEvents(t *testing.T, evs ...faultEvent) []int64 {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	n := len(evs)
	streams, types, datas, metas := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	positions := make([]int64, n)
	next := make(map[string]int64, len(e.next))
	for k, v := range e.next {
		next[k] = v
	}
	for i, x := range evs {
		if next[x.stream] == 0 {
			next[x.stream] = 1
		}
		positions[i] = next[x.stream]
		next[x.stream]++
		meta := map[string]any{"source": "faults", "seq": i}
		if x.expect != "" {
			meta["expect"] = x.expect
		}
		d, _ := json.Marshal(x.data)
		m, _ := json.Marshal(meta)
		streams[i], types[i], datas[i], metas[i] = x.stream, x.typ, string(d), string(m)
	}
	_, err := e.pool.Exec(context.Background(), `INSERT INTO events (stream_id, stream_position, type, data, metadata)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::jsonb[], $5::jsonb[])`,
		streams, positions, types, datas, metas)
	if err != nil {
		t.Fatalf("append %d events: %v", n, err)
	}
	e.next = next
	return positions
}

// accounted is how many events the projection's cursors account for.
func (e *faultEnv) accounted(t *testing.T, projection string) int64 {
	t.Helper()
	return e.scalar(t, accountedSQL, projection, 1)
}

func (e *faultEnv) events(t *testing.T) int64 {
	t.Helper()
	return e.scalar(t, `SELECT count(*) FROM events`)
}

// checkAccounting ends every fault test: conservation (events == applied +
// skipped + dead_lettered for the projection version), one dead-letter row
// per dead-lettered event, each row a faithful copy of its event, and the
// dead letters exactly the events whose metadata expects one, with that
// error_kind.
func (e *faultEnv) checkAccounting(t *testing.T, projection string) {
	t.Helper()
	events, accounted := e.events(t), e.accounted(t, projection)
	if events != accounted {
		t.Errorf("conservation: %d events, %s accounts for %d", events, projection, accounted)
	}
	counted := e.scalar(t, `SELECT coalesce(sum(dead_lettered), 0)::bigint FROM pgscribe.cursors WHERE projection = $1 AND version = 1`, projection)
	rows := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1 AND version = 1`, projection)
	if counted != rows {
		t.Errorf("cursors count %d dead letters for %s, pgscribe.dead_letters holds %d", counted, projection, rows)
	}
	unfaithful := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters d
LEFT JOIN events e ON e.id::text = d.event_id
WHERE d.projection = $1 AND d.version = 1 AND (e.id IS NULL OR d.position <> e.position
   OR d.stream_id <> e.stream_id OR d.stream_position <> e.stream_position OR d.event_type <> e.type
   OR d.event_data IS DISTINCT FROM e.data OR d.event_metadata IS DISTINCT FROM e.metadata
   OR d.occurred_at IS DISTINCT FROM e.occurred_at OR d.error_message = '')`, projection)
	if unfaithful > 0 {
		t.Errorf("%d dead-letter rows of %s do not match their event (or have no message)", unfaithful, projection)
	}
	sameRows(t, e.pool, projection+" dead letters",
		`SELECT event_id, error_kind FROM pgscribe.dead_letters WHERE projection = $1 AND version = 1`,
		`SELECT id::text, metadata->>'expect' FROM events WHERE metadata->>'expect' IS NOT NULL`, projection)
}

// checkNoDeadLetters: what must hold when no event of the workload is
// poison.
func (e *faultEnv) checkNoDeadLetters(t *testing.T, projection string) {
	t.Helper()
	if n := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1`, projection); n != 0 {
		var kinds string
		_ = e.pool.QueryRow(context.Background(), `SELECT string_agg(DISTINCT error_kind, ', ')
FROM pgscribe.dead_letters WHERE projection = $1`, projection).Scan(&kinds)
		t.Errorf("%s has %d dead letters (%s), want none", projection, n, kinds)
	}
}

// verifyClean ends a test whose workload has no poison: each projection
// accounts for every event and its read model is exact, conservation
// holds, nothing is dead-lettered and nothing is halted.
func (e *faultEnv) verifyClean(t *testing.T, p *node, projs ...faultProjection) {
	t.Helper()
	projs = e.withPeers(projs)
	for _, pr := range projs {
		waitAccounted(t, e.pool, waitLong, pr.name, 1, p.broken)
	}
	for _, pr := range projs {
		pr.check(t, e)
		e.checkAccounting(t, pr.name)
		e.checkNoDeadLetters(t, pr.name)
		if v := p.metric("pgscribe_halted", projLabels(pr.name)); v != 0 {
			t.Errorf("pgscribe_halted{projection=%q} = %v, want 0", pr.name, v)
		}
	}
}

// cursor is the stream's cursor position for the projection, 0 if none.
func (e *faultEnv) cursor(t *testing.T, projection, stream string) int64 {
	t.Helper()
	return e.scalar(t, `SELECT coalesce(max(stream_position), 0)::bigint FROM pgscribe.cursors
WHERE projection = $1 AND version = 1 AND stream_id = $2`, projection, stream)
}

// start runs `pgscribe run` on the environment's configuration as e.dsn
// and waits for its metrics listener. The file names the superuser it was
// written with; e.dsn is another role once engineRole ran, and the tests
// that take a privilege away from that role need the engine to run as it.
func (e *faultEnv) start(t *testing.T) *node {
	t.Helper()
	n := newNode(t, "pgscribe", e.config, "PGSCRIBE_DATABASE_URL="+e.dsn)
	n.stopTimeout = 40 * time.Second // shutdown_timeout is 20s
	n.start()
	return n
}

// waitHalted waits for the projection's halt log record, which must name
// sqlstate ("" for a halt without one), and checks that the halt is
// visible: pgscribe_halted 1 and /healthz 503 naming it.
func (p *node) waitHalted(projection, sqlstate string) map[string]any {
	t := p.t
	t.Helper()
	rec := p.waitLog(waitLong, "the halt of "+projection, logMsg("projection halted", projection))
	if got := logString(rec, "sqlstate"); got != sqlstate {
		t.Errorf("halt log sqlstate = %q, want %q: %v", got, sqlstate, rec)
	}
	if v := p.metric("pgscribe_halted", projLabels(projection)); v != 1 {
		t.Errorf("pgscribe_halted{projection=%q} = %v, want 1", projection, v)
	}
	code, body := p.get("/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"halted"`) {
		t.Errorf("/healthz = %d %s, want 503 with the halted projection", code, body)
	}
	return rec
}

// terminateBackends ends the backends of the database that match the
// condition on pg_stat_activity; it returns how many it ended.
func (e *faultEnv) terminateBackends(ctx context.Context, where string) (int, error) {
	var n int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))::int
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND `+where).Scan(&n)
	return n, err
}

// dropSlot terminates the slot's walsender and drops the slot, retrying
// while a walsender still holds it.
func (e *faultEnv) dropSlot(t *testing.T, slot string) {
	t.Helper()
	tried := false // a drop statement failed: the slot may be gone all the same
	waitUntil(t, 30*time.Second, "slot "+slot+" to be dropped", func(ctx context.Context) (bool, error) {
		if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot); err != nil {
			return false, nil // retried until the deadline
		}
		var dropped, exists bool
		err := e.pool.QueryRow(ctx, `SELECT count(pg_drop_replication_slot(slot_name)) = 1, count(*) > 0
FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&dropped, &exists)
		if err == nil && !exists {
			if tried {
				return true, nil
			}
			t.Fatalf("slot %s does not exist", slot)
		}
		// A drop can succeed and still fail the statement: while it holds
		// the slot, its backend is the slot's active_pid, and an engine
		// starting its stream terminates the slot's holder (57P01).
		tried = tried || err != nil
		return err == nil && dropped, nil
	})
}

// writer appends events in small transactions from a goroutine until
// stopped, retrying through connection failures. Appends are idempotent
// (ON CONFLICT DO NOTHING on the stream position), so a commit whose
// outcome was lost can be retried.
type faultWriter struct {
	dsn     string
	streams int
	perTx   int
	pause   time.Duration // between transactions

	stopc chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	txs   int
	err   error // the writer gave up
}

func startWriter(dsn string, streams, perTx int, pause time.Duration) *faultWriter {
	w := &faultWriter{dsn: dsn, streams: streams, perTx: perTx, pause: pause,
		stopc: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w
}

func (w *faultWriter) run() {
	defer close(w.done)
	next := make([]int64, w.streams)
	for i := range next {
		next[i] = 1
	}
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for seq := 0; ; seq++ {
		select {
		case <-w.stopc:
			return
		default:
		}
		// Positions are taken from a copy and kept only once committed.
		after := append([]int64(nil), next...)
		streams, positions, datas := make([]string, w.perTx), make([]int64, w.perTx), make([]string, w.perTx)
		for i := range streams {
			s := (seq*w.perTx + i) % w.streams
			streams[i], positions[i] = fmt.Sprintf("w-%d", s), after[s]
			after[s]++
			datas[i] = fmt.Sprintf(`{"v": %d}`, seq*w.perTx+i)
		}
		for attempt := 0; ; attempt++ {
			err := w.insert(&conn, streams, positions, datas)
			if err == nil {
				break
			}
			if conn != nil {
				conn.Close(context.Background())
				conn = nil
			}
			if attempt >= 300 {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		next = after
		w.mu.Lock()
		w.txs++
		w.mu.Unlock()
		time.Sleep(w.pause)
	}
}

func (w *faultWriter) insert(conn **pgx.Conn, streams []string, positions []int64, datas []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if *conn == nil {
		c, err := pgx.Connect(ctx, w.dsn)
		if err != nil {
			return err
		}
		*conn = c
	}
	_, err := (*conn).Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
SELECT s, p, 'Tick', d FROM unnest($1::text[], $2::bigint[], $3::jsonb[]) AS u(s, p, d)
ON CONFLICT (stream_id, stream_position) DO NOTHING`, streams, positions, datas)
	return err
}

// transactions is how many transactions the writer has committed.
func (w *faultWriter) transactions() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.txs
}

// stop stops the writer and fails t if it gave up.
func (w *faultWriter) stop(t *testing.T) {
	t.Helper()
	close(w.stopc)
	<-w.done
	if w.err != nil {
		t.Fatalf("event writer gave up: %v", w.err)
	}
}

// TestFeedModesCovered: every feed mode of the engine has its row in the
// matrix (feedModes), so a new mode is not done until the source-fault
// and lifecycle tests run in it.
func TestFeedModesCovered(t *testing.T) {
	var have []string
	for _, m := range feedModes {
		have = append(have, string(m))
	}
	for _, m := range engine.FeedModes {
		if !slices.Contains(have, m) {
			t.Errorf("engine feed mode %q has no row in the integration matrix (feedModes, inEveryFeed)", m)
		}
	}
	if len(have) != len(engine.FeedModes) {
		t.Errorf("the matrix runs modes %v, the engine has %v", have, engine.FeedModes)
	}
}
