package integration

// Zero-downtime rebuilds (issue 15): a new version builds in its own schema
// beside the live one, promote points the served views at it in one
// transaction while readers keep querying, retire removes the old one, and
// start_after_position adopts a replaced projector's work.
//
// Built on the harness (doc.go): newDatabase, newConfig and
// projectionKeysTOML, node, runCLI, waitFor, the accounted and sameRows
// oracles, srv (Restart, CanRestart). What is particular to rebuilds is in
// this file, prefixed rb.

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The rules of the two versions. v1 adds every amount (its bug: a
// withdrawal adds too); v2 subtracts withdrawals and counts deposits, in a
// table whose columns differ from v1's (promote must drop and create the
// view again).
var (
	rbRuleV1 = rule{name: "balance", on: "Deposited,Withdrawn", op: "upsert", table: "balances",
		key: `account_id = "stream_id"`, inc: `balance = "data.amount"`}
	rbRuleV2 = rule{name: "balance", on: "Deposited,Withdrawn", op: "upsert", table: "balances",
		key: `account_id = "stream_id"`, inc: `balance = "type == 'Deposited' ? data.amount : -data.amount", deposits = "type == 'Deposited' ? 1 : 0"`}
)

// rbMarks are the rules with which both versions also mark every account
// in two tables with their version number: a statement reading both served
// views must see one version in both.
func rbMarks(version int) []rule {
	set := fmt.Sprintf(`v = "%d"`, version)
	return []rule{
		{name: "marks", on: "Deposited", op: "upsert", table: "marks", key: `account_id = "stream_id"`, set: set},
		{name: "marks2", on: "Deposited", op: "upsert", table: "marks2", key: `account_id = "stream_id"`, set: set},
	}
}

const (
	rbDDLMarks = "CREATE TABLE marks (account_id text PRIMARY KEY, v int NOT NULL);\nCREATE TABLE marks2 (account_id text PRIMARY KEY, v int NOT NULL);\n"

	rbDDLV1 = "CREATE TABLE balances (account_id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0);\n"
	rbDDLV2 = "CREATE TABLE balances (account_id text PRIMARY KEY, deposits bigint NOT NULL DEFAULT 0, balance bigint NOT NULL DEFAULT 0);\n"

	// rbExpectV2 is v2's read model computed from the events table alone.
	rbExpectV2 = `SELECT stream_id AS account_id,
  count(*) FILTER (WHERE type = 'Deposited') AS deposits,
  sum(CASE WHEN type = 'Deposited' THEN (data->>'amount')::bigint ELSE -(data->>'amount')::bigint END) AS balance
FROM events WHERE type IN ('Deposited', 'Withdrawn') GROUP BY stream_id`
)

// rbEnv is one test's database, configuration files and processes.
type rbEnv struct {
	testDB // on pool
	dsn    string
	dir    string
	prefix string // slot_prefix, unique on the shared server
	pool   *pgxpool.Pool
	nodes  atomic.Int32 // pgscribe processes started, for their names
}

type rbVersion struct {
	version int
	rule    rule
	ddl     string
	extra   []string // more projection keys, "key = value"
	marks   bool     // also the rules of rbMarks (and ddl has rbDDLMarks)
}

func newRB(t *testing.T) *rbEnv {
	t.Helper()
	dsn := newDatabase(t)
	e := &rbEnv{testDB: testDB{t: t}, dsn: dsn, dir: t.TempDir(), prefix: uniqueID("rb")}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	e.pool, e.q = pool, pool
	t.Cleanup(pool.Close)
	return e
}

// config writes a configuration with the given versions of projection
// balances (schema balances_v<N>, serve public, its DDL file) and returns
// its path.
func (e *rbEnv) config(name string, versions ...rbVersion) string {
	e.t.Helper()
	c := newConfig(e.dsn, e.prefix).with("engine", map[string]string{
		"parallelism": "2", "batch_size": "100", "backfill_batch_size": "100", "standby_poll": `"200ms"`,
		"lag_interval": `"200ms"`, "status_interval": `"1s"`, "shutdown_timeout": `"10s"`,
	}).set("metrics", "listen", `"off"`)
	if err := os.MkdirAll(filepath.Join(e.dir, "sql"), 0o700); err != nil {
		e.t.Fatal(err)
	}
	for _, v := range versions {
		ddl := fmt.Sprintf("sql/balances_v%d.sql", v.version)
		if err := os.WriteFile(filepath.Join(e.dir, ddl), []byte(v.ddl), 0o600); err != nil {
			e.t.Fatal(err)
		}
		keys := append([]string{fmt.Sprintf(`schema = "balances_v%d"`, v.version), `serve = "public"`, fmt.Sprintf("ddl = %q", ddl)}, v.extra...)
		rules := []rule{v.rule}
		if v.marks {
			rules = append(rules, rbMarks(v.version)...)
		}
		c.add(projectionKeysTOML("balances", v.version, "", keys, rules...))
	}
	return c.write(e.t, filepath.Join(e.dir, name))
}

// cli runs a pgscribe command to its end and returns its output (stdout,
// then stderr) and exit code.
func (e *rbEnv) cli(args ...string) (string, int) {
	e.t.Helper()
	r := runCLI(e.t, pgscribeBinary(e.t), args...)
	return r.stdout + r.stderr, r.code
}

// mustCLI is cli that requires exit 0.
func (e *rbEnv) mustCLI(args ...string) string {
	e.t.Helper()
	out, code := e.cli(args...)
	if code != 0 {
		e.t.Fatalf("pgscribe %v: exit %d\n%s", args, code, out)
	}
	return out
}

// start starts a pgscribe command (run, or a promote to interrupt) as a
// node of the harness: killed at the end, its output checked for races and
// panics and shown on failure.
func (e *rbEnv) start(args ...string) *node {
	e.t.Helper()
	n := newNode(e.t, fmt.Sprintf("pgscribe-%d", e.nodes.Add(1)), "")
	n.args = args
	n.noListener = true // [metrics] listen = "off"
	n.start()
	return n
}

// seed appends perStream events to each of streams streams named
// <prefix>N, continuing their stream positions.
func (e *rbEnv) seed(prefix string, streams, perStream int) {
	e.t.Helper()
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data)
SELECT s.id, coalesce(m.top, 0) + g, CASE WHEN g % 3 = 0 THEN 'Withdrawn' ELSE 'Deposited' END, jsonb_build_object('amount', (g % 7) + 1)
FROM (SELECT $1 || n AS id FROM generate_series(1, $2::int) AS n) AS s
LEFT JOIN (SELECT stream_id, max(stream_position) AS top FROM events GROUP BY stream_id) AS m ON m.stream_id = s.id
CROSS JOIN generate_series(1, $3::int) AS g
ORDER BY g, s.id`, prefix, streams, perStream)
}

// load appends one event at a time to streams load1..loadN until stop
// closes, as a steady producer would; it returns when it has stopped.
func (e *rbEnv) load(stop <-chan struct{}, streams int) <-chan error {
	done := make(chan error, 1)
	go func() {
		var i int
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-time.After(3 * time.Millisecond):
			}
			i++
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := e.pool.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
SELECT $1, coalesce(max(stream_position), 0) + 1, $2, jsonb_build_object('amount', $3::int) FROM events WHERE stream_id = $1`,
				fmt.Sprintf("load%d", i%streams), []string{"Deposited", "Deposited", "Withdrawn"}[i%3], i%5+1)
			cancel()
			if err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

// accounted sums a version's cursors: applied + skipped + dead-lettered +
// adopted.
func (e *rbEnv) accounted(version int) int64 {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := accounted(ctx, e.pool, "balances", version)
	if err != nil {
		e.t.Fatal(err)
	}
	return n
}

func (e *rbEnv) phase(version int) string {
	var phase string
	err := e.pool.QueryRow(context.Background(), `SELECT phase FROM pgscribe.watermarks WHERE projection = 'balances' AND version = $1`,
		version).Scan(&phase)
	if err != nil {
		return ""
	}
	return phase
}

// waitCaughtUp waits until the version accounts for every event.
func (e *rbEnv) waitCaughtUp(version int, timeout time.Duration) {
	e.t.Helper()
	waitFor(e.t, timeout, fmt.Sprintf("balances v%d to account for every event and stream", version), func() bool {
		return e.phase(version) == "live" && e.accounted(version) == e.queryInt("SELECT count(*) FROM events") &&
			e.queryInt(`SELECT count(*) FROM pg_replication_slots s JOIN pgscribe.watermarks w ON w.slot_name = s.slot_name
  WHERE w.projection = 'balances' AND w.version = `+fmt.Sprint(version)+` AND s.active`) == 1
	})
}

// diff fails the test unless the rows of actual and expected (queries with
// the same columns) are the same.
func (e *rbEnv) diff(what, actual, expected string) {
	e.t.Helper()
	sameRows(e.t, e.pool, what, actual, expected)
}

// served is what the served table and the view public.balances say.
type rbServed struct {
	row     int64  // served.version, 0 when none
	comment string // the view's comment
	columns string // the view's columns
}

func (e *rbEnv) served() rbServed {
	e.t.Helper()
	var s rbServed
	ctx := context.Background()
	if err := e.pool.QueryRow(ctx, `SELECT coalesce((SELECT version FROM pgscribe.served WHERE projection = 'balances'), 0)`).Scan(&s.row); err != nil {
		e.t.Fatal(err)
	}
	if err := e.pool.QueryRow(ctx, `SELECT coalesce(obj_description('public.balances'::regclass, 'pg_class'), ''),
  (SELECT string_agg(attname, ',' ORDER BY attnum) FROM pg_attribute WHERE attrelid = 'public.balances'::regclass AND attnum > 0)`).
		Scan(&s.comment, &s.columns); err != nil {
		e.t.Fatal(err)
	}
	return s
}

// wantServed fails unless version is served and the row and the view agree.
func (e *rbEnv) wantServed(version int) {
	e.t.Helper()
	s := e.served()
	cols := map[int]string{1: "account_id,balance", 2: "account_id,deposits,balance"}[version]
	if s.row != int64(version) || !strings.HasSuffix(s.comment, fmt.Sprintf("v%d from balances_v%d.balances", version, version)) || s.columns != cols {
		e.t.Fatalf("want v%d served, with its view: got served row v%d, view comment %q, columns %s", version, s.row, s.comment, s.columns)
	}
}

// rbReaders query the served view in a loop until stopped and count the
// statements and the errors.
type rbReaders struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	queries atomic.Int64
	seen    [2]atomic.Bool // the versions statements saw in marks
	mu      sync.Mutex
	errs    []error
}

func (e *rbEnv) readers(n int) *rbReaders {
	r := &rbReaders{stop: make(chan struct{})}
	for range n {
		r.wg.Add(1)
		go func() {
			defer r.wg.Done()
			conn, err := pgx.Connect(context.Background(), e.dsn)
			if err != nil {
				r.fail(err)
				return
			}
			defer conn.Close(context.Background())
			for {
				select {
				case <-r.stop:
					return
				default:
				}
				// Named columns, prepared (pgx's default): a reader that
				// names its columns survives a view whose columns change.
				var rows, sum int64
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := conn.QueryRow(ctx, "SELECT count(*), coalesce(sum(balance), 0)::bigint FROM public.balances WHERE account_id <> ''").Scan(&rows, &sum)
				cancel()
				if err != nil {
					r.fail(err)
				}
				var m1, m2 int64
				ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
				err = conn.QueryRow(ctx, "SELECT (SELECT coalesce(max(v), 0) FROM public.marks), (SELECT coalesce(min(v), 0) FROM public.marks2)").Scan(&m1, &m2)
				cancel()
				switch {
				case err != nil:
					r.fail(err)
				case m1 != 0 && m2 != 0 && m1 != m2:
					r.fail(fmt.Errorf("one statement saw v%d in marks and v%d in marks2", m1, m2))
				case m1 != 0:
					r.seen[m1-1].Store(true)
				}
				r.queries.Add(1)
			}
		}()
	}
	return r
}

func (r *rbReaders) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
}

func (r *rbReaders) finish(t *testing.T) int64 {
	t.Helper()
	close(r.stop)
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, err := range r.errs {
		if i < 5 {
			t.Errorf("reader: %v", err)
		}
	}
	if len(r.errs) > 0 {
		t.Errorf("readers saw %d errors in %d statements", len(r.errs), r.queries.Load())
	}
	return r.queries.Load()
}

// statusJSON is the part of `pgscribe status -json` the tests read.
type rbStatus struct {
	Projections []struct {
		Version  int64  `json:"version"`
		State    string `json:"state"`
		Served   bool   `json:"served"`
		Schema   string `json:"schema"`
		Backfill *struct {
			Total int64 `json:"total"`
			Done  int64 `json:"done"`
		} `json:"backfill"`
		LagSeconds *float64 `json:"lag_seconds"`
		Adopted    int64    `json:"adopted_events"`
	} `json:"projections"`
	Served []struct {
		Projection string `json:"projection"`
		Version    int64  `json:"version"`
	} `json:"served"`
}

func (e *rbEnv) status(cfg string) rbStatus {
	e.t.Helper()
	out, code := e.cli("status", "-json", "-config", cfg)
	if code != 0 {
		e.t.Fatalf("status: exit %d: %s", code, out)
	}
	var s rbStatus
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		e.t.Fatalf("status -json: %v\n%s", err, out)
	}
	return s
}

// TestRebuildPromoteRetire: v1 serves under a steady load; v2, with a
// changed rule and other columns, builds beside it (surviving a kill -9
// during its backfill); promote swaps the view while readers query it
// without an error; the served rows then equal v2's expectation from the
// events table; retire removes v1 and its slot.
func TestRebuildPromoteRetire(t *testing.T) {
	e := newRB(t)
	v1 := rbVersion{version: 1, rule: rbRuleV1, ddl: rbDDLV1 + rbDDLMarks, marks: true}
	v2 := rbVersion{version: 2, rule: rbRuleV2, ddl: rbDDLV2 + rbDDLMarks, marks: true}
	cfg1, cfg2, both := e.config("v1.toml", v1), e.config("v2.toml", v2), e.config("both.toml", v1, v2)
	e.mustCLI("migrate", "-events-table", "-config", both)
	// Running migrate again changes nothing and does not fail: the DDL
	// (plain CREATE TABLE) ran once.
	if out := e.mustCLI("migrate", "-config", both); !strings.Contains(out, "read-model ddl already applied") {
		t.Errorf("second migrate did not report the DDL as applied:\n%s", out)
	}
	e.seed("acct", 300, 100)

	stopLoad := make(chan struct{})
	loadDone := e.load(stopLoad, 20)
	p1 := e.start("run", "-config", cfg1)
	e.waitFor(2*time.Minute, "v1 live", func() bool { return e.phase(1) == "live" })
	e.waitLag(both, 0, 5)
	out := e.mustCLI("promote", "-projection", "balances", "-version", "1", "-max-lag", "30s", "-config", both)
	t.Logf("promote v1:\n%s", out)
	e.wantServed(1)

	// v2 builds beside v1; kill -9 during its backfill, then again from the
	// start.
	p2 := e.start("run", "-config", cfg2)
	e.waitFor(2*time.Minute, "v2 backfilling", func() bool {
		return e.phase(2) == "backfilling" && e.accounted(2) > 0
	})
	st := e.status(both)
	if len(st.Projections) != 2 || st.Projections[0].State != "live" || !st.Projections[0].Served ||
		st.Projections[1].State != "backfilling" || st.Projections[1].Backfill == nil || st.Projections[1].Served {
		t.Errorf("status during v2's backfill: %+v", st.Projections)
	}
	p2.kill()
	p2 = e.start("run", "-config", cfg2)
	e.waitFor(3*time.Minute, "v2 live", func() bool { return e.phase(2) == "live" })
	e.waitLag(both, 1, 5)

	// Readers' privileges are on the stable name; promote keeps them.
	e.exec("GRANT SELECT ON public.balances, public.marks, public.marks2 TO PUBLIC")
	readers := e.readers(3)
	e.waitFor(time.Minute, "readers to run", func() bool { return readers.queries.Load() > 50 })
	out = e.mustCLI("promote", "-projection", "balances", "-version", "2", "-max-lag", "30s", "-config", both)
	t.Logf("promote v2:\n%s", out)
	if !strings.Contains(out, "public.balances → balances_v2.balances: dropped and created again (its columns change), 1 grant(s) copied") ||
		!strings.Contains(out, "public.marks → balances_v2.marks: replaced") {
		t.Errorf("promote v2 did not recreate the view with its grant:\n%s", out)
	}
	before := readers.queries.Load()
	e.waitFor(time.Minute, "readers to run after promote", func() bool { return readers.queries.Load() > before+50 })
	n := readers.finish(t)
	t.Logf("readers ran %d statements across the promote", n)
	if !readers.seen[0].Load() || !readers.seen[1].Load() {
		t.Errorf("readers did not see both versions (v1 %v, v2 %v)", readers.seen[0].Load(), readers.seen[1].Load())
	}
	e.wantServed(2)
	if n := e.queryInt("SELECT count(*) FROM information_schema.role_table_grants WHERE table_schema = 'public' AND table_name = 'balances' AND grantee = 'PUBLIC'"); n != 1 {
		t.Errorf("the view's grant to PUBLIC did not survive promote (%d grants)", n)
	}

	close(stopLoad)
	if err := <-loadDone; err != nil {
		t.Fatalf("load: %v", err)
	}
	e.waitCaughtUp(2, 2*time.Minute)
	e.diff("served rows after promote", "SELECT account_id, deposits, balance FROM public.balances", rbExpectV2)

	// Retire: refused for the served version, and while v1's engine runs.
	if out, code := e.cli("retire", "-projection", "balances", "-version", "2", "-config", both); code == 0 || !strings.Contains(out, "served version") {
		t.Errorf("retire of the served version: exit %d\n%s", code, out)
	}
	if out, code := e.cli("retire", "-projection", "balances", "-version", "1", "-config", both); code == 0 || !strings.Contains(out, "advisory lock") {
		t.Errorf("retire under a running engine: exit %d\n%s", code, out)
	}
	p1.stop()
	out = e.mustCLI("retire", "-projection", "balances", "-version", "1", "-drop-schema", "-config", both)
	t.Logf("retire v1:\n%s", out)
	for what, sql := range map[string]string{
		"slot":      "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '" + e.prefix + "_balances_v1'",
		"cursors":   "SELECT count(*) FROM pgscribe.cursors WHERE version = 1",
		"watermark": "SELECT count(*) FROM pgscribe.watermarks WHERE version = 1",
		"lease":     "SELECT count(*) FROM pgscribe.leases WHERE version = 1",
		"schema":    "SELECT count(*) FROM pg_namespace WHERE nspname = 'balances_v1'",
	} {
		if n := e.queryInt(sql); n != 0 {
			t.Errorf("after retire, v1's %s remains (%d)", what, n)
		}
	}
	e.wantServed(2)
	st = e.status(both)
	if len(st.Served) != 1 || st.Served[0].Version != 2 || !st.Projections[1].Served {
		t.Errorf("status after retire: served %+v", st.Served)
	}
	if n := e.accounted(2); n != e.queryInt("SELECT count(*) FROM events") {
		t.Errorf("v2 conservation: cursors account for %d events", n)
	}
	p2.stop()
}

// TestRebuildPromoteCrash: a promote killed with -9, or cut by a Postgres
// restart, after it changed the views but before it committed leaves v1
// served, whole; promoting again serves v2, whole.
func TestRebuildPromoteCrash(t *testing.T) {
	e := newRB(t)
	both := e.config("both.toml", rbVersion{version: 1, rule: rbRuleV1, ddl: rbDDLV1}, rbVersion{version: 2, rule: rbRuleV2, ddl: rbDDLV2})
	e.mustCLI("migrate", "-events-table", "-config", both)
	// A changed DDL file is reported and not run again; migrate succeeds.
	if err := os.WriteFile(filepath.Join(e.dir, "sql", "balances_v2.sql"), []byte("DROP TABLE balances;\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if out := e.mustCLI("migrate", "-config", both); !strings.Contains(out, "read-model ddl changed since it was applied") {
		t.Errorf("migrate after a DDL change did not say so:\n%s", out)
	}
	e.seed("acct", 20, 20)
	p := e.start("run", "-config", both)
	e.waitCaughtUp(1, 2*time.Minute)
	e.waitCaughtUp(2, 2*time.Minute)
	e.mustCLI("promote", "-projection", "balances", "-version", "1", "-config", both)
	e.wantServed(1)

	// interrupted runs promote v2 while the served row is locked, so that
	// the promote has swapped the views and waits to record the version;
	// crash then ends it.
	interrupted := func(crash func(promote *node)) {
		t.Helper()
		blocker, err := pgx.Connect(context.Background(), e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer blocker.Close(context.Background())
		tx, err := blocker.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(context.Background(), "SELECT 1 FROM pgscribe.served WHERE projection = 'balances' FOR UPDATE"); err != nil {
			t.Fatal(err)
		}
		promote := e.start("promote", "-projection", "balances", "-version", "2", "-timeout", "2m", "-config", both)
		e.waitFor(time.Minute, "promote to wait for the served row after swapping the views", func() bool {
			return e.queryInt(`SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE a.application_name = 'pgscribe-cli' AND NOT l.granted AND l.locktype = 'transactionid'`) > 0
		})
		crash(promote)
		_ = tx.Rollback(context.Background())
	}

	interrupted(func(promote *node) { promote.kill() })
	e.wantServed(1)

	if srv().CanRestart() {
		interrupted(func(promote *node) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := srv().Restart(ctx, true); err != nil {
				t.Fatalf("restart postgres: %v", err)
			}
			// The promote may have ended by itself with its connection.
			if promote.running() {
				promote.kill()
			}
		})
		e.pool.Reset()
		e.waitFor(time.Minute, "the database back", func() bool {
			return e.pool.Ping(context.Background()) == nil
		})
		e.wantServed(1)
	} else {
		t.Log("server cannot restart: the Postgres restart case is skipped")
	}

	e.mustCLI("promote", "-projection", "balances", "-version", "2", "-max-lag", "1m", "-force", "-config", both)
	e.wantServed(2)
	p.stop()
}

// TestRebuildAdopt: a hand-written projector kept balances up to position
// N; pgscribe takes over with start_after_position = N, adopts what it
// did, applies the rest, and ends exact, with conservation counting the
// adopted events.
func TestRebuildAdopt(t *testing.T) {
	e := newRB(t)
	version := rbVersion{version: 2, rule: rbRuleV2, ddl: rbDDLV2}
	cfg := e.config("adopt.toml", version)
	e.mustCLI("migrate", "-events-table", "-config", cfg)
	e.seed("acct", 50, 40)
	// The old projector's checkpoint: a position in the middle.
	n := e.queryInt("SELECT max(position) FROM events") / 2
	version.extra = []string{fmt.Sprintf("start_after_position = %d", n)}
	cfg = e.config("adopt.toml", version)
	// What the old projector wrote, stopped at its checkpoint.
	e.exec(`INSERT INTO balances_v2.balances (account_id, deposits, balance) ` +
		strings.Replace(rbExpectV2, "WHERE type IN", "WHERE position <= "+fmt.Sprint(n)+" AND type IN", 1))
	// Events after the checkpoint: some written before pgscribe starts,
	// some while it runs.
	e.seed("acct", 50, 5)
	e.seed("new", 10, 5)
	p := e.start("run", "-config", cfg)
	e.waitFor(2*time.Minute, "v2 live", func() bool { return e.phase(2) == "live" })
	e.seed("acct", 50, 3)
	e.waitCaughtUp(2, 2*time.Minute)
	e.diff("adopted read model", "SELECT account_id, deposits, balance FROM balances_v2.balances", rbExpectV2)
	adopted := e.queryInt("SELECT coalesce(sum(adopted), 0)::bigint FROM pgscribe.cursors WHERE projection = 'balances' AND version = 2")
	if want := e.queryInt("SELECT count(*) FROM events WHERE position <= $1", n); adopted != want {
		t.Errorf("adopted %d events, want %d (every event at or below %d)", adopted, want, n)
	}
	st := e.status(cfg)
	if st.Projections[0].Adopted != adopted {
		t.Errorf("status adopted_events = %d, want %d", st.Projections[0].Adopted, adopted)
	}
	// A restart does not adopt again.
	p.kill()
	p = e.start("run", "-config", cfg)
	e.seed("acct", 5, 1)
	e.waitCaughtUp(2, 2*time.Minute)
	e.diff("read model after restart", "SELECT account_id, deposits, balance FROM balances_v2.balances", rbExpectV2)
	p.stop()
}

// waitLag waits until status says the i-th configured version of cfg lags
// less than seconds.
func (e *rbEnv) waitLag(cfg string, i int, seconds float64) {
	e.t.Helper()
	e.waitFor(time.Minute, fmt.Sprintf("version #%d to lag less than %gs", i+1, seconds), func() bool {
		l := e.status(cfg).Projections[i].LagSeconds
		return l != nil && *l < seconds
	})
}

func (e *rbEnv) waitFor(timeout time.Duration, what string, cond func() bool) {
	e.t.Helper()
	waitFor(e.t, timeout, what, cond)
}

// TestRebuildPromoteRefusals: promote refuses a version that is
// backfilling, one that lags more than -max-lag and one that is halted —
// exit 1, a message naming the reason, the served views and the served row
// unchanged — and -force promotes the halted one, saying what it overrode.
func TestRebuildPromoteRefusals(t *testing.T) {
	e := newRB(t)
	v1 := rbVersion{version: 1, rule: rbRuleV1, ddl: rbDDLV1}
	v2 := rbVersion{version: 2, rule: rbRuleV2, ddl: rbDDLV2}
	cfg1, cfg2, both := e.config("v1.toml", v1), e.config("v2.toml", v2), e.config("both.toml", v1, v2)
	e.mustCLI("migrate", "-events-table", "-config", both)
	e.seed("acct", 20, 20)
	p1 := e.start("run", "-config", cfg1)
	e.waitCaughtUp(1, 2*time.Minute)
	e.mustCLI("promote", "-projection", "balances", "-version", "1", "-config", both)
	e.wantServed(1)
	servedRow := func() string {
		var s string
		if err := e.pool.QueryRow(context.Background(), "SELECT coalesce((SELECT s::text FROM pgscribe.served AS s WHERE projection = 'balances'), '')").Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before, beforeRow := e.served(), servedRow()

	// refused runs promote v2 and wants exit 1, each of reasons in its
	// message, none of absent, and v1 still served exactly as before.
	refused := func(what string, reasons, absent []string, args ...string) {
		t.Helper()
		out, code := e.cli(append([]string{"promote", "-projection", "balances", "-version", "2", "-config", both}, args...)...)
		t.Logf("promote of a version %s: exit %d\n%s", what, code, out)
		if code != 1 {
			t.Errorf("promote of a version %s: exit %d, want 1", what, code)
		}
		for _, r := range append(reasons, "refused", "-force overrides") {
			if !strings.Contains(out, r) {
				t.Errorf("promote of a version %s: the message does not say %q", what, r)
			}
		}
		for _, r := range absent {
			if strings.Contains(out, r) {
				t.Errorf("promote of a version %s: the message says %q", what, r)
			}
		}
		if got, row := e.served(), servedRow(); got != before || row != beforeRow {
			t.Errorf("promote of a version %s changed what is served: %+v %s, was %+v %s", what, got, row, before, beforeRow)
		}
	}
	// block holds a SHARE lock on v2's table, so that its upserts wait:
	// readers still read it, v2 applies nothing until release.
	block := func() (release func()) {
		t.Helper()
		conn, err := pgx.Connect(context.Background(), e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(context.Background(), "LOCK TABLE balances_v2.balances IN SHARE MODE"); err != nil {
			t.Fatal(err)
		}
		return func() {
			_ = tx.Rollback(context.Background())
			_ = conn.Close(context.Background())
		}
	}

	// Backfilling: v2's first batch waits on the lock.
	release := block()
	p2 := e.start("run", "-config", cfg2)
	e.waitFor(time.Minute, "v2 backfilling", func() bool { return e.status(both).Projections[1].State == "backfilling" })
	refused("that is backfilling", []string{"it is backfilling, not live"}, nil, "-max-lag", "1h")
	release()
	e.waitCaughtUp(2, 2*time.Minute)
	e.waitLag(both, 1, 5)

	// Lagging: live, with events it cannot apply while the lock holds.
	release = block()
	e.seed("acct", 5, 1)
	e.waitFor(time.Minute, "v2 to lag more than 2s", func() bool {
		p := e.status(both).Projections[1]
		return p.State == "live" && p.LagSeconds != nil && *p.LagSeconds > 2
	})
	refused("that lags", []string{"is above 1s"}, []string{"not live", "halted"}, "-max-lag", "1s")
	release()
	e.waitCaughtUp(2, 2*time.Minute)

	// Halted: a column its rule writes is gone (a schema mismatch halts).
	e.exec("ALTER TABLE balances_v2.balances DROP COLUMN deposits")
	e.seed("acct", 1, 1)
	e.waitFor(time.Minute, "v2 halted", func() bool { return e.status(both).Projections[1].State == "halted" })
	refused("that is halted", []string{"it is halted (", "deposits"}, nil, "-max-lag", "1h")

	// -force promotes it and says what it overrode.
	out := e.mustCLI("promote", "-projection", "balances", "-version", "2", "-max-lag", "1h", "-force", "-config", both)
	t.Logf("promote -force:\n%s", out)
	if !strings.Contains(out, "forced: promoting although it is halted (") || !strings.Contains(out, "served: balances v2 in schema public (before: v1") {
		t.Errorf("promote -force did not say what it overrode and what it served:\n%s", out)
	}
	if s := e.served(); s.row != 2 || !strings.HasSuffix(s.comment, "v2 from balances_v2.balances") || s.columns != "account_id,balance" {
		t.Errorf("after promote -force: %+v, want v2 served from balances_v2.balances", s)
	}
	if row := servedRow(); !strings.Contains(row, "(balances,2,public,") {
		t.Errorf("pgscribe.served after promote -force: %s", row)
	}
	p2.kill()
	p1.stop()
}
