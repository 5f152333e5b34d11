package integration

// The operator CLI end to end, through the built binary: deadletters
// list|stats, status, check and reset against a real PostgreSQL, with
// real engines started and stopped by signal. Everything the tests assert
// is what an operator sees: exit codes, stdout, stderr, and the JSON forms.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/admin"
)

// The rules of the balances projections, shared by the CLI and core tests.
const (
	accountKey  = `account_id = "data.account_id"`
	balanceMove = `balance = "type == 'Deposited' ? data.amount : -data.amount"`
)

// cliBalances is the projection most CLI tests run: the design's example,
// plus a fail rule for "Bogus" events so that two error kinds show up.
var cliBalances = projectionTOML("balances", 1, "",
	rule{name: "open", on: "AccountOpened", op: "upsert", table: "balances", key: accountKey,
		set: `owner = "data.owner", balance = "data.initial"`},
	rule{name: "non_positive", on: "Withdrawn", when: "data.amount <= 0", op: "fail",
		message: "'non-positive withdrawal: ' + string(data.amount)"},
	rule{name: "move", on: "Deposited,Withdrawn", op: "update", table: "balances", key: accountKey, inc: balanceMove},
	rule{name: "bogus", on: "Bogus", op: "fail", message: "'bogus event'"},
)

// cliAudit dead-letters the Bogus events too, under another projection.
var cliAudit = projectionTOML("audit", 1, "",
	rule{name: "audit_bogus", on: "Bogus", op: "fail", message: "'audit rejects bogus events'"})

// cliBalancesTable is the read model of cliBalances.
const cliBalancesTable = `CREATE TABLE balances (
  account_id text   PRIMARY KEY,
  owner      text   NOT NULL,
  balance    bigint NOT NULL DEFAULT 0
)`

// cliExpectedBalances computes the balances read model independently of
// pgscribe: opening balance plus deposits minus positive withdrawals
// (a withdrawal of 0 or less is dead-lettered, so it moves nothing).
const cliExpectedBalances = `SELECT o.stream_id AS account_id, o.data->>'owner' AS owner,
  (o.data->>'initial')::bigint + coalesce((
    SELECT sum(CASE WHEN m.type = 'Deposited' THEN (m.data->>'amount')::bigint ELSE -(m.data->>'amount')::bigint END)
    FROM events m WHERE m.stream_id = o.stream_id AND m.type IN ('Deposited', 'Withdrawn')
      AND NOT (m.type = 'Withdrawn' AND (m.data->>'amount')::bigint <= 0)), 0)::bigint AS balance
FROM events o WHERE o.type = 'AccountOpened'`

// cliEnv is one test's database, configuration directory and binary.
type cliEnv struct {
	testDB // on conn
	dsn    string
	dir    string
	bin    string
	prefix string // slot_prefix, unique on the server (slots are server-wide)
	conn   *pgx.Conn
}

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	dsn := newDatabase(t)
	bin := pgscribeBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &cliEnv{testDB: testDB{t: t, q: conn}, dsn: dsn, dir: t.TempDir(), bin: bin, prefix: uniqueID("cli"), conn: conn}
}

// config writes a configuration file and returns its path. source and
// engine are extra lines for those tables.
func (e *cliEnv) config(name, source, engine, projections string) string {
	e.t.Helper()
	return newConfig(e.dsn, e.prefix).raw("source", source).with("engine", map[string]string{
		"node": `"cli-node"`, "standby_poll": `"200ms"`, "lag_interval": `"200ms"`, "status_interval": `"1s"`,
		"shutdown_timeout": `"30s"`,
	}).raw("engine", engine).add(projections).write(e.t, filepath.Join(e.dir, name+".toml"))
}

// cliResult is what one command run gave.
type cliResult struct {
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// runCLI runs the binary to completion.
func runCLI(t *testing.T, bin string, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := cliCommand(ctx, bin, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := cliResult{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee) && ee.Exited():
		r.code = ee.ExitCode()
	default:
		t.Fatalf("pgscribe %s: %v\n%s", strings.Join(args, " "), err, r)
	}
	return r
}

// with returns the environment for a subtest: helpers fail t, never the
// parent test from the subtest's goroutine.
func (e *cliEnv) with(t *testing.T) *cliEnv {
	c := *e
	c.t = t
	return &c
}

func (e *cliEnv) run(args ...string) cliResult {
	e.t.Helper()
	return runCLI(e.t, e.bin, args...)
}

// mustRun runs a command that must exit with code.
func (e *cliEnv) mustRun(code int, args ...string) cliResult {
	e.t.Helper()
	r := e.run(args...)
	if r.code != code {
		e.t.Fatalf("pgscribe %s: want exit %d, got %s", strings.Join(args, " "), code, r)
	}
	return r
}

// setup migrates (through the binary, creating the events table and the
// publication) and creates the balances read model.
func (e *cliEnv) setup(cfg string) {
	e.t.Helper()
	e.mustRun(0, "migrate", "-config", cfg, "-events-table")
	e.exec(cliBalancesTable)
}

// newCLIAccounts is the start of most CLI tests: an environment whose
// configuration name runs projections with the [engine] settings engine,
// migrated, with accounts accounts opened and moves 1..moves appended to
// each.
func newCLIAccounts(t *testing.T, name, engine, projections string, accounts, moves int) (*cliEnv, string) {
	t.Helper()
	e := newCLIEnv(t)
	cfg := e.config(name, "", engine, projections)
	e.setup(cfg)
	e.openAccounts(accounts)
	e.moves(accounts, 1, moves)
	return e, cfg
}

// openAccounts appends AccountOpened for accounts 1..n.
func (e *cliEnv) openAccounts(n int) {
	e.t.Helper()
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data)
SELECT 'acct-' || a, 1, 'AccountOpened', jsonb_build_object('account_id', 'acct-' || a, 'owner', 'owner-' || a, 'initial', 100)
FROM generate_series(1, $1::int) a`, n)
}

// moves appends moves from..to (stream positions 1+from … 1+to) to
// accounts 1..n: a withdrawal every third, and an amount of 0 every fifth,
// so move 15 of each account is a withdrawal of 0 (dead-lettered).
func (e *cliEnv) moves(n, from, to int) {
	e.t.Helper()
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data)
SELECT 'acct-' || a, 1 + m, CASE WHEN m % 3 = 0 THEN 'Withdrawn' ELSE 'Deposited' END,
  jsonb_build_object('account_id', 'acct-' || a, 'amount', CASE WHEN m % 5 = 0 THEN 0 ELSE m END)
FROM generate_series(1, $1::int) a, generate_series($2::int, $3::int) m ORDER BY a, m`, n, from, to)
}

// bogus appends n Bogus events on their own streams.
func (e *cliEnv) bogus(n int) {
	e.t.Helper()
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data)
SELECT 'junk-' || b, 1, 'Bogus', jsonb_build_object('n', b) FROM generate_series(1, $1::int) b`, n)
}

// waitAccounted waits until every event is accounted for by the projection
// version's cursors (applied + skipped + dead-lettered = events).
func (e *cliEnv) waitAccounted(p *node, projection string, version int) {
	e.t.Helper()
	waitAccounted(e.t, e.conn, 2*time.Minute, projection, version, p.broken)
}

// balanceDiff counts the rows where the balances table and the independent
// computation disagree, both ways.
func (e *cliEnv) balanceDiff() int64 {
	e.t.Helper()
	return e.queryInt(`WITH want AS (` + cliExpectedBalances + `), got AS (SELECT account_id, owner, balance FROM balances)
SELECT (SELECT count(*) FROM (SELECT * FROM want EXCEPT SELECT * FROM got) a) +
       (SELECT count(*) FROM (SELECT * FROM got EXCEPT SELECT * FROM want) b)`)
}

func (e *cliEnv) slotExists(name string) bool {
	e.t.Helper()
	return e.queryInt(`SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, name) == 1
}

// start runs `pgscribe run` on cfg.
func (e *cliEnv) start(cfg string) *node {
	e.t.Helper()
	return startNode(e.t, fmt.Sprintf("pgscribe-%s", filepath.Base(cfg)), cfg)
}

// cliStatus is the contract of `status -json`, spelled out with its keys.
type cliStatus struct {
	CheckedAt   time.Time `json:"checked_at"`
	SourceWAL   string    `json:"source_wal_lsn"`
	Events      int64     `json:"events"`
	Projections []struct {
		Projection string `json:"projection"`
		Version    int64  `json:"version"`
		State      string `json:"state"`
		Node       string `json:"node"`
		LockPID    int32  `json:"lock_pid"`
		Slot       struct {
			Name      string `json:"name"`
			Exists    bool   `json:"exists"`
			ActivePID int32  `json:"active_pid"`
			Confirmed string `json:"confirmed_flush_lsn"`
		} `json:"slot"`
		Watermark *struct {
			Phase      string     `json:"phase"`
			LSN        string     `json:"lsn"`
			Position   int64      `json:"position"`
			CommitTime *time.Time `json:"commit_time"`
		} `json:"watermark"`
		LagSeconds       *float64 `json:"lag_seconds"`
		LagBytes         *int64   `json:"lag_bytes"`
		BacklogEvents    int64    `json:"backlog_events"`
		WALRetainedBytes *int64   `json:"wal_retained_bytes"`
		DeadLetters      int64    `json:"dead_letters"`
		Backfill         *struct {
			Total      int64    `json:"total"`
			Done       int64    `json:"done"`
			Percent    float64  `json:"percent"`
			ETASeconds *float64 `json:"eta_seconds"`
		} `json:"backfill"`
		Notes []string `json:"notes"`
	} `json:"projections"`
	Unconfigured []struct {
		Slot             string `json:"slot"`
		Projection       string `json:"projection"`
		Version          int64  `json:"version"`
		WALRetainedBytes *int64 `json:"wal_retained_bytes"`
	} `json:"unconfigured_slots"`
}

func (e *cliEnv) status(cfg string) cliStatus {
	e.t.Helper()
	r := e.mustRun(0, "status", "-config", cfg, "-json")
	var s cliStatus
	if err := json.Unmarshal([]byte(r.stdout), &s); err != nil {
		e.t.Fatalf("status -json does not parse: %v\n%s", err, r)
	}
	return s
}

// deadLetterKeys are the names of a `deadletters list -json` line: the
// contract scripts rely on, written out here so that renaming a field of
// admin.DeadLetterJSON fails this test.
var deadLetterKeys = []string{"dead_lettered_at", "error_kind", "error_message", "event_data", "event_id",
	"event_metadata", "event_type", "id", "occurred_at", "position", "projection", "stream_id", "stream_position", "version"}

func (e *cliEnv) listJSON(args ...string) []admin.DeadLetterJSON {
	e.t.Helper()
	r := e.mustRun(0, append([]string{"deadletters", "list", "-json"}, args...)...)
	var out []admin.DeadLetterJSON
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var d admin.DeadLetterJSON
		var keys map[string]json.RawMessage
		if err := errors.Join(json.Unmarshal(sc.Bytes(), &d), json.Unmarshal(sc.Bytes(), &keys)); err != nil {
			e.t.Fatalf("deadletters list -json line %q: %v", sc.Text(), err)
		}
		if got := slices.Sorted(maps.Keys(keys)); !slices.Equal(got, deadLetterKeys) {
			e.t.Fatalf("deadletters list -json line has keys %v, want %v", got, deadLetterKeys)
		}
		out = append(out, d)
	}
	return out
}

func kindsOf(ds []admin.DeadLetterJSON) map[string]int {
	m := map[string]int{}
	for _, d := range ds {
		m[d.ErrorKind]++
	}
	return m
}

// TestCLIDeadLetters produces dead letters of three kinds in two
// projections with fail rules, then lists and counts them with every
// filter, paging and both output forms.
func TestCLIDeadLetters(t *testing.T) {
	t.Parallel()
	const accounts, bogus = 4, 3
	e, cfg := newCLIAccounts(t, "dl", "", cliBalances+cliAudit, accounts, 15) // move 15: a withdrawal of 0 per account
	e.bogus(bogus)
	p := e.start(cfg)
	e.waitAccounted(p, "balances", 1)
	e.waitAccounted(p, "audit", 1)
	p.stop()

	all := e.listJSON("-config", cfg)
	if len(all) != 2*bogus+accounts {
		t.Fatalf("list -json: %d dead letters, want %d", len(all), 2*bogus+accounts)
	}
	for i, d := range all {
		if i > 0 && d.ID <= all[i-1].ID {
			t.Errorf("ids not ascending: %d after %d", d.ID, all[i-1].ID)
		}
		if d.EventID == "" || d.Position <= 0 || d.StreamPosition <= 0 || d.DeadLetteredAt.IsZero() || d.OccurredAt == nil {
			t.Errorf("incomplete row: %+v", d)
		}
		var data map[string]any
		if err := json.Unmarshal(d.EventData, &data); err != nil || len(data) == 0 {
			t.Errorf("event_data of %d is not the event's JSON: %s", d.ID, d.EventData)
		}
		if string(d.EventMetadata) != "{}" {
			t.Errorf("event_metadata of %d = %s, want {}", d.ID, d.EventMetadata)
		}
	}
	if got, want := kindsOf(all), map[string]int{"rule:non_positive": accounts, "rule:bogus": bogus, "rule:audit_bogus": bogus}; !mapsEq(got, want) {
		t.Errorf("kinds %v, want %v", got, want)
	}

	// Filters.
	audit := e.listJSON("-config", cfg, "-projection", "audit")
	if len(audit) != bogus || kindsOf(audit)["rule:audit_bogus"] != bogus {
		t.Errorf("-projection audit: %+v", audit)
	}
	np := e.listJSON("-config", cfg, "-projection", "balances", "-version", "1", "-kind", "rule:non_positive")
	if len(np) != accounts {
		t.Errorf("-kind rule:non_positive: %d rows, want %d", len(np), accounts)
	}
	for _, d := range np {
		// The message ends with the fail rule's message; what precedes it
		// (projection, rule, event) is up to the engine.
		if d.EventType != "Withdrawn" || !strings.HasSuffix(d.ErrorMessage, "non-positive withdrawal: 0") || d.StreamPosition != 16 {
			t.Errorf("non_positive row: %+v", d)
		}
	}
	if s := e.listJSON("-config", cfg, "-stream", "acct-2"); len(s) != 1 || s[0].StreamID != "acct-2" {
		t.Errorf("-stream acct-2: %+v", s)
	}
	if s := e.listJSON("-config", cfg, "-stream", "junk-1"); len(s) != 2 {
		t.Errorf("-stream junk-1: %d rows, want 2 (one per projection)", len(s))
	}
	if s := e.listJSON("-config", cfg, "-version", "2"); len(s) != 0 {
		t.Errorf("-version 2: %d rows, want none", len(s))
	}
	if r := e.mustRun(0, "deadletters", "list", "-config", cfg, "-version", "2"); !strings.Contains(r.stdout, "no dead letters") {
		t.Errorf("empty list as text: %s", r)
	}

	// Paging by id: pages of 4 cover everything once, in order.
	var paged []int64
	after := int64(0)
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("paging does not end")
		}
		rows := e.listJSON("-config", cfg, "-limit", "4", "-after", fmt.Sprint(after))
		if len(rows) == 0 {
			break
		}
		if len(rows) > 4 {
			t.Fatalf("page of %d rows with -limit 4", len(rows))
		}
		for _, d := range rows {
			paged = append(paged, d.ID)
		}
		after = rows[len(rows)-1].ID
	}
	var ids []int64
	for _, d := range all {
		ids = append(ids, d.ID)
	}
	if !slices.Equal(paged, ids) {
		t.Errorf("paged ids %v, want %v", paged, ids)
	}

	// The table: header, projection, kind, the message's end; a full page
	// ends with how to get the next one.
	r := e.mustRun(0, "deadletters", "list", "-config", cfg)
	for _, want := range []string{"ID", "ERROR KIND", "MESSAGE", "balances v1", "audit v1", "rule:non_positive",
		"non-positive withdrawal: 0", "acct-1/16", "junk-1/1"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("list table lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "-after") {
		t.Errorf("a short page suggests a next one:\n%s", r.stdout)
	}
	r = e.mustRun(0, "deadletters", "list", "-config", cfg, "-limit", "4")
	if lines := strings.Count(r.stdout, "\n"); lines != 1+4+1 || !strings.Contains(r.stdout, fmt.Sprintf("-after %d", ids[3])) {
		t.Errorf("a page of 4 must have a header, 4 rows and the next-page hint:\n%s", r.stdout)
	}

	// Stats.
	var st struct {
		Total       int64      `json:"total"`
		Oldest      *time.Time `json:"oldest"`
		Newest      *time.Time `json:"newest"`
		ByErrorKind []struct {
			ErrorKind string `json:"error_kind"`
			Count     int64  `json:"count"`
		} `json:"by_error_kind"`
		ByProjection []struct {
			Projection string `json:"projection"`
			Version    int64  `json:"version"`
			Count      int64  `json:"count"`
		} `json:"by_projection"`
	}
	r = e.mustRun(0, "deadletters", "stats", "-config", cfg, "-json")
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil {
		t.Fatalf("stats -json: %v\n%s", err, r)
	}
	if st.Total != int64(len(all)) || st.Oldest == nil || st.Newest == nil || st.Newest.Before(*st.Oldest) {
		t.Errorf("stats: %+v", st)
	}
	kinds := map[string]int{}
	for _, k := range st.ByErrorKind {
		kinds[k.ErrorKind] = int(k.Count)
	}
	if !mapsEq(kinds, kindsOf(all)) {
		t.Errorf("stats by kind %v, want %v", kinds, kindsOf(all))
	}
	if len(st.ByProjection) != 2 || st.ByProjection[0].Projection != "audit" || st.ByProjection[0].Count != bogus ||
		st.ByProjection[1].Projection != "balances" || st.ByProjection[1].Version != 1 || st.ByProjection[1].Count != accounts+bogus {
		t.Errorf("stats by projection: %+v", st.ByProjection)
	}
	r = e.mustRun(0, "deadletters", "stats", "-config", cfg, "-json", "-projection", "balances", "-kind", "rule:bogus")
	if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Total != bogus || len(st.ByErrorKind) != 1 {
		t.Errorf("filtered stats: %v %+v", err, st)
	}
	r = e.mustRun(0, "deadletters", "stats", "-config", cfg)
	for _, want := range []string{"total", fmt.Sprint(len(all)), "ERROR KIND", "rule:non_positive", "PROJECTION", "audit v1"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stats text lacks %q:\n%s", want, r.stdout)
		}
	}

	// Bad flag values are usage errors.
	for _, args := range [][]string{
		{"list", "-limit", "0"}, {"list", "-limit", "10001"}, {"list", "-version", "-1"}, {"list", "-after", "-5"},
		{"list", "-bogus"}, {"stats", "-after", "3"}, {"stats", "extra"},
	} {
		e.mustRun(2, append([]string{"deadletters"}, append(args, "-config", cfg)...)...)
	}
}

func mapsEq(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestCLIStatus follows one projection through stopped (never run), live
// (caught up, then catching up with new events) and stopped again after
// SIGTERM, with no engine needed for the command itself.
func TestCLIStatus(t *testing.T) {
	t.Parallel()
	e, cfg := newCLIAccounts(t, "status", "", cliBalances, 3, 15)
	events := e.queryInt("SELECT count(*) FROM events")

	s := e.status(cfg)
	if len(s.Projections) != 1 {
		t.Fatalf("status: %d projections", len(s.Projections))
	}
	ps := s.Projections[0]
	slot := e.prefix + "_balances_v1"
	if s.Events != events || s.SourceWAL == "" || s.CheckedAt.IsZero() {
		t.Errorf("status header: %+v", s)
	}
	if ps.Projection != "balances" || ps.Version != 1 || ps.State != "stopped" || ps.Node != "" || ps.LockPID != 0 ||
		ps.Slot.Name != slot || ps.Slot.Exists || ps.Watermark != nil || ps.BacklogEvents != events ||
		ps.LagBytes != nil || ps.WALRetainedBytes != nil || ps.DeadLetters != 0 || ps.Backfill != nil {
		t.Errorf("never run: %+v", ps)
	}
	if s.Unconfigured == nil || len(s.Unconfigured) != 0 {
		t.Errorf("unconfigured_slots must be an empty list: %+v", s.Unconfigured)
	}
	if len(ps.Notes) == 0 || !strings.Contains(ps.Notes[0], "never run") {
		t.Errorf("never run: notes %q", ps.Notes)
	}
	r := e.mustRun(0, "status", "-config", cfg)
	for _, want := range []string{"PROJECTION", "STATE", "balances v1", "stopped", "never run"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status text lacks %q:\n%s", want, r.stdout)
		}
	}

	p := e.start(cfg)
	var live cliStatus
	// After the backfill alone the watermark has a commit time: the
	// snapshot's newest commit (track_commit_timestamp is on).
	waitFor(t, 2*time.Minute, "status to show balances live and caught up", func() bool {
		p.requireRunning()
		live = e.status(cfg)
		ps := live.Projections[0]
		return ps.State == "live" && ps.BacklogEvents == 0 && ps.Watermark != nil && ps.Watermark.LSN != "0/0" &&
			ps.Watermark.CommitTime != nil
	})
	ps = live.Projections[0]
	if ps.Node != "cli-node" || ps.LockPID == 0 || !ps.Slot.Exists || ps.Slot.ActivePID == 0 || ps.Slot.Confirmed == "" {
		t.Errorf("live: node, lock or slot: %+v", ps)
	}
	if ps.Watermark.Phase != "live" || ps.LagSeconds == nil || *ps.LagSeconds != 0 || ps.LagBytes == nil ||
		ps.WALRetainedBytes == nil || *ps.WALRetainedBytes < 0 || ps.DeadLetters != 3 || ps.Backfill != nil {
		t.Errorf("live: %+v (watermark %+v)", ps, *ps.Watermark)
	}

	// New events while live: applied, and status catches up. The
	// watermark moves past the backfill's consistent point and takes the
	// commit time of the streamed transactions.
	e.moves(3, 16, 20)
	waitFor(t, 2*time.Minute, "status to show the new events applied", func() bool {
		p.requireRunning()
		ps := e.status(cfg).Projections[0]
		return ps.State == "live" && ps.BacklogEvents == 0 && ps.Watermark != nil && ps.Watermark.CommitTime != nil
	})
	r = e.mustRun(0, "status", "-config", cfg)
	for _, want := range []string{"balances v1", "live", "cli-node"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status text lacks %q:\n%s", want, r.stdout)
		}
	}

	p.stop()
	s = e.status(cfg)
	ps = s.Projections[0]
	if ps.State != "stopped" || ps.Node != "" || ps.LockPID != 0 || !ps.Slot.Exists || ps.Slot.ActivePID != 0 ||
		ps.Watermark == nil || ps.Watermark.Phase != "live" || ps.BacklogEvents != 0 || ps.WALRetainedBytes == nil {
		t.Errorf("after SIGTERM: %+v", ps)
	}
	if !slices.ContainsFunc(ps.Notes, func(n string) bool { return strings.Contains(n, "retains WAL") }) {
		t.Errorf("after SIGTERM: notes %q", ps.Notes)
	}

	// Events written while stopped show as backlog and lag.
	e.moves(3, 21, 22)
	ps = e.status(cfg).Projections[0]
	if ps.State != "stopped" || ps.BacklogEvents != 6 || ps.LagSeconds == nil || *ps.LagSeconds <= 0 {
		t.Errorf("stopped with new events: state %s backlog %d lag %v", ps.State, ps.BacklogEvents, ps.LagSeconds)
	}

	// A database that cannot be reached is a runtime failure: exit 1.
	bad := e.config("unreachable", "", "", cliBalances)
	body, _ := os.ReadFile(bad)
	unreachable := "postgres://nobody@127.0.0.1:1/nothing?sslmode=disable&connect_timeout=5"
	if err := os.WriteFile(bad, []byte(strings.Replace(string(body), e.dsn, unreachable, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if r := e.mustRun(1, "status", "-config", bad); !strings.Contains(r.stderr, "connect") {
		t.Errorf("unreachable database: %s", r)
	}
}

// TestCLIStatusBackfillProgress shows a slow backfill's progress: the
// projection's rule sleeps 2 ms per event in the batch transaction, so
// 10,000 events take long enough for the engine to store progress
// (every 5 s) and for status to compute a rate and an ETA.
func TestCLIStatusBackfillProgress(t *testing.T) {
	t.Parallel()
	e, cfg := newCLIAccounts(t, "backfill", `parallelism         = 1
batch_size          = 100
backfill_batch_size = 100
queue_size          = 100`, projectionTOML("slow", 1, "",
		rule{name: "sleep", op: "sql", sql: "SELECT pg_sleep($1)", args: `["0.002"]`}), 100, 99)
	total := e.queryInt("SELECT count(*) FROM events")

	p := e.start(cfg)
	var s cliStatus
	waitFor(t, 2*time.Minute, "status to show backfill progress with an ETA", func() bool {
		p.requireRunning()
		s = e.status(cfg)
		b := s.Projections[0].Backfill
		return s.Projections[0].State == "backfilling" && b != nil && b.Done > 0 && b.ETASeconds != nil
	})
	ps := s.Projections[0]
	b := ps.Backfill
	if b.Total != total || b.Done >= total || b.Percent <= 0 || b.Percent >= 100 || *b.ETASeconds <= 0 {
		t.Errorf("backfill progress: %+v (eta %v)", *b, *b.ETASeconds)
	}
	if ps.Node != "cli-node" || ps.LagSeconds != nil || ps.BacklogEvents <= 0 || ps.Watermark == nil || ps.Watermark.Phase != "backfilling" {
		t.Errorf("backfilling: %+v", ps)
	}
	r := e.mustRun(0, "status", "-config", cfg)
	if !strings.Contains(r.stdout, "backfilling") || !strings.Contains(r.stdout, fmt.Sprintf("/%d) eta ", total)) {
		t.Errorf("status text during backfill:\n%s", r.stdout)
	}
	p.stop()
	if st := e.status(cfg).Projections[0].State; st != "stopped" {
		t.Errorf("after SIGTERM during backfill: state %s", st)
	}
}

// TestCLICheck breaks the setup one way at a time; check reports each
// problem on its own line and exits 2, and passes on the correct setup.
func TestCLICheck(t *testing.T) {
	t.Parallel()
	e := newCLIEnv(t)
	cfg := e.config("check", "", "", cliBalances)

	// Before migrate: no events table, publication or engine schema.
	r := e.mustRun(2, "check", "-config", cfg)
	for _, want := range []string{
		`source: table "events": does not exist in the search_path`,
		`target: engine schema "pgscribe": does not exist (run pgscribe migrate)`,
		`balances v1 rule "open": table "balances": does not exist in the search_path`,
	} {
		if !strings.Contains(r.stdout, want+"\n") {
			t.Errorf("before migrate: lacks %q:\n%s", want, r)
		}
	}

	e.setup(cfg)
	r = e.mustRun(0, "check", "-config", cfg)
	if !strings.Contains(r.stdout, "ok (1 projection; databases checked)") {
		t.Errorf("correct setup: %s", r)
	}

	// 70 projections in the default group stream from one slot, on a
	// server of 64 slots and WAL senders: nothing to raise (check once
	// counted a slot per version, 71 here).
	var many strings.Builder
	for i := range 70 {
		many.WriteString(strings.Replace(cliBalances, `name = "balances"`, fmt.Sprintf(`name = "balances_%d"`, i), 1))
	}
	if !strings.Contains(many.String(), `"balances_69"`) {
		t.Fatalf("cliBalances has no name line to replace:\n%s", cliBalances)
	}
	r = e.mustRun(0, "check", "-config", e.config("check_many", "", "", many.String()))
	if !strings.Contains(r.stdout, "ok (70 projections; databases checked)") {
		t.Errorf("70 projections in one group: %s", r)
	}

	e.exec(`CREATE TABLE balances_text (account_id text PRIMARY KEY, owner text NOT NULL, balance text)`)
	e.exec(`CREATE TABLE balances_noidx (account_id text, owner text, balance bigint)`)
	e.exec(`CREATE TABLE balances_extra (account_id text PRIMARY KEY, owner text, balance bigint, opened_at timestamptz NOT NULL)`)
	e.exec(`CREATE TABLE events_nopk (position bigserial, id uuid, stream_id text NOT NULL, stream_position bigint NOT NULL,
  type text NOT NULL, data jsonb NOT NULL, metadata jsonb, occurred_at timestamptz)`)
	tests := []struct {
		name     string
		from, to string // a replacement in the balances projection
		source   string // extra [source] lines
		want     []string
	}{
		{name: "missing table", from: `table = "balances"`, to: `table = "public.nosuch"`,
			want: []string{`balances v1 rule "open": table "public.nosuch": does not exist`,
				`balances v1 rule "move": table "public.nosuch": does not exist`}},
		{name: "missing column", from: `owner = "data.owner"`, to: `ownr = "data.owner"`,
			want: []string{`balances v1 rule "open": table "balances" column "ownr": does not exist`}},
		{name: "wrong inc type", from: `table = "balances"`, to: `table = "balances_text"`,
			want: []string{`balances v1 rule "move": table "balances_text" column "balance": type text cannot take inc`}},
		{name: "upsert without unique index", from: `table = "balances"`, to: `table = "balances_noidx"`,
			want: []string{`balances v1 rule "open": table "balances_noidx" key (account_id): no unique index or constraint on exactly these columns`}},
		{name: "not null column not set", from: `table = "balances"`, to: `table = "balances_extra"`,
			want: []string{`balances v1 rule "open": table "balances_extra" column "opened_at": is NOT NULL without a default, and the rule does not set it`}},
		{name: "position not unique", source: `table = "events_nopk"`,
			want: []string{`source: table "events_nopk" column "position": is in no unique index`}},
		{name: "missing publication", source: `publication = "nosuch_pub"`,
			want: []string{`source: publication "nosuch_pub": does not exist (pgscribe migrate creates it)`}},
		{name: "sql rule", from: rule{name: "bogus"}.String(),
			to: rule{name: "audit", on: "Bogus", op: "sql", sql: "INSERT INTO nosuch_audit (id) VALUES ($1)", args: `["id"]`}.String() +
				rule{name: "bogus"}.String(),
			want: []string{`balances v1 rule "audit": sql: relation "nosuch_audit" does not exist (42P01)`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := e.with(t)
			proj := cliBalances
			if tt.from != "" {
				if !strings.Contains(proj, tt.from) {
					t.Fatalf("projection lacks %q", tt.from)
				}
				proj = strings.ReplaceAll(proj, tt.from, tt.to)
			}
			c := e.config(strings.ReplaceAll(tt.name, " ", "_"), tt.source, "", proj)
			r := e.mustRun(2, "check", "-config", c)
			for _, want := range tt.want {
				if !strings.Contains(r.stdout, want) {
					t.Errorf("lacks %q:\n%s", want, r)
				}
			}
			if !strings.Contains(r.stderr, "check found problems") {
				t.Errorf("stderr: %s", r.stderr)
			}
			// -offline checks the configuration and rules only.
			if r := e.mustRun(0, "check", "-config", c, "-offline"); !strings.Contains(r.stdout, "databases not checked") {
				t.Errorf("-offline: %s", r)
			}
		})
	}

	t.Run("compile error", func(t *testing.T) {
		e := e.with(t)
		c := e.config("compile", "", "", strings.Replace(cliBalances, `"data.owner"`, `"data.owner +"`, 1))
		r := e.mustRun(2, "check", "-config", c)
		if !strings.Contains(r.stderr, `"open"`) || !strings.Contains(r.stderr, "set.owner") {
			t.Errorf("compile error: %s", r)
		}
	})

	t.Run("privileges", func(t *testing.T) {
		e := e.with(t)
		// The role logs in with a password: host connections to the test
		// image (like the official one) authenticate with scram-sha-256, and
		// a role without a password cannot pass SASL (28P01). Local mode
		// trusts every connection, so the password is simply not asked.
		role, password := e.prefix+"_app", uniqueID("pw")
		e.exec(fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s'`, role, password))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := e.conn.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, role)); err != nil {
				t.Errorf("drop role: %v", err)
			}
		})
		e.exec(fmt.Sprintf(`GRANT SELECT, INSERT ON balances TO %[1]s; GRANT UPDATE (owner) ON balances TO %[1]s;
GRANT USAGE ON SCHEMA pgscribe TO %[1]s; GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA pgscribe TO %[1]s;
REVOKE UPDATE ON pgscribe.leases FROM %[1]s`, role))
		u, err := url.Parse(e.dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(role, password)
		dsn := u.String()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect as %s: %v", role, err)
		}
		conn.Close(ctx)
		body, _ := os.ReadFile(cfg)
		c := filepath.Join(e.dir, "privileges.toml")
		if err := os.WriteFile(c, []byte(strings.Replace(string(body), e.dsn, dsn, 1)), 0o600); err != nil {
			t.Fatal(err)
		}
		r := e.mustRun(2, "check", "-config", c)
		for _, want := range []string{
			fmt.Sprintf(`balances v1 rule "open": table "balances" column "balance": role %q lacks UPDATE (upsert needs it)`, role),
			fmt.Sprintf(`balances v1 rule "move": table "balances" column "balance": role %q lacks UPDATE (update needs it)`, role),
			fmt.Sprintf(`target: engine table "pgscribe"."leases": role %q lacks UPDATE`, role),
		} {
			if !strings.Contains(r.stdout, want+"\n") {
				t.Errorf("lacks %q:\n%s", want, r)
			}
		}
		if strings.Contains(r.stdout, `column "owner": role`) {
			t.Errorf("the column grant on owner was not honoured:\n%s", r.stdout)
		}
	})
}

// TestCLIReset resets a built projection: without -yes nothing changes;
// with it the slot, cursors and watermark go, read models and dead letters
// stay; after the operator truncates the read model, the next run rebuilds
// it exactly.
func TestCLIReset(t *testing.T) {
	t.Parallel()
	const accounts = 5
	e, cfg := newCLIAccounts(t, "reset", "", cliBalances, accounts, 15)
	p := e.start(cfg)
	e.waitAccounted(p, "balances", 1)
	// The cursors account for every event before the backfill records
	// phase live: a stop in between leaves a backfill to resume.
	waitFor(t, waitLong, "phase live", func() bool {
		return e.queryInt(`SELECT count(*) FROM pgscribe.watermarks WHERE projection = 'balances' AND version = 1 AND phase = 'live'`) == 1
	})
	p.stop()
	slot := e.prefix + "_balances_v1"
	if d := e.balanceDiff(); d != 0 {
		t.Fatalf("first build: %d rows differ from the independent computation", d)
	}
	cursors := e.queryInt(`SELECT count(*) FROM pgscribe.cursors WHERE projection = 'balances' AND version = 1`)
	balances := e.queryInt(`SELECT sum(balance) FROM balances`)
	deadCount := func() int64 {
		return e.queryInt(`SELECT count(*) FROM pgscribe.dead_letters WHERE projection = 'balances' AND version = 1`)
	}
	if cursors != accounts || deadCount() != accounts || !e.slotExists(slot) {
		t.Fatalf("before reset: %d cursors, %d dead letters, slot %v", cursors, deadCount(), e.slotExists(slot))
	}

	r := e.mustRun(2, "reset", "-config", cfg, "-projection", "balances", "-version", "1")
	for _, want := range []string{"reset would change balances v1:", fmt.Sprintf("drop replication slot %q", slot),
		fmt.Sprintf("delete %d stream cursors", accounts), "delete the watermark (phase live", "keep 5 dead letters",
		"read-model tables are never touched"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("dry run lacks %q:\n%s", want, r)
		}
	}
	if !strings.Contains(r.stderr, "-yes") {
		t.Errorf("dry run does not ask for -yes: %s", r.stderr)
	}
	if !e.slotExists(slot) || e.queryInt(`SELECT count(*) FROM pgscribe.cursors`) != cursors ||
		e.queryInt(`SELECT count(*) FROM pgscribe.watermarks`) != 1 {
		t.Fatal("reset without -yes changed something")
	}

	r = e.mustRun(0, "reset", "-config", cfg, "-projection", "balances", "-version", "1", "-yes")
	for _, want := range []string{"reset balances v1:", fmt.Sprintf("dropped replication slot %q", slot),
		fmt.Sprintf("deleted %d stream cursors", accounts), "deleted the watermark", "kept 5 dead letters", "truncate them"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("reset -yes lacks %q:\n%s", want, r)
		}
	}
	if e.slotExists(slot) || e.queryInt(`SELECT count(*) FROM pgscribe.cursors`) != 0 ||
		e.queryInt(`SELECT count(*) FROM pgscribe.watermarks`) != 0 {
		t.Fatal("reset -yes left the slot, cursors or the watermark")
	}
	if e.queryInt(`SELECT count(*) FROM balances`) != accounts || e.queryInt(`SELECT sum(balance) FROM balances`) != balances {
		t.Fatal("reset touched the read model")
	}
	if deadCount() != accounts {
		t.Fatal("reset without -dead-letters deleted dead letters")
	}
	if st := e.status(cfg).Projections[0]; st.State != "stopped" || st.BacklogEvents != e.queryInt("SELECT count(*) FROM events") {
		t.Errorf("status after reset: %+v", st)
	}
	r = e.mustRun(0, "reset", "-config", cfg, "-projection", "balances", "-version", "1", "-yes")
	if !strings.Contains(r.stdout, "nothing to reset") {
		t.Errorf("second reset: %s", r)
	}

	// The operator truncates the read model; more events arrive; the next
	// run rebuilds everything from the events table.
	e.exec(`TRUNCATE balances`)
	e.moves(accounts, 16, 20)
	p = e.start(cfg)
	e.waitAccounted(p, "balances", 1)
	p.stop()
	if d := e.balanceDiff(); d != 0 {
		t.Fatalf("rebuild: %d rows differ from the independent computation", d)
	}
	if n := e.queryInt(`SELECT count(*) FROM balances`); n != accounts {
		t.Fatalf("rebuild: %d rows, want %d", n, accounts)
	}
	// The rebuild dead-lettered the same events again, next to the kept
	// rows; -dead-letters deletes them all.
	if n := deadCount(); n != 2*accounts {
		t.Errorf("after rebuild: %d dead letters, want %d (kept and new)", n, 2*accounts)
	}
	r = e.mustRun(0, "reset", "-config", cfg, "-projection", "balances", "-version", "1", "-yes", "-dead-letters")
	if !strings.Contains(r.stdout, fmt.Sprintf("deleted %d dead letters", 2*accounts)) || deadCount() != 0 {
		t.Errorf("reset -dead-letters: %d left\n%s", deadCount(), r)
	}

	// An old version, no longer configured, can be reset (its slot would
	// retain WAL forever).
	old := e.prefix + "_balances_v7"
	e.exec(`SELECT pg_create_logical_replication_slot($1, 'pgoutput')`, old)
	s := e.status(cfg)
	if len(s.Unconfigured) != 1 || s.Unconfigured[0].Slot != old || s.Unconfigured[0].Projection != "balances" ||
		s.Unconfigured[0].Version != 7 || s.Unconfigured[0].WALRetainedBytes == nil {
		t.Errorf("status does not show the unconfigured slot: %+v", s.Unconfigured)
	}
	if r := e.mustRun(0, "status", "-config", cfg); !strings.Contains(r.stdout, "pgscribe reset -projection balances -version 7 drops it") {
		t.Errorf("status text does not show the unconfigured slot:\n%s", r.stdout)
	}
	r = e.mustRun(0, "reset", "-config", cfg, "-projection", "balances", "-version", "7", "-yes")
	if !strings.Contains(r.stdout, "note: balances v7 is not in the configuration") ||
		!strings.Contains(r.stdout, fmt.Sprintf("dropped replication slot %q", old)) || e.slotExists(old) {
		t.Errorf("unconfigured version: %s", r)
	}
	r = e.mustRun(0, "reset", "-config", cfg, "-projection", "balances", "-version", "7", "-yes")
	if !strings.Contains(r.stdout, "nothing to reset") {
		t.Errorf("unconfigured version, again: %s", r)
	}
	e.mustRun(2, "reset", "-config", cfg, "-projection", "balances")
	e.mustRun(2, "reset", "-config", cfg, "-version", "1")
	e.mustRun(2, "reset", "-config", cfg, "-projection", "balances", "-version", "0")
}

// TestCLIResetRefusesWhileActive: reset neither plans nor acts while an
// engine holds the projection's lock, and works once it stopped.
func TestCLIResetRefusesWhileActive(t *testing.T) {
	t.Parallel()
	e, cfg := newCLIAccounts(t, "active", "", cliBalances, 2, 3)
	p := e.start(cfg)
	e.waitAccounted(p, "balances", 1)
	waitFor(t, time.Minute, "status live", func() bool { return e.status(cfg).Projections[0].State == "live" })
	slot := e.prefix + "_balances_v1"
	for _, yes := range []bool{true, false} {
		args := []string{"reset", "-config", cfg, "-projection", "balances", "-version", "1"}
		if yes {
			args = append(args, "-yes")
		}
		r := e.mustRun(1, args...)
		if !strings.Contains(r.stderr, `reset balances v1: refused: an engine runs this projection version: node "cli-node" (target backend `) ||
			!strings.Contains(r.stderr, "unsafe") {
			t.Errorf("refusal (yes=%v): %s", yes, r)
		}
	}
	p.requireRunning()
	if !e.slotExists(slot) || e.queryInt(`SELECT count(*) FROM pgscribe.cursors`) != 2 {
		t.Fatal("a refused reset changed something")
	}
	// The engine was not disturbed: it still applies new events.
	e.moves(2, 4, 5)
	e.waitAccounted(p, "balances", 1)
	p.stop()
	e.mustRun(0, "reset", "-config", cfg, "-projection", "balances", "-version", "1", "-yes")
	if e.slotExists(slot) {
		t.Error("slot left after reset")
	}
}

// TestCLIUsage: help lists every command and flag; unknown commands,
// unknown flags and stray arguments exit 2. Needs no database.
func TestCLIUsage(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary with -race; skipped with -short")
	}
	t.Parallel()
	bin := pgscribeBinary(t)
	r := runCLI(t, bin, "help")
	if r.code != 0 {
		t.Fatalf("help: %s", r)
	}
	for _, want := range []string{"pgscribe run", "pgscribe migrate", "-events-table", "pgscribe check", "-offline",
		"pgscribe status", "-json", "pgscribe deadletters list", "pgscribe deadletters stats", "-projection NAME",
		"-version N", "-stream ID", "-kind KIND", "-after ID", "-limit N", "pgscribe reset", "-yes", "-dead-letters",
		"pgscribe version", "pgscribe help", "PGSCRIBE_CONFIG", "Exit codes"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("help lacks %q", want)
		}
	}
	if r := runCLI(t, bin, "version"); r.code != 0 || !strings.HasPrefix(r.stdout, "pgscribe ") {
		t.Errorf("version: %s", r)
	}
	if r := runCLI(t, bin, "status", "-h"); r.code != 0 || !strings.Contains(r.stderr, "-json") {
		t.Errorf("status -h: %s", r)
	}
	missing := filepath.Join(t.TempDir(), "missing.toml")
	for _, args := range [][]string{
		{}, {"frobnicate"}, {"status", "-bogus"}, {"run", "-bogus"}, {"migrate", "-bogus"}, {"check", "-bogus"},
		{"check", "extra"}, {"reset", "-bogus"}, {"reset"}, {"reset", "-projection", "x"}, {"deadletters"},
		{"deadletters", "frob"}, {"deadletters", "list", "-bogus"}, {"deadletters", "stats", "-limit", "3"},
		{"version", "-bogus"}, {"check", "-config", missing}, {"status", "-config", missing},
	} {
		if r := runCLI(t, bin, args...); r.code != 2 {
			t.Errorf("pgscribe %s: want exit 2, got %s", strings.Join(args, " "), r)
		}
	}
}
