package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/migrations"
)

// Reading your own writes (issue 17): the SQL wait functions, the progress
// view and `pgscribe wait`, against real engines. Built on the harness
// (doc.go): newConfig and projectionTOML, node, runCLI, waitFor; what is
// particular to these tests is prefixed wt.

// wtProjection applies NoteAdded events to notes (the row's at is the
// event's stream position, so a stale read shows), dead-letters Bad
// events and skips every other type.
var wtProjection = projectionTOML("notes", 1, "",
	rule{name: "note", on: "NoteAdded", op: "upsert", table: "notes", key: `stream = "stream_id"`,
		set: `body = "data.body", at = "stream_position"`},
	rule{name: "bad", on: "Bad", op: "fail", message: "'bad event'"})

type wtEnv struct {
	testDB // on pool
	dsn    string
	bin    string
	dir    string
	prefix string
	pool   *pgxpool.Pool
}

func newWtEnv(t *testing.T) *wtEnv {
	t.Helper()
	dsn := newDatabase(t)
	e := &wtEnv{testDB: testDB{t: t}, dsn: dsn, bin: pgscribeBinary(t), dir: t.TempDir(), prefix: uniqueID("wt")}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.pool, e.q = pool, pool
	migrate(t, e.config("node-a"))
	e.exec("CREATE TABLE notes (stream text PRIMARY KEY, body text NOT NULL, at bigint NOT NULL)")
	return e
}

// config writes the configuration of one node and returns its path. The
// status and lag intervals are the defaults on purpose: a wait must not
// depend on them.
func (e *wtEnv) config(node string) string {
	e.t.Helper()
	return newConfig(e.dsn, e.prefix).with("engine", map[string]string{
		"node": fmt.Sprintf("%q", node), "parallelism": "2", "standby_poll": `"200ms"`, "lease_timeout": `"5s"`,
	}).with("retry", map[string]string{"backoff": `"50ms"`, "max_backoff": `"500ms"`}).
		add(wtProjection).write(e.t, filepath.Join(e.dir, node+".toml"))
}

// scan runs a one-row query.
func (e *wtEnv) scan(sql string, args []any, dest ...any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.pool.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// cli runs a pgscribe command to completion.
func (e *wtEnv) cli(args ...string) cliResult {
	e.t.Helper()
	return runCLI(e.t, e.bin, args...)
}

// start starts `pgscribe run` as node name, a harness node (killed at
// the end, output checked for races and panics, shown on failure).
func (e *wtEnv) start(name string) *node {
	e.t.Helper()
	return startNode(e.t, name, e.config(name))
}

// waitLive waits until the progress view shows the version live and
// returns its active node.
func (e *wtEnv) waitLive() string {
	e.t.Helper()
	var node string
	waitFor(e.t, 2*time.Minute, "notes v1 live in pgscribe.progress", func() bool {
		var state string
		var active *string
		e.scan(`SELECT coalesce((SELECT state FROM pgscribe.progress WHERE projection = 'notes' AND version = 1), ''),
  (SELECT active_node FROM pgscribe.progress WHERE projection = 'notes' AND version = 1)`, nil, &state, &active)
		if state == "live" && active != nil {
			node = *active
			return true
		}
		return false
	})
	return node
}

const wtAppend = "INSERT INTO events (stream_id, stream_position, type, data) VALUES ($1, $2, $3, $4)"

// appendEvent appends one event in its own transaction and returns the
// source WAL position right after its commit.
func wtAppendEvent(ctx context.Context, q interface {
	Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	QueryRow(context.Context, string, ...any) pgx.Row
}, stream string, pos int64, typ, body string) (string, error) {
	if _, err := q.Exec(ctx, wtAppend, stream, pos, typ, fmt.Sprintf(`{"body": %q}`, body)); err != nil {
		return "", fmt.Errorf("append %s/%d: %w", stream, pos, err)
	}
	var lsn string
	if err := q.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return "", err
	}
	return lsn, nil
}

// Concurrent appenders each wait for their own event, by stream position
// or by LSN, then read their row in the next statement: never stale.
func TestWaitReadYourWrites(t *testing.T) {
	e := newWtEnv(t)
	e.start("node-a")
	e.waitLive()

	const writers, perWriter = 8, 25
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			errs <- func() error {
				conn, err := e.pool.Acquire(ctx)
				if err != nil {
					return err
				}
				defer conn.Release()
				stream := fmt.Sprintf("writer-%d", w)
				for pos := int64(1); pos <= perWriter; pos++ {
					lsn, err := wtAppendEvent(ctx, conn, stream, pos, "NoteAdded", fmt.Sprintf("note %d", pos))
					if err != nil {
						return err
					}
					var ok bool
					byLSN := pos%2 == 0
					if byLSN {
						err = conn.QueryRow(ctx, "SELECT pgscribe.wait_for_lsn('notes', 1, $1::pg_lsn, '30s')", lsn).Scan(&ok)
					} else {
						err = conn.QueryRow(ctx, "SELECT pgscribe.wait_for_stream('notes', 1, $1, $2, '30s')", stream, pos).Scan(&ok)
					}
					if err != nil || !ok {
						return fmt.Errorf("%s/%d (by lsn %v): wait = %v, %v", stream, pos, byLSN, ok, err)
					}
					var at int64
					if err := conn.QueryRow(ctx, "SELECT at FROM notes WHERE stream = $1", stream).Scan(&at); err != nil {
						return fmt.Errorf("%s/%d: read own row: %w", stream, pos, err)
					}
					if at != pos {
						return fmt.Errorf("%s/%d (by lsn %v): stale read: row at %d", stream, pos, byLSN, at)
					}
				}
				return nil
			}()
		}(w)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}

	// Idle: nothing else is written, and the status and lag intervals are
	// the defaults (10 s, 5 s). The wait for the LSN taken right after an
	// append still ends promptly: keepalives carry the WAL end.
	time.Sleep(time.Second) // let the engine's own writes settle
	lsn, err := wtAppendEvent(ctx, e.pool, "idle", 1, "Ignored", "skipped")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var ok bool
	e.scan("SELECT pgscribe.wait_for_lsn('notes', 1, $1::pg_lsn, '20s')", []any{lsn}, &ok)
	took := time.Since(start)
	t.Logf("idle wait_for_lsn(%s): %v after %s", lsn, ok, took)
	if !ok || took > 3*time.Second {
		t.Errorf("idle wait_for_lsn: %v after %s, want true well within the 5 s lag interval", ok, took)
	}
	// And the LSN of this moment, with nothing appended at all.
	e.scan("SELECT pg_current_wal_lsn()::text", nil, &lsn)
	start = time.Now()
	e.scan("SELECT pgscribe.wait_for_lsn('notes', 1, $1::pg_lsn, '20s')", []any{lsn}, &ok)
	t.Logf("idle wait_for_lsn(%s), no append: %v after %s", lsn, ok, time.Since(start))
	if !ok {
		t.Error("idle wait_for_lsn without an append: false")
	}

	// Idle means idle: the engine saves the watermark once after an idle
	// advance, not again for the WAL of its own save (a loop would write
	// hundreds of transactions a second).
	// The WAL position is the cluster's, which the suite's other tests
	// write too: the least of three 1 s windows is the engine's share (a
	// loop writes in every window).
	time.Sleep(time.Second)
	walBytes := int64(-1)
	for range 3 {
		var w int64
		e.scan("SELECT pg_current_wal_lsn()::text", nil, &lsn)
		time.Sleep(time.Second)
		e.scan("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint", []any{lsn}, &w)
		if walBytes < 0 || w < walBytes {
			walBytes = w
		}
	}
	t.Logf("idle engine: %d bytes of WAL in the quietest of three 1 s windows", walBytes)
	if walBytes > 20<<10 {
		t.Errorf("idle engine wrote %d bytes of WAL in 1 s", walBytes)
	}
}

// Timeouts return false (SQL) and exit 1 (CLI); a dead-lettered event ends
// the wait and says so; a snapshot transaction is refused; the progress
// view and `pgscribe wait` report.
func TestWaitOutcomesAndTimeouts(t *testing.T) {
	e := newWtEnv(t)
	e.start("node-a")
	e.waitLive()
	cfg := e.config("node-a")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	for _, ev := range []struct {
		stream string
		typ    string
	}{{"s-note", "NoteAdded"}, {"s-bad", "Bad"}, {"s-skip", "Ignored"}} {
		if _, err := wtAppendEvent(ctx, e.pool, ev.stream, 1, ev.typ, "x"); err != nil {
			t.Fatal(err)
		}
	}
	for stream, want := range map[string]string{"s-note": "accounted", "s-bad": "dead_lettered", "s-skip": "accounted"} {
		var ok bool
		var outcome string
		e.scan("SELECT pgscribe.wait_for_stream('notes', 1, $1, 1, '30s')", []any{stream}, &ok)
		e.scan("SELECT pgscribe.event_outcome('notes', 1, $1, 1)", []any{stream}, &outcome)
		if !ok || outcome != want {
			t.Errorf("%s: wait %v, outcome %q; want true, %q", stream, ok, outcome, want)
		}
	}
	var outcome string
	e.scan("SELECT pgscribe.event_outcome('notes', 1, 's-bad', 2, '100ms')", nil, &outcome)
	if outcome != "pending" {
		t.Errorf("event_outcome of an event never appended = %q, want pending", outcome)
	}

	// SQL timeouts: false, after about the timeout.
	for _, q := range []string{
		"SELECT pgscribe.wait_for_stream('notes', 1, 's-note', 2, '300ms')",
		"SELECT pgscribe.wait_for_stream('notes', 1, 'no-such-stream', 1, '300ms')",
		"SELECT pgscribe.wait_for_lsn('notes', 1, 'FFFFFFFF/0', '300ms')",
		"SELECT pgscribe.wait_for_lsn('other', 1, '0/0', '300ms')",
	} {
		start := time.Now()
		var ok bool
		e.scan(q, nil, &ok)
		took := time.Since(start)
		if ok || took < 300*time.Millisecond || took > 5*time.Second {
			t.Errorf("%s: %v after %s, want false after about 300ms", q, ok, took)
		}
	}

	// A snapshot that can never see progress is refused, not slept on.
	tx, err := e.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	var ok bool
	err = tx.QueryRow(ctx, "SELECT pgscribe.wait_for_stream('notes', 1, 's-note', 2, '10s')").Scan(&ok)
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "25000" {
		t.Errorf("wait in REPEATABLE READ: %v, want SQLSTATE 25000", err)
	}
	_ = tx.Rollback(ctx)

	// The progress view.
	var state, wm string
	var backlog *int64
	waitFor(e.t, time.Minute, "a measured backlog in pgscribe.progress", func() bool {
		e.scan(`SELECT state, watermark_lsn::text, backlog_events FROM pgscribe.progress
WHERE projection = 'notes' AND version = 1`, nil, &state, &wm, &backlog)
		return backlog != nil && *backlog == 0
	})
	if state != "live" {
		t.Errorf("progress: state %s, watermark %s, backlog %d; want live, backlog 0", state, wm, *backlog)
	}

	// The CLI: reached (exit 0, with the outcome), timeout (exit 1, with
	// progress lines on stderr), usage (exit 2).
	r := e.cli("wait", "-config", cfg, "-projection", "notes", "-version", "1", "-stream", "s-bad", "-position", "1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "dead_lettered") {
		t.Errorf("wait for a dead-lettered event: %s", r)
	}
	r = e.cli("wait", "-config", cfg, "-projection", "notes", "-version", "1", "-caught-up", "-timeout", "20s")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "reached ") {
		t.Errorf("wait -caught-up: %s", r)
	}
	start := time.Now()
	r = e.cli("wait", "-config", cfg, "-projection", "notes", "-version", "1", "-stream", "s-note", "-position", "2", "-timeout", "2500ms")
	if r.code != 1 || !strings.Contains(r.stderr, "pgscribe wait: notes v1: live, stream s-note at 1 of 2") ||
		!strings.Contains(r.stderr, "timed out") || time.Since(start) < 2500*time.Millisecond {
		t.Errorf("wait that times out: %s", r)
	}
	r = e.cli("wait", "-config", cfg, "-projection", "notes", "-version", "1", "-lsn", "FFFFFFFF/0", "-timeout", "1s")
	if r.code != 1 || !strings.Contains(r.stderr, "watermark") {
		t.Errorf("wait -lsn that times out: %s", r)
	}
	for _, args := range [][]string{
		{"-projection", "notes", "-version", "1"},
		{"-projection", "notes", "-version", "1", "-caught-up", "-stream", "x", "-position", "1"},
		{"-projection", "notes", "-version", "1", "-stream", "x"},
		{"-version", "1", "-caught-up"},
	} {
		if r := e.cli(append([]string{"wait", "-config", cfg}, args...)...); r.code != 2 {
			t.Errorf("wait %v: want exit 2, got %s", args, r)
		}
	}
	if r := e.cli("wait", "-config", cfg, "-projection", "nope", "-version", "1", "-caught-up"); r.code != 1 ||
		!strings.Contains(r.stderr, "not in") {
		t.Errorf("wait for an unconfigured projection: %s", r)
	}
}

// A role with only the documented grants can wait, learn outcomes and
// read the progress view; without SELECT on cursors it cannot wait (the
// functions run with the caller's privileges).
func TestWaitReadOnlyRoleGrants(t *testing.T) {
	e := newWtEnv(t)
	e.start("node-a")
	e.waitLive()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := wtAppendEvent(ctx, e.pool, "g-1", 1, "Bad", "x"); err != nil {
		t.Fatal(err)
	}
	lsn, err := wtAppendEvent(ctx, e.pool, "g-2", 1, "NoteAdded", "x")
	if err != nil {
		t.Fatal(err)
	}

	role := e.prefix + "_reader"
	ident := pgx.Identifier{role}.Sanitize()
	e.exec("CREATE ROLE " + ident + " LOGIN PASSWORD 'reader'")
	t.Cleanup(func() {
		ctx := context.Background()
		_, _ = e.pool.Exec(ctx, "DROP OWNED BY "+ident)
		_, _ = e.pool.Exec(ctx, "DROP ROLE "+ident)
	})
	// The grants docs/read-your-writes.md documents, and nothing more.
	for _, g := range []string{
		"GRANT USAGE ON SCHEMA pgscribe TO " + ident,
		"GRANT SELECT ON pgscribe.cursors, pgscribe.watermarks, pgscribe.progress TO " + ident,
		"GRANT SELECT (projection, version, stream_id, stream_position) ON pgscribe.dead_letters TO " + ident,
		"GRANT EXECUTE ON FUNCTION pgscribe.wait_for_stream(text, bigint, text, bigint, interval), " +
			"pgscribe.wait_for_lsn(text, bigint, pg_lsn, interval), " +
			"pgscribe.event_outcome(text, bigint, text, bigint, interval) TO " + ident,
		"GRANT SELECT ON notes TO " + ident,
	} {
		e.exec(g)
	}
	u, err := url.Parse(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, "reader")
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	defer conn.Close(context.Background())

	var ok, okLSN bool
	var outcome, state string
	if err := conn.QueryRow(ctx, "SELECT pgscribe.wait_for_stream('notes', 1, 'g-2', 1, '30s')").Scan(&ok); err != nil || !ok {
		t.Fatalf("wait_for_stream as %s: %v, %v", role, ok, err)
	}
	if err := conn.QueryRow(ctx, "SELECT pgscribe.wait_for_lsn('notes', 1, $1::pg_lsn, '30s')", lsn).Scan(&okLSN); err != nil || !okLSN {
		t.Fatalf("wait_for_lsn as %s: %v, %v", role, okLSN, err)
	}
	if err := conn.QueryRow(ctx, "SELECT pgscribe.event_outcome('notes', 1, 'g-1', 1, '30s')").Scan(&outcome); err != nil || outcome != "dead_lettered" {
		t.Fatalf("event_outcome as %s: %q, %v", role, outcome, err)
	}
	if err := conn.QueryRow(ctx, "SELECT state FROM pgscribe.progress WHERE projection = 'notes'").Scan(&state); err != nil || state != "live" {
		t.Fatalf("progress as %s: %q, %v", role, state, err)
	}
	var pgErr *pgconn.PgError
	if _, err := conn.Exec(ctx, "SELECT event_data FROM pgscribe.dead_letters"); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("reading dead letters' event data as %s: %v, want 42501", role, err)
	}
	e.exec("REVOKE SELECT ON pgscribe.cursors FROM " + ident)
	if _, err := conn.Exec(ctx, "SELECT pgscribe.wait_for_stream('notes', 1, 'g-2', 1, '1s')"); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
		t.Errorf("wait_for_stream without SELECT on cursors: %v, want 42501 (functions run as the caller)", err)
	}
}

// A wait that spans a failover: the active node is killed (-9), the event
// is appended while no node is active, and the waits return true once the
// standby took over and applied it.
func TestWaitAcrossFailover(t *testing.T) {
	e := newWtEnv(t)
	nodes := map[string]*node{"node-a": e.start("node-a")}
	active := e.waitLive()
	other := "node-b"
	if active == "node-b" {
		other = "node-a"
	}
	nodes[other] = e.start(other)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := wtAppendEvent(ctx, e.pool, "fo", 1, "NoteAdded", "before"); err != nil {
		t.Fatal(err)
	}
	var ok bool
	e.scan("SELECT pgscribe.wait_for_stream('notes', 1, 'fo', 1, '30s')", nil, &ok)
	if !ok {
		t.Fatal("first event not applied")
	}

	nodes[active].kill()
	lsn, err := wtAppendEvent(ctx, e.pool, "fo", 2, "NoteAdded", "during")
	if err != nil {
		t.Fatal(err)
	}
	type res struct {
		ok  bool
		err error
	}
	byStream, byLSN := make(chan res, 1), make(chan res, 1)
	go func() {
		var r res
		r.err = e.pool.QueryRow(ctx, "SELECT pgscribe.wait_for_stream('notes', 1, 'fo', 2, '90s')").Scan(&r.ok)
		byStream <- r
	}()
	go func() {
		var r res
		r.err = e.pool.QueryRow(ctx, "SELECT pgscribe.wait_for_lsn('notes', 1, $1::pg_lsn, '90s')", lsn).Scan(&r.ok)
		byLSN <- r
	}()
	for what, ch := range map[string]chan res{"wait_for_stream": byStream, "wait_for_lsn": byLSN} {
		if r := <-ch; r.err != nil || !r.ok {
			t.Fatalf("%s across the failover: %v, %v", what, r.ok, r.err)
		}
	}
	var at int64
	var node string
	e.scan("SELECT at FROM notes WHERE stream = 'fo'", nil, &at)
	e.scan("SELECT node FROM pgscribe.leases WHERE projection = 'notes' AND version = 1", nil, &node)
	if at != 2 || node != other {
		t.Errorf("after the failover: row at %d, active node %s; want 2, %s", at, node, other)
	}
}

// The progress view finds a version's advisory lock with lock_key, which
// must be leader.Key to the bit, for any schema, projection and version.
func TestWaitLockKeyMatchesLeader(t *testing.T) {
	dsn := newDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := migrations.Apply(ctx, conn, "pgscribe"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		schema, projection string
		version            int64
	}{
		{"pgscribe", "balances", 1},
		{"Pg Scribe", `odd "name"`, 12345678901},
		{"s", "ünïcode", 7},
		{"", "", 0},
	} {
		var got int64
		if err := conn.QueryRow(ctx, "SELECT pgscribe.lock_key($1, $2, $3)", c.schema, c.projection, c.version).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if want := leader.Key(c.schema, c.projection, c.version); got != want {
			t.Errorf("lock_key(%q, %q, %d) = %d, leader.Key = %d", c.schema, c.projection, c.version, got, want)
		}
	}
}
