package integration

// `pgscribe test -database` and `pgscribe verify` through the binary,
// against real PostgreSQL: the example fixtures pass, a wrong expectation
// fails readably; verify finds no drift under a concurrent writer and
// names exactly the rows a test tampered with.

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// exampleProjections is the [[projection]] part of config.toml.example.
func exampleProjections(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../config.toml.example")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "[[projection]]")
	if i < 0 {
		t.Fatal("config.toml.example has no [[projection]]")
	}
	return s[i:]
}

func TestCLIRuleTestDatabase(t *testing.T) {
	e := newCLIEnv(t)
	schema, err := os.ReadFile("../examples/demo/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	e.exec(string(schema))
	cfg := e.config("example", "", "", exampleProjections(t))
	fixtures := []string{"../examples/fixtures/balances.toml", "../examples/fixtures/activity.toml"}

	r := e.mustRun(0, append([]string{"test", "-config", cfg, "-database"}, fixtures...)...)
	if strings.Count(r.stdout, "ok    ") != 2 || !strings.Contains(r.stdout, "1 tables") {
		t.Fatalf("want two ok lines:\n%s", r)
	}
	// The commit-time dead letter of activity.toml is checked only here.
	if !strings.Contains(r.stdout, "activity v1: 3 events, 2 checked") {
		t.Errorf("activity fixture: want its commit-time dead letter checked:\n%s", r)
	}

	b, err := os.ReadFile(fixtures[0])
	if err != nil {
		t.Fatal(err)
	}
	wrong := strings.Replace(string(b), "inc   = { balance = 50 }", "inc   = { balance = 55 }", 1)
	wrong = strings.Replace(wrong, `owner = "ada",   balance = 120`, `owner = "ada",   balance = 125`, 1)
	path := e.dir + "/wrong.toml"
	if err := os.WriteFile(path, []byte(wrong), 0o600); err != nil {
		t.Fatal(err)
	}
	r = e.mustRun(1, "test", "-config", cfg, "-database", path)
	t.Logf("a wrong fixture:\n%s", r.stdout)
	for _, want := range []string{
		"FAIL  " + path,
		path + ":33: ada deposits 50 (Deposited, stream acct-1 #2):",
		"intent 1 (rule move): inc.balance: want 55, got 50",
		"table balances after all 8 events:",
		`missing    row { account_id = "acct-1", balance = 125, closed = false, owner = "ada", updated_at = "2024-01-01T00:00:02+00:00" }`,
		`unexpected row { account_id = "acct-1", balance = 120, closed = false, owner = "ada", updated_at = "2024-01-01T00:00:02+00:00" }`,
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("want %q in the diff:\n%s", want, r)
		}
	}
	if n := e.queryInt(`SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgscribe_test_%'`); n != 0 {
		t.Errorf("%d scratch schemas left behind", n)
	}

	// A 1,000-event fixture, every event checked, timed (logged, not
	// asserted: docs/testing.md quotes the figure).
	big := e.dir + "/big.toml"
	if err := os.WriteFile(big, []byte(bigFixture(100, 9)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"test", "-config", cfg, big}, {"test", "-config", cfg, "-database", big}} {
		start := time.Now()
		r := e.mustRun(0, args...)
		t.Logf("%s: %s (%s)", strings.Join(args[3:], " "), time.Since(start).Round(time.Millisecond), strings.TrimSpace(r.stdout))
	}
}

// bigFixture is accounts AccountOpened events and moves deposits each,
// every one with its expected intent, and the balances they leave.
func bigFixture(accounts, moves int) string {
	var b strings.Builder
	b.WriteString("projection = \"balances\"\n")
	i := 0
	var rows []string
	for a := 1; a <= accounts; a++ {
		fmt.Fprintf(&b, `
[[event]]
type   = "AccountOpened"
stream = "acct-%[1]d"
data   = { account_id = "acct-%[1]d", owner = "o%[1]d", initial = 10 }
  [[event.intent]]
  op    = "upsert"
  table = "balances"
  key   = { account_id = "acct-%[1]d" }
  set   = { owner = "o%[1]d", balance = 10, closed = false, updated_at = %[2]s }
`, a, fixtureTime(i))
		i++
		for m := 1; m <= moves; m++ {
			fmt.Fprintf(&b, `
[[event]]
type   = "Deposited"
stream = "acct-%[1]d"
data   = { account_id = "acct-%[1]d", amount = %[2]d }
  [[event.intent]]
  op    = "update"
  table = "balances"
  key   = { account_id = "acct-%[1]d" }
  inc   = { balance = %[2]d }
  set   = { updated_at = %[3]s }
`, a, m, fixtureTime(i))
			i++
		}
		rows = append(rows, fmt.Sprintf(`{ account_id = "acct-%d", balance = %d, updated_at = %s }`, a, 10+moves*(moves+1)/2, fixtureTime(i-1)))
	}
	fmt.Fprintf(&b, "\n[[table]]\nname = \"balances\"\nrows = [\n  %s,\n]\n", strings.Join(rows, ",\n  "))
	return b.String()
}

// fixtureTime is the default occurred_at of a fixture's event i.
func fixtureTime(i int) string {
	return time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Second).Format(time.RFC3339)
}

// requireNoDrift runs `pgscribe verify` on a projection version and fails
// t unless the live read model equals a rebuild from the events its
// cursors accounted for: an oracle for any test that leaves a projection
// running or stopped (crash, failover, fault tests).
func requireNoDrift(t *testing.T, bin, cfg, projection string, version int64) cliResult {
	t.Helper()
	r := runCLI(t, bin, "verify", "-config", cfg, "-projection", projection, "-version", fmt.Sprint(version))
	if r.code != 0 || !strings.Contains(r.stdout, "no drift") || driftLine.MatchString(r.stdout) {
		t.Fatalf("verify %s v%d: want no drift:\n%s", projection, version, r)
	}
	return r
}

// appendWhile runs round(conn, 0), round(conn, 1), … on a connection of
// its own until the returned stop is called; stop returns how many rounds
// ran and fails t unless every one succeeded and there were at least two
// (else the caller's check did not run under load).
func appendWhile(t *testing.T, dsn string, round func(conn *pgx.Conn, i int) error) (stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var err error
	n := 0
	go func() {
		defer close(done)
		conn, cerr := pgx.Connect(context.Background(), dsn)
		if cerr != nil {
			err = cerr
			return
		}
		defer conn.Close(context.Background())
		for ; ctx.Err() == nil; n++ {
			if err = round(conn, n); err != nil {
				return
			}
		}
	}()
	return func() int {
		t.Helper()
		cancel()
		<-done
		if err != nil {
			t.Fatalf("writer: %v", err)
		}
		if n < 2 {
			t.Fatalf("the writer appended only %d rounds while the check ran: not a test under load", n)
		}
		return n
	}
}

// driftLine is a drifted row of verify's report (a shared row that
// differs legitimately or undecidably is listed as "(shared, …)": not drift).
var driftLine = regexp.MustCompile(`(?m)^  (different|missing|extra)( \(shared\))? +\{.*$`)

func TestCLIVerify(t *testing.T) {
	const accounts = 40
	e, cfg := newCLIAccounts(t, "verify", "parallelism = 2\nbatch_size = 50", cliBalances, accounts, 20)
	p := e.start(cfg)
	e.waitAccounted(p, "balances", 1)

	// A writer appends moves to every account while verify runs.
	stop := appendWhile(t, e.dsn, func(conn *pgx.Conn, i int) error {
		_, err := conn.Exec(context.Background(), `INSERT INTO events (stream_id, stream_position, type, data)
SELECT 'acct-' || a, 1 + m, 'Deposited', jsonb_build_object('account_id', 'acct-' || a, 'amount', m)
FROM generate_series(1, $1::int) a, generate_series($2::int, $2::int + 1) m ORDER BY a, m`, accounts, 21+2*i)
		return err
	})
	r := requireNoDrift(t, e.bin, cfg, "balances", 1)
	batches := stop()
	t.Logf("verify under load (%d writer batches):\n%s", batches, r.stdout)
	if !strings.Contains(r.stderr, "verify: table balances:") {
		t.Errorf("want a progress line per table on stderr:\n%s", r)
	}
	// The snapshot must have been taken mid-stream: events existed beyond
	// the cursors, so the rebuild had to stop exactly at them.
	var rebuilt int64
	if _, err := fmt.Sscanf(r.stdout[strings.Index(r.stdout, "balances v1: "):], "balances v1: %d events", &rebuilt); err != nil {
		t.Fatalf("no event count in %q: %v", r.stdout, err)
	}
	if total := e.queryInt(`SELECT count(*) FROM events`); rebuilt >= total {
		t.Errorf("verify rebuilt %d events of %d: the writer added none after its snapshot", rebuilt, total)
	}
	e.waitAccounted(p, "balances", 1)

	// Tamper with three rows; verify must name exactly those.
	e.exec(`UPDATE balances SET balance = balance + 1000 WHERE account_id = 'acct-3'`)
	e.exec(`DELETE FROM balances WHERE account_id = 'acct-7'`)
	e.exec(`INSERT INTO balances (account_id, owner, balance) VALUES ('ghost', 'nobody', 5)`)
	want := e.queryInt(`SELECT balance - 1000 FROM balances WHERE account_id = 'acct-3'`)
	r = e.mustRun(1, "verify", "-config", cfg, "-projection", "balances", "-version", "1")
	t.Logf("verify after tampering:\n%s%s", r.stderr, r.stdout)
	lines := driftLine.FindAllString(r.stdout, -1)
	if len(lines) != 3 || !strings.Contains(r.stdout, "3 rows drift") {
		t.Fatalf("want exactly 3 drifted rows:\n%s", r)
	}
	for i, w := range []string{
		fmt.Sprintf(`different { account_id = "acct-3" }: balance: live %d, expected %d`, want+1000, want),
		`missing   { account_id = "acct-7" }: not in the live table`,
		`extra     { account_id = "ghost" }: not in the rebuild; live row { account_id = "ghost", balance = 5, owner = "nobody" }`,
	} {
		found := false
		for _, l := range lines {
			found = found || strings.Contains(l, w)
		}
		if !found {
			t.Errorf("drift %d: want a line containing %q:\n%s", i, w, r)
		}
	}

	// -stream: only the rows those streams write.
	r = e.mustRun(1, "verify", "-config", cfg, "-projection", "balances", "-version", "1", "-stream", "acct-3", "-stream", "acct-4")
	if lines := driftLine.FindAllString(r.stdout, -1); len(lines) != 1 || !strings.Contains(lines[0], `"acct-3"`) {
		t.Errorf("-stream acct-3 -stream acct-4: want only acct-3's row:\n%s", r)
	}
	e.mustRun(0, "verify", "-config", cfg, "-projection", "balances", "-version", "1", "-stream", "acct-4")

	// A dead letter that disappeared is an accounting difference.
	var stream string
	var pos int64
	if err := e.conn.QueryRow(context.Background(), `DELETE FROM pgscribe.dead_letters WHERE id = (SELECT min(id) FROM pgscribe.dead_letters
WHERE stream_id = 'acct-4') RETURNING stream_id, stream_position`).Scan(&stream, &pos); err != nil {
		t.Fatal(err)
	}
	r = e.mustRun(1, "verify", "-config", cfg, "-projection", "balances", "-version", "1", "-stream", "acct-4")
	if w := fmt.Sprintf("dead letter stream %s #%d (rule:non_positive): rebuild only", stream, pos); !strings.Contains(r.stdout, w) ||
		driftLine.MatchString(r.stdout) {
		t.Errorf("want %q and no row drift:\n%s", w, r)
	}
	if n := e.queryInt(`SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgscribe_verify_%'`); n != 0 {
		t.Errorf("%d scratch schemas left behind", n)
	}
	p.stop()
	_ = time.Second
}

// A row several streams write with set, insert or delete holds the last
// committed batch's write, in an order a rebuild cannot know; but it must
// hold some writing stream's last write. Verify accepts every such outcome
// (exit 0 under concurrent load, parallel partitions interleaving the
// streams) and reports as drift a shared row that no stream's last write
// explains: a value none wrote, or a row deleted though every stream's last
// write leaves it present.
func TestCLIVerifyOrderDependent(t *testing.T) {
	e := newCLIEnv(t)
	cfg := e.config("owners", "", "parallelism = 2\nbatch_size = 7", projectionTOML("owners", 1, "",
		rule{name: "touch", on: "Touched", op: "upsert", table: "owner_last",
			key: `owner = "data.owner"`, set: `last_stream = "stream_id"`, inc: `touches = "1"`},
		rule{name: "drop", on: "Dropped", op: "delete", table: "owner_last", key: `owner = "data.owner"`},
		rule{name: "log", on: "Touched", op: "insert", table: "touch_log", set: `owner = "data.owner"`},
	))
	e.mustRun(0, "migrate", "-config", cfg, "-events-table")
	e.exec(`CREATE TABLE owner_last (owner text PRIMARY KEY, last_stream text NOT NULL, touches bigint NOT NULL)`)
	// Columns no rule writes (a serial key, a DEFAULT now()) are not
	// compared, and a rebuild does not advance the live sequence.
	e.exec(`CREATE TABLE touch_log (id bigserial PRIMARY KEY, owner text NOT NULL, logged_at timestamptz NOT NULL DEFAULT clock_timestamp())`)
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES
  ('s1', 1, 'Touched', '{"owner": "shared"}'), ('s2', 1, 'Touched', '{"owner": "shared"}'),
  ('s3', 1, 'Touched', '{"owner": "solo"}'), ('s3', 2, 'Touched', '{"owner": "solo"}')`)
	// Eight streams touch four shared owners (upserts only) and touch and
	// drop three others (upsert and delete).
	const writers = 8
	round := func(conn *pgx.Conn, r int) error {
		_, err := conn.Exec(context.Background(), `INSERT INTO events (stream_id, stream_position, type, data)
SELECT 'w' || s, $2::int,
  CASE WHEN $2::int % 2 = 1 AND (s + $2::int) % 3 = 0 THEN 'Dropped' ELSE 'Touched' END,
  jsonb_build_object('owner', CASE WHEN $2::int % 2 = 0 THEN 'o' || ((s + $2::int / 2) % 4) ELSE 'd' || ((s * $2::int) % 3) END)
FROM generate_series(1, $1::int) s ORDER BY (s * 5 + $2::int) % $1::int`, writers, r)
		return err
	}
	for r := 1; r <= 40; r++ {
		if err := round(e.conn, r); err != nil {
			t.Fatal(err)
		}
	}
	p := e.start(cfg)
	e.waitAccounted(p, "owners", 1)
	seq := e.queryInt(`SELECT last_value FROM touch_log_id_seq`)
	e.mustRun(0, "verify", "-config", cfg, "-projection", "owners", "-version", "1")
	if after := e.queryInt(`SELECT last_value FROM touch_log_id_seq`); after != seq {
		t.Errorf("verify advanced the live sequence from %d to %d", seq, after)
	}

	// (a) Under concurrent load every legitimate interleaving passes.
	stop := appendWhile(t, e.dsn, func(conn *pgx.Conn, i int) error { return round(conn, 41+i) })
	r := requireNoDrift(t, e.bin, cfg, "owners", 1)
	t.Logf("verify under load (%d writer rounds):\n%s", stop(), r.stdout)
	e.waitAccounted(p, "owners", 1)
	e.mustRun(0, "verify", "-config", cfg, "-projection", "owners", "-version", "1")

	// (b) A shared row tampered to a value no stream wrote is drift.
	e.exec(`UPDATE owner_last SET last_stream = 'elsewhere' WHERE owner = 'o1'`)
	r = e.mustRun(1, "verify", "-config", cfg, "-projection", "owners", "-version", "1")
	t.Logf("verify after tampering a shared row:\n%s", r.stdout)
	if lines := driftLine.FindAllString(r.stdout, -1); !strings.Contains(r.stdout, "1 differences (drift)") ||
		!strings.Contains(r.stdout, `different (shared) { owner = "o1" }: last_stream: live "elsewhere", which no writing stream's last write gives`) {
		t.Errorf("want the tampered shared row o1 as the one drift:\n%s\n%q", r, lines)
	}
	// (c) So is a shared row deleted though every stream's last write
	// (an upsert) leaves it present.
	e.exec(`DELETE FROM owner_last WHERE owner = 'o2'`)
	r = e.mustRun(1, "verify", "-config", cfg, "-projection", "owners", "-version", "1")
	if !strings.Contains(r.stdout, "2 differences (drift)") ||
		!strings.Contains(r.stdout, `missing (shared) { owner = "o2" }: not in the live table, though every writing stream's last write leaves it present`) {
		t.Errorf("want the deleted shared row o2 reported:\n%s", r)
	}

	e.exec(`UPDATE owner_last SET touches = 99 WHERE owner = 'solo'`)
	e.exec(`UPDATE touch_log SET owner = 'nobody' WHERE id = (SELECT max(id) FROM touch_log WHERE owner = 'solo')`)
	r = e.mustRun(1, "verify", "-config", cfg, "-projection", "owners", "-version", "1")
	for _, w := range []string{`different { owner = "solo" }: touches: live 99, expected 2`, "table touch_log: 2 rows drift",
		`extra     { owner = "nobody" }: not in the rebuild`, `missing   { owner = "solo" }: not in the live table`, "5 differences (drift)"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("want %q:\n%s", w, r)
		}
	}
	p.stop()
}
