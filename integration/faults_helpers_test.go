package integration

// Helpers of the fault tests (faults_test.go): a database with the engine
// schema and a projection's read model, the engine as a child process whose
// JSON log and /metrics the tests read, an event writer, and the checks that
// end every fault test — exact read model, dead letters, conservation.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// waitLong bounds every wait for the engine (catch-up, a halt, a log line):
// generous for a loaded 2-core machine, never reached when things work.
const waitLong = 90 * time.Second

// faultProjection is a projection of the shape most fault tests use. For
// every event of its types it appends stream_position to the stream's trail
// (an order-sensitive record: a lost, doubled or reordered event shows) and
// inserts one row keyed by event id into <name>_rows (a double apply would be
// a unique violation). Extra rules (TOML) come after those two.
type faultProjection struct {
	name    string
	onError string   // "" = dead_letter
	types   []string // event types its rules match
	extra   string   // more [[projection.rule]] entries
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
	on, _ := json.Marshal(p.types)
	return fmt.Sprintf(`
[[projection]]
name     = %[1]q
version  = 1
on_error = %[2]q

  [[projection.rule]]
  name = "trail"
  on   = %[3]s
  op   = "sql"
  sql  = "INSERT INTO %[1]s_trail AS t (stream_id, positions) VALUES ($1, ARRAY[$2::bigint]) ON CONFLICT (stream_id) DO UPDATE SET positions = t.positions || EXCLUDED.positions"
  args = ["stream_id", "stream_position"]

  [[projection.rule]]
  name  = "row"
  on    = %[3]s
  op    = "insert"
  table = "%[1]s_rows"
  set   = { event_id = "id", stream_id = "stream_id", stream_position = "stream_position", v = "data.v" }
%[4]s`, p.name, onError, on, p.extra)
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
	e.sameRows(t, p.name+"_rows",
		`SELECT event_id::text, stream_id, stream_position, v FROM `+p.name+`_rows`,
		`SELECT id::text, stream_id, stream_position, (data->>'v')::bigint FROM events WHERE `+keep, p.types)
	e.sameRows(t, p.name+"_trail",
		`SELECT stream_id, positions FROM `+p.name+`_trail`,
		`SELECT stream_id, array_agg(stream_position ORDER BY stream_position) FROM events WHERE `+keep+` GROUP BY stream_id`,
		p.types)
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

	mu   sync.Mutex
	next map[string]int64 // stream id → next stream_position
}

// newFaultEnv creates the database, writes the configuration (header plus
// projections), runs `pgscribe migrate -events-table` and creates the read
// models of projs.
func newFaultEnv(t *testing.T, retryAttempts int, projs ...faultProjection) *faultEnv {
	t.Helper()
	dsn := newDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	var b [4]byte
	_, _ = rand.Read(b[:])
	e := &faultEnv{dsn: dsn, dir: t.TempDir(), slotPrefix: "flt_" + hex.EncodeToString(b[:]), pool: pool,
		next: map[string]int64{}}
	e.config = filepath.Join(e.dir, "pgscribe.toml")
	e.writeConfig(t, retryAttempts, projs...)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pgscribeBinary(t), "migrate", "-config", e.config, "-events-table")
	cmd.Env = append(os.Environ(), "PGSCRIBE_DATABASE_URL="+dsn)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pgscribe migrate: %v\n%s", err, out)
	}
	for _, p := range projs {
		e.exec(t, p.ddl())
	}
	return e
}

// startFault is the start of most fault tests: a fresh environment for
// projs with the extra read-model ddl (if any), the backlog appended, the
// engine started and every projection caught up (by its backfill).
func startFault(t *testing.T, retryAttempts int, ddl string, backlog []faultEvent, projs ...faultProjection) (*faultEnv, *faultProc) {
	t.Helper()
	e := newFaultEnv(t, retryAttempts, projs...)
	if ddl != "" {
		e.exec(t, ddl)
	}
	e.appendEvents(t, backlog...)
	p := e.start(t)
	for _, pr := range projs {
		e.waitAccounted(t, p, pr.name, waitLong)
	}
	return e, p
}

// writeConfig (re)writes the configuration file: small batches and
// intervals so that faults show quickly, metrics on a free port, JSON logs.
func (e *faultEnv) writeConfig(t *testing.T, retryAttempts int, projs ...faultProjection) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, `[source]
slot_prefix = %q

[engine]
parallelism         = 2
batch_size          = 100
backfill_batch_size = 400
lag_interval        = "200ms"
status_interval     = "1s"
standby_poll        = "200ms"
lease_timeout       = "10s"
shutdown_timeout    = "20s"

[retry]
max_attempts = %d
backoff      = "20ms"
max_backoff  = "200ms"

[metrics]
listen = "127.0.0.1:0"

[log]
level  = "info"
format = "json"
`, e.slotPrefix, retryAttempts)
	for _, p := range projs {
		b.WriteString(p.toml())
	}
	if err := os.WriteFile(e.config, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// slot is the replication slot of projection version 1.
func (e *faultEnv) slot(projection string) string { return e.slotPrefix + "_" + projection + "_v1" }

func (e *faultEnv) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scalar runs a one-value query.
func (e *faultEnv) scalar(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
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
	return e.scalar(t, `SELECT coalesce(sum(applied + skipped + dead_lettered), 0)::bigint
FROM pgscribe.cursors WHERE projection = $1 AND version = 1`, projection)
}

func (e *faultEnv) events(t *testing.T) int64 {
	t.Helper()
	return e.scalar(t, `SELECT count(*) FROM events`)
}

// waitAccounted waits until the projection accounts for every event.
func (e *faultEnv) waitAccounted(t *testing.T, p *faultProc, projection string, timeout time.Duration) {
	t.Helper()
	var got, want int64
	deadline := time.Now().Add(timeout)
	for {
		got, want = e.accounted(t, projection), e.events(t)
		if got == want {
			return
		}
		if got > want {
			t.Fatalf("projection %s accounts for %d events, the table has %d", projection, got, want)
		}
		if p != nil && p.exited() {
			t.Fatalf("pgscribe exited while %s had accounted for %d of %d events: %v", projection, got, want, p.exitErr())
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s: projection %s accounts for %d of %d events", timeout, projection, got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sameRows checks that the got and want queries return the same multiset
// of rows; args bind in both.
func (e *faultEnv) sameRows(t *testing.T, what, got, want string, args ...any) {
	t.Helper()
	var missing, extra []string
	sql := `WITH got AS (` + got + `), want AS (` + want + `)
SELECT 'missing', w::text FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM got) w
UNION ALL
SELECT 'extra', g::text FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM want) g`
	rows, err := e.pool.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatalf("compare %s: %v", what, err)
	}
	for rows.Next() {
		var side, row string
		if err := rows.Scan(&side, &row); err != nil {
			t.Fatal(err)
		}
		if side == "missing" {
			missing = append(missing, row)
		} else {
			extra = append(extra, row)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("compare %s: %v", what, err)
	}
	if len(missing)+len(extra) > 0 {
		t.Errorf("%s differs from the events table: %d rows missing %s, %d rows extra %s",
			what, len(missing), firstFew(missing), len(extra), firstFew(extra))
	}
}

func firstFew(rows []string) string {
	if len(rows) > 5 {
		return fmt.Sprint(rows[:5], " …")
	}
	return fmt.Sprint(rows)
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
	e.sameRows(t, projection+" dead letters",
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
func (e *faultEnv) verifyClean(t *testing.T, p *faultProc, projs ...faultProjection) {
	t.Helper()
	for _, pr := range projs {
		e.waitAccounted(t, p, pr.name, waitLong)
	}
	for _, pr := range projs {
		pr.check(t, e)
		e.checkAccounting(t, pr.name)
		e.checkNoDeadLetters(t, pr.name)
		if v := p.metric(t, "pgscribe_halted", projLabels(pr.name)); v != 0 {
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

// faultProc is `pgscribe run` as a child process.
type faultProc struct {
	t    *testing.T
	cmd  *exec.Cmd
	done chan struct{}
	err  error // Wait's result, set before done closes

	mu      sync.Mutex
	lines   []string
	records []map[string]any
	addr    string
}

// start runs `pgscribe run` on the environment's configuration and waits
// for its metrics listener. The process is stopped (SIGKILL if SIGTERM does
// not do) when the test ends; its log is printed if the test failed.
func (e *faultEnv) start(t *testing.T) *faultProc {
	t.Helper()
	cmd := exec.Command(pgscribeBinary(t), "run", "-config", e.config)
	cmd.Env = append(os.Environ(), "PGSCRIBE_DATABASE_URL="+e.dsn)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgscribe: %v", err)
	}
	p := &faultProc{t: t, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			p.addLine(sc.Text())
		}
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		if !p.exited() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(30 * time.Second):
				_ = cmd.Process.Kill()
				<-p.done
			}
		}
		if t.Failed() {
			p.mu.Lock()
			lines := p.lines
			if len(lines) > 300 {
				lines = lines[len(lines)-300:]
			}
			t.Logf("pgscribe log (pid %d, last %d lines):\n%s", cmd.Process.Pid, len(lines), strings.Join(lines, "\n"))
			p.mu.Unlock()
		}
	})
	p.waitLog(t, 60*time.Second, "metrics listener", func(r map[string]any) bool { return r["msg"] == "metrics listening" })
	return p
}

func (p *faultProc) addLine(line string) {
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) != nil {
		rec = map[string]any{"msg": line, "raw": true}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lines = append(p.lines, line)
	p.records = append(p.records, rec)
	if rec["msg"] == "metrics listening" && p.addr == "" {
		p.addr, _ = rec["addr"].(string)
	}
}

func (p *faultProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *faultProc) exitErr() error {
	if !p.exited() {
		return nil
	}
	return p.err
}

// findLog returns the first log record matching match, or nil.
func (p *faultProc) findLog(match func(map[string]any) bool) map[string]any {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.records {
		if match(r) {
			return r
		}
	}
	return nil
}

// countLog counts the log records matching match.
func (p *faultProc) countLog(match func(map[string]any) bool) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, r := range p.records {
		if match(r) {
			n++
		}
	}
	return n
}

// waitLog waits for a log record matching match and returns it.
func (p *faultProc) waitLog(t *testing.T, timeout time.Duration, what string, match func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if r := p.findLog(match); r != nil {
			return r
		}
		if p.exited() {
			t.Fatalf("pgscribe exited (%v) before logging %s", p.err, what)
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for pgscribe to log %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// logMsg matches records by message and, optionally, projection.
func logMsg(msgPrefix, projection string) func(map[string]any) bool {
	return func(r map[string]any) bool {
		m, _ := r["msg"].(string)
		return strings.HasPrefix(m, msgPrefix) && (projection == "" || r["projection"] == projection)
	}
}

// stop sends SIGTERM and requires a clean exit (status 0).
func (p *faultProc) stop(t *testing.T) {
	t.Helper()
	if p.exited() {
		t.Fatalf("pgscribe had already exited: %v", p.err)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(40 * time.Second):
		t.Fatal("pgscribe did not exit within 40s of SIGTERM")
	}
	if p.err != nil {
		t.Fatalf("pgscribe exited with %v after SIGTERM, want status 0", p.err)
	}
}

func (p *faultProc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	p.mu.Lock()
	addr := p.addr
	p.mu.Unlock()
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(body)
}

// metric returns the value of the sample of name whose labels include
// labels (in Prometheus text format); -1 when there is none.
func (p *faultProc) metric(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	_, body := p.get(t, "/metrics")
	return metricValue(body, name, labels)
}

func metricValue(body, name string, labels map[string]string) float64 {
	sc := bufio.NewScanner(bytes.NewReader([]byte(body)))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) || strings.HasPrefix(line, "#") {
			continue
		}
		rest := line[len(name):]
		var set string
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			set, rest = rest[1:end], rest[end+1:]
		}
		if !strings.HasPrefix(rest, " ") {
			continue // a longer metric name
		}
		ok := true
		for k, v := range labels {
			if !strings.Contains(","+set+",", ","+k+"="+strconv.Quote(v)+",") {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			continue
		}
		return f
	}
	return -1
}

// projLabels are the labels of projection version 1.
func projLabels(projection string, more ...string) map[string]string {
	m := map[string]string{"projection": projection, "version": "1"}
	for i := 0; i+1 < len(more); i += 2 {
		m[more[i]] = more[i+1]
	}
	return m
}

// waitHalted waits for the projection's halt log record, which must name
// sqlstate ("" for a halt without one), and checks that the halt is
// visible: pgscribe_halted 1 and /healthz 503 naming it.
func (p *faultProc) waitHalted(t *testing.T, projection, sqlstate string) map[string]any {
	t.Helper()
	rec := p.waitLog(t, waitLong, "the halt of "+projection, logMsg("projection halted", projection))
	if got := logString(rec, "sqlstate"); got != sqlstate {
		t.Errorf("halt log sqlstate = %q, want %q: %v", got, sqlstate, rec)
	}
	if v := p.metric(t, "pgscribe_halted", projLabels(projection)); v != 1 {
		t.Errorf("pgscribe_halted{projection=%q} = %v, want 1", projection, v)
	}
	code, body := p.get(t, "/healthz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, `"halted"`) {
		t.Errorf("/healthz = %d %s, want 503 with the halted projection", code, body)
	}
	return rec
}

// logString is a record's attribute as text ("" when absent).
func logString(r map[string]any, key string) string {
	switch v := r[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
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
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		if err == nil {
			var dropped bool
			err = e.pool.QueryRow(ctx, `SELECT count(pg_drop_replication_slot(slot_name)) = 1
FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&dropped)
			if err == nil && dropped {
				return
			}
			if err == nil {
				t.Fatalf("slot %s does not exist", slot)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("drop slot %s: %v", slot, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
