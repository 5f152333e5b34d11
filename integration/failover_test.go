package integration

// Active/standby across nodes: real pgscribe processes on one configuration
// (distinct [engine] node names, one slot prefix per test), each connecting
// as its own least-privilege role so that every read-model row says which
// node committed it. Faults are real: kill -9, SIGSTOP/SIGCONT, a TCP proxy
// that cuts or blackholes one node's connections, SIGTERM.
//
// Oracles, for every projection version:
//   - the read model equals an independent computation from the events
//     table (one entry per Deposited event, keyed by event id, and per
//     account the sum and count of its deposits);
//   - conservation: count(events) = sum(applied + skipped + dead_lettered)
//     over the cursors, with applied and skipped matching the event types,
//     and each stream's cursor at its last stream_position;
//   - no dead letters. A double apply cannot hide: the entry insert would
//     fail with a unique violation (a dead letter) or the balance would be
//     off;
//   - fencing: a node that lost the projection commits no row after the
//     takeover's epoch bump was seen.
//
// A test may add a projection with an oracle of its own (addProjection, a
// coreProjection such as the W6 shape): the writer then also appends the
// rig's workload, and drain checks it with verifyProjection.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/internal/pgtest"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/migrations"
)

// Engine timings of the process tests: short, so that a takeover after a
// freeze (lease_timeout + standby_poll) costs seconds, not a minute.
const (
	foStandbyPoll  = time.Second
	foLeaseTimeout = 5 * time.Second
	// foSlack absorbs process start-up, -race and a loaded 2-core machine
	// on top of what the design promises.
	foSlack = 2 * time.Second
)

// foCluster is one test database with its schema, roles and nodes.
type foCluster struct {
	t           *testing.T
	ctx         context.Context
	dsn         string // superuser DSN of the test database
	admin       *pgxpool.Pool
	bin         string
	dir         string
	id          string // unique per test: slot prefix, role names
	group       string // role holding the privileges the nodes need
	projections []string
	// extra are projections with their own rules and oracle (addProjection),
	// run beside the failover projections; with any, the writer also
	// appends the rig's workload (workloadEvent) to streams w6-*.
	extra []coreProjection

	mu    sync.Mutex
	nodes []*foNode
	roles []string
}

// foOptions are per-node settings on top of the shared configuration.
type foOptions struct {
	maxActive       int
	ownGroups       bool // each projection in a group of its own (group = its name)
	shutdownTimeout time.Duration
	proxy           *pgtest.Proxy // connect through it
}

// newFailoverCluster migrates a fresh database (events table, publication,
// engine schema), creates the read models of projections and the role the
// nodes share privileges through.
func newFailoverCluster(t *testing.T, projections ...string) *foCluster {
	t.Helper()
	dsn := newDatabase(t)
	bin := pgscribeBinary(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &foCluster{t: t, ctx: ctx, dsn: dsn, bin: bin, dir: t.TempDir(), id: uniqueID("fo"), projections: projections}
	c.group = c.id + "_grp"

	// The schema, as an operator would create it: `pgscribe migrate` with
	// the owner's credentials.
	cfg := c.writeConfig("migrate", dsn, foOptions{})
	migrate(t, cfg)
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	c.admin = pool
	// Least privilege (docs/operations.md): the nodes read the events,
	// write the engine tables and the read models, and nothing else.
	c.exec(fmt.Sprintf(`CREATE ROLE %s NOLOGIN`, c.group))
	t.Cleanup(c.dropRoles)
	c.exec(fmt.Sprintf(`GRANT USAGE ON SCHEMA pgscribe TO %[1]s;
		GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA pgscribe TO %[1]s;
		GRANT USAGE ON ALL SEQUENCES IN SCHEMA pgscribe TO %[1]s;
		GRANT SELECT ON events TO %[1]s`, c.group))
	for _, p := range projections {
		c.exec(fmt.Sprintf(`
			CREATE TABLE %[1]s_entries (
				event_id     uuid   PRIMARY KEY,
				account      text   NOT NULL,
				amount       bigint NOT NULL,
				committed_by name   NOT NULL DEFAULT current_user
			);
			CREATE TABLE %[1]s_balances (
				account text   PRIMARY KEY,
				balance bigint NOT NULL,
				events  bigint NOT NULL
			);
			GRANT SELECT, INSERT, UPDATE, DELETE ON %[1]s_entries, %[1]s_balances TO %[2]s`, p, c.group))
	}
	return c
}

// addProjection creates p's read model, lets the nodes write it and runs p
// on every node created from now on; drain checks its oracle.
func (c *foCluster) addProjection(p coreProjection) {
	c.t.Helper()
	c.exec(p.ddl)
	tables := map[string]bool{}
	for _, r := range p.rules {
		if r.table != "" && !tables[r.table] {
			tables[r.table] = true
			c.exec(fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s", pgx.Identifier{r.table}.Sanitize(), c.group))
		}
	}
	c.extra = append(c.extra, p)
}

func (c *foCluster) exec(sql string, args ...any) {
	c.t.Helper()
	if _, err := c.admin.Exec(c.ctx, sql, args...); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
}

func (c *foCluster) queryRow(sql string, args []any, dest ...any) {
	c.t.Helper()
	if err := c.admin.QueryRow(c.ctx, sql, args...).Scan(dest...); err != nil {
		c.t.Fatalf("%s: %v", sql, err)
	}
}

// dropRoles removes the cluster-wide roles (the database goes with its
// own cleanup). Nodes are stopped before: their cleanups run first.
func (c *foCluster) dropRoles() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.mu.Lock()
	roles := append([]string{c.group}, c.roles...)
	c.mu.Unlock()
	if _, err := c.admin.Exec(ctx, "DROP OWNED BY "+strings.Join(roles, ", ")); err != nil {
		c.t.Logf("drop owned: %v", err)
	}
	for _, r := range roles {
		if _, err := c.admin.Exec(ctx, "DROP ROLE IF EXISTS "+r); err != nil {
			c.t.Logf("drop role %s: %v", r, err)
		}
	}
}

// role creates the login role of a node: a member of the group, with the
// REPLICATION attribute (not inherited) and pg_signal_backend, which lets a
// new active end the walsender a dead node left on the slot when nodes use
// different roles.
func (c *foCluster) role(node string) (name, password string) {
	c.t.Helper()
	name, password = c.id+"_"+node, uniqueID("pw")
	c.exec(fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s' IN ROLE %s, pg_signal_backend`, name, password, c.group))
	c.mu.Lock()
	c.roles = append(c.roles, name)
	c.mu.Unlock()
	return name, password
}

// writeConfig writes the configuration node runs with; only [engine] node,
// the URL and the options differ between nodes.
func (c *foCluster) writeConfig(node, dsn string, o foOptions) string {
	c.t.Helper()
	shutdown := o.shutdownTimeout
	if shutdown == 0 {
		shutdown = 10 * time.Second
	}
	cfg := newConfig(dsn, c.id).with("engine", map[string]string{
		"node": fmt.Sprintf("%q", node), "parallelism": "2", "batch_size": "50", "batch_timeout": `"10ms"`,
		"standby_poll": fmt.Sprintf("%q", foStandbyPoll), "lease_timeout": fmt.Sprintf("%q", foLeaseTimeout),
		"lag_interval": `"200ms"`, "status_interval": `"1s"`, "shutdown_timeout": fmt.Sprintf("%q", shutdown),
		"max_active_projections": fmt.Sprint(o.maxActive),
	}).with("retry", map[string]string{"backoff": `"50ms"`, "max_backoff": `"500ms"`})
	for _, p := range c.projections {
		var keys []string
		if o.ownGroups {
			keys = []string{fmt.Sprintf("group = %q", p)}
		}
		cfg.add(projectionKeysTOML(p, 1, "", keys,
			rule{name: "entry", on: "Deposited", op: "insert", table: p + "_entries",
				set: `event_id = "id", account = "stream_id", amount = "data.amount"`},
			rule{name: "balance", on: "Deposited", op: "upsert", table: p + "_balances",
				key: `account = "stream_id"`, inc: `balance = "data.amount", events = "1"`}))
	}
	for _, p := range c.extra {
		cfg.add(p.toml())
	}
	return cfg.write(c.t, filepath.Join(c.dir, node+".toml"))
}

// foNode is one pgscribe process (restartable), connecting as its role.
type foNode struct {
	*node
	c    *foCluster
	role string
}

// node prepares (does not start) a node with its own role and config.
func (c *foCluster) node(name string, o foOptions) *foNode {
	c.t.Helper()
	role, pw := c.role(name)
	u, err := url.Parse(c.dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	u.User = url.UserPassword(role, pw)
	dsn := u.String()
	if o.proxy != nil {
		if dsn, err = o.proxy.DSN(dsn); err != nil {
			c.t.Fatal(err)
		}
	}
	n := &foNode{node: newNode(c.t, name, c.writeConfig(name, dsn, o)), c: c, role: role}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	return n
}

// foHealth is one projection in the /readyz and /healthz detail.
type foHealth struct {
	Projection string `json:"projection"`
	Version    int64  `json:"version"`
	State      string `json:"state"`
	Ready      bool   `json:"ready"`
	Error      string `json:"error"`
}

// probe GETs /healthz or /readyz; code 0 when the node does not answer.
func (n *foNode) probe(path string) (int, []foHealth) {
	code, body, err := n.tryGet(path)
	if err != nil {
		return 0, nil
	}
	var hs []foHealth
	_ = json.Unmarshal([]byte(body), &hs)
	return code, hs
}

// state is the node's state for projection, "" when it does not answer.
func (n *foNode) state(projection string) string {
	_, hs := n.probe("/readyz")
	for _, h := range hs {
		if h.Projection == projection {
			return h.State
		}
	}
	return ""
}

func (n *foNode) waitState(projection, state string, timeout time.Duration) {
	n.t.Helper()
	waitFor(n.t, timeout, fmt.Sprintf("%s to be %s for %s", n.name, state, projection), func() bool {
		return n.state(projection) == state
	})
}

// foLease is the lease row of a projection version.
type foLease struct {
	node     string
	epoch    int64
	acquired time.Time
}

func (c *foCluster) lease(projection string) foLease {
	c.t.Helper()
	var l foLease
	err := c.admin.QueryRow(c.ctx, `SELECT node, epoch, acquired_at FROM pgscribe.leases WHERE projection = $1 AND version = 1`,
		projection).Scan(&l.node, &l.epoch, &l.acquired)
	if errors.Is(err, pgx.ErrNoRows) {
		return foLease{}
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// waitTakeover waits until a node other than from bumps the epoch past
// before's and returns the new lease.
func (c *foCluster) waitTakeover(projection string, before foLease, from string, timeout time.Duration) foLease {
	c.t.Helper()
	var l foLease
	waitFor(c.t, timeout, "a takeover of "+projection+" from "+from, func() bool {
		l = c.lease(projection)
		return l.epoch > before.epoch && l.node != from
	})
	return l
}

// committedBy counts the entries of projection that node's role committed.
func (c *foCluster) committedBy(projection string, n *foNode) int64 {
	c.t.Helper()
	var k int64
	c.queryRow(fmt.Sprintf(`SELECT count(*) FROM %s_entries WHERE committed_by = $1`, projection), []any{n.role}, &k)
	return k
}

// waitProgress waits until node has committed more than it had.
func (c *foCluster) waitProgress(projection string, n *foNode, timeout time.Duration) {
	c.t.Helper()
	before := c.committedBy(projection, n)
	waitFor(c.t, timeout, n.name+" to apply events of "+projection, func() bool {
		return c.committedBy(projection, n) > before
	})
}

// accounted sums the cursors' outcome counts of projection.
func (c *foCluster) accounted(projection string) int64 {
	c.t.Helper()
	var k int64
	c.queryRow(`SELECT coalesce(sum(applied + skipped + dead_lettered), 0)::bigint FROM pgscribe.cursors
		WHERE projection = $1 AND version = 1`, []any{projection}, &k)
	return k
}

func (c *foCluster) eventCount() int64 {
	c.t.Helper()
	var k int64
	c.queryRow(`SELECT count(*) FROM events`, nil, &k)
	return k
}

// waitCaughtUp waits until every event is accounted for in projection.
func (c *foCluster) waitCaughtUp(projection string, timeout time.Duration) {
	c.t.Helper()
	want := c.eventCount()
	waitFor(c.t, timeout, fmt.Sprintf("%s to account for %d events", projection, want), func() bool {
		return c.accounted(projection) >= want
	})
}

// verify checks the oracles of projection against the events table.
func (c *foCluster) verify(projection string) {
	c.t.Helper()
	var events, deposits, notes int64
	c.queryRow(`SELECT count(*), count(*) FILTER (WHERE type = 'Deposited'), count(*) FILTER (WHERE type = 'Noted') FROM events`,
		nil, &events, &deposits, &notes)
	if events == 0 || deposits == 0 || notes == 0 {
		c.t.Fatalf("workload too thin: %d events, %d deposits, %d notes", events, deposits, notes)
	}

	var applied, skipped, dead, streamsOff int64
	c.queryRow(`SELECT coalesce(sum(applied), 0)::bigint, coalesce(sum(skipped), 0)::bigint, coalesce(sum(dead_lettered), 0)::bigint
		FROM pgscribe.cursors WHERE projection = $1 AND version = 1`, []any{projection}, &applied, &skipped, &dead)
	// Every event but a deposit is skipped: Noted, and the workload of the
	// extra projections' streams.
	if applied+skipped+dead != events || applied != deposits || skipped != events-deposits || dead != 0 {
		c.t.Errorf("%s: conservation: %d events (%d deposits, %d notes), cursors say applied %d + skipped %d + dead-lettered %d",
			projection, events, deposits, notes, applied, skipped, dead)
	}
	c.queryRow(`SELECT count(*) FROM (SELECT stream_id, max(stream_position) AS p FROM events GROUP BY stream_id) e
		FULL JOIN (SELECT stream_id, stream_position AS p FROM pgscribe.cursors WHERE projection = $1 AND version = 1) k USING (stream_id)
		WHERE e.p IS DISTINCT FROM k.p`, []any{projection}, &streamsOff)
	if streamsOff != 0 {
		c.t.Errorf("%s: %d streams whose cursor is not at their last event", projection, streamsOff)
	}

	var letters int64
	c.queryRow(`SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1`, []any{projection}, &letters)
	if letters != 0 {
		var kind, msg string
		c.queryRow(`SELECT error_kind, error_message FROM pgscribe.dead_letters WHERE projection = $1 ORDER BY id LIMIT 1`,
			[]any{projection}, &kind, &msg)
		c.t.Errorf("%s: %d dead letters, first: %s: %s", projection, letters, kind, msg)
	}

	// Entries: exactly one per deposit, with its account and amount.
	var entries, matching int64
	c.queryRow(fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s_entries),
		(SELECT count(*) FROM %[1]s_entries x JOIN events e ON e.id = x.event_id
			AND e.type = 'Deposited' AND e.stream_id = x.account AND (e.data->>'amount')::bigint = x.amount)`, projection),
		nil, &entries, &matching)
	if entries != deposits || matching != deposits {
		c.t.Errorf("%s: %d entries, %d matching an event, want %d", projection, entries, matching, deposits)
	}
	// Balances: per account the sum and count of its deposits.
	var wrong int64
	c.queryRow(fmt.Sprintf(`SELECT count(*) FROM (
			SELECT stream_id AS account, sum((data->>'amount')::bigint) AS balance, count(*) AS events
			FROM events WHERE type = 'Deposited' GROUP BY stream_id) e
		FULL JOIN %s_balances b USING (account)
		WHERE e.balance IS DISTINCT FROM b.balance OR e.events IS DISTINCT FROM b.events`, projection), nil, &wrong)
	if wrong != 0 {
		c.t.Errorf("%s: %d accounts whose balance differs from the events", projection, wrong)
	}
}

// drain stops the load, waits until each projection has accounted for
// every event, and checks the oracles.
func (c *foCluster) drain(w *foWriter, projections ...string) {
	c.t.Helper()
	w.stop(c.t)
	for _, p := range projections {
		c.waitCaughtUp(p, 60*time.Second)
		c.verify(p)
	}
	for _, p := range c.extra {
		c.waitCaughtUp(p.name, 60*time.Second)
		verifyProjection(c.t, c.admin, p)
	}
}

// holdEntries locks projection's entries table against writes, so that the
// active's next batch blocks inside its transaction, after the fence check.
// release commits the lock away (also done at the end of the test).
func (c *foCluster) holdEntries(projection string) (release func()) {
	c.t.Helper()
	return c.holdTable(projection+"_entries", "EXCLUSIVE")
}

// holdTable locks table in mode until release (also done at the end of
// the test).
func (c *foCluster) holdTable(table, mode string) (release func()) {
	c.t.Helper()
	tx, err := c.admin.Begin(c.ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	release = func() { _ = tx.Commit(context.WithoutCancel(c.ctx)) }
	c.t.Cleanup(release)
	if _, err := tx.Exec(c.ctx, fmt.Sprintf("LOCK TABLE %s IN %s MODE", table, mode)); err != nil {
		c.t.Fatal(err)
	}
	return release
}

// foWriter appends events under live load: several writers, each owning
// its streams (expected-version appends), transactions of 1 to 4 events.
type foWriter struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	n       atomic.Int64
	mu      sync.Mutex
	err     error
	workers int32
	paused  atomic.Bool
	parked  atomic.Int32 // workers waiting while paused
	// workload: every other event goes to a stream w6-<worker>-<n> of the
	// rig's workload (opened at position 1, then deposits, withdrawals,
	// notes, closings), for the extra projections.
	workload bool
}

func (c *foCluster) startWriter(workers, streams int) *foWriter {
	ctx, cancel := context.WithCancel(c.ctx)
	w := &foWriter{cancel: cancel, workers: int32(workers), workload: len(c.extra) > 0}
	for i := range workers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			if err := w.run(ctx, c.admin, i, streams); err != nil && ctx.Err() == nil {
				w.mu.Lock()
				w.err = err
				w.mu.Unlock()
			}
		}()
	}
	c.t.Cleanup(func() { w.cancel(); w.wg.Wait() })
	return w
}

func (w *foWriter) run(ctx context.Context, pool *pgxpool.Pool, worker, streams int) error {
	pos, wpos := make([]int64, streams), make([]int64, streams)
	seq := 0
	for n := 0; n < 20000 && ctx.Err() == nil; {
		if w.paused.Load() {
			w.parked.Add(1)
			for w.paused.Load() && ctx.Err() == nil {
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Millisecond):
				}
			}
			w.parked.Add(-1)
			continue
		}
		k := 1 + mrand.IntN(4)
		var sql strings.Builder
		sql.WriteString("INSERT INTO events (stream_id, stream_position, type, data) VALUES ")
		args := make([]any, 0, 4*k)
		next, wnext := append([]int64(nil), pos...), append([]int64(nil), wpos...)
		for j := range k {
			s := mrand.IntN(streams)
			next[s]++
			stream, p := fmt.Sprintf("acct-%d-%d", worker, s), next[s]
			typ, data := "Deposited", fmt.Sprintf(`{"amount": %d}`, 1+mrand.IntN(100))
			if seq++; seq%10 == 0 { // skipped by the rules
				typ, data = "Noted", `{"note": "hello"}`
			} else if w.workload && seq%2 == 0 {
				next[s]--
				wnext[s]++
				stream, p = fmt.Sprintf("w6-%d-%d", worker, s), wnext[s]
				var b []byte
				typ, b = workloadEvent(stream, p, mrand.IntN(100), 1+mrand.IntN(100))
				data = string(b)
			}
			if j > 0 {
				sql.WriteString(", ")
			}
			fmt.Fprintf(&sql, "($%d, $%d, $%d, $%d)", 4*j+1, 4*j+2, 4*j+3, 4*j+4)
			args = append(args, stream, p, typ, data)
		}
		// The insert is never cut short by stop: one abandoned mid-flight
		// can still commit after stop returned and the test counted the
		// table, and verify then finds events nothing accounted for.
		ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		_, err := pool.Exec(ictx, sql.String(), args...)
		cancel()
		if err != nil {
			return err
		}
		pos, wpos = next, wnext
		n += k
		w.n.Add(int64(k))
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// pause stops appending until resume, once no append is in flight.
func (w *foWriter) pause(t *testing.T) {
	t.Helper()
	w.paused.Store(true)
	waitFor(t, 10*time.Second, "the writer to pause", func() bool { return w.parked.Load() == w.workers })
}

func (w *foWriter) resume() { w.paused.Store(false) }

// stop ends the load and fails the test if a write failed.
func (w *foWriter) stop(t *testing.T) {
	t.Helper()
	w.cancel()
	w.wg.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		t.Fatalf("event writer: %v", w.err)
	}
	t.Logf("writer appended %d events", w.n.Load())
}

// waitWritten waits until the writer appended at least k more events.
func (w *foWriter) waitWritten(t *testing.T, k int64) {
	t.Helper()
	target := w.n.Load() + k
	waitFor(t, 30*time.Second, fmt.Sprintf("%d more events", k), func() bool { return w.n.Load() >= target })
}

func foSince(t0, t1 time.Time) time.Duration { return t1.Sub(t0).Round(time.Millisecond) }

// startPair starts a (active) then b (standby) for projection.
func startPair(t *testing.T, projection string, a, b *foNode) {
	t.Helper()
	a.start()
	a.waitState(projection, "live", 60*time.Second)
	b.start()
	b.waitState(projection, "standby", 30*time.Second)
}

// livePair starts n1 and n2 on p under live load: n1 active and
// applying, n2 standing by.
func (c *foCluster) livePair(p string) (n1, n2 *foNode, w *foWriter) {
	c.t.Helper()
	n1, n2 = c.node("n1", foOptions{}), c.node("n2", foOptions{})
	w = c.startWriter(2, 40)
	startPair(c.t, p, n1, n2)
	c.waitProgress(p, n1, 30*time.Second)
	return n1, n2, w
}

// TestFailoverKill9 kills the active node under live load: the standby
// takes over within standby_poll (+1 s target) and the result is exact,
// also for the W6 shape beside it (with pgscribe verify).
func TestFailoverKill9(t *testing.T) {
	const p = "kill9"
	c := newFailoverCluster(t, p)
	// Beside it, the bench's W6 shape (rule and integrity poison, shared
	// rows, deletes) must end exact across the takeover too.
	c.addProjection(w6Projection())
	n1, n2, w := c.livePair(p)
	w.waitWritten(t, 300)

	before := c.lease(p)
	t0 := time.Now()
	n1.signal(syscall.SIGKILL)
	l := c.waitTakeover(p, before, "n1", foStandbyPoll+foSlack+5*time.Second)
	took := foSince(t0, l.acquired)
	c.waitProgress(p, n2, 30*time.Second)
	applying := foSince(t0, time.Now())
	t.Logf("kill -9: takeover (epoch %d → %d on %s) %s after the kill, applying again within %s (standby_poll %s)",
		before.epoch, l.epoch, l.node, took, applying, foStandbyPoll)
	if took > foStandbyPoll+time.Second+foSlack {
		t.Errorf("takeover took %s, want within standby_poll + 1s (%s, slack %s)", took, foStandbyPoll+time.Second, foSlack)
	}
	n1.wait(10 * time.Second)

	w.waitWritten(t, 300)
	c.drain(w, p)
	requireW6Poison(t, c.admin)
	requireNoDrift(t, c.bin, c.writeConfig("verify", c.dsn, foOptions{}), "w6", 1)
}

// TestFailoverFrozenActive freezes (SIGSTOP) the active node while one of
// its batches has passed the fence check and not committed: the worst
// case, a transaction holding the lease row FOR SHARE from a process that
// cannot act. The server ends the lock session (idle_session_timeout) and
// the frozen transaction (idle_in_transaction_session_timeout), the
// standby takes over within lease_timeout + standby_poll, and the woken
// node commits nothing more.
func TestFailoverFrozenActive(t *testing.T) {
	const p = "frozen"
	c := newFailoverCluster(t, p)
	n1, n2, w := c.livePair(p)

	// Hold a batch of n1 inside its transaction. A batch whose streams'
	// cursors n1 has cached is one pipeline ending in COMMIT, which the
	// server completes even with the client frozen; a batch with a stream
	// new to n1 reads that cursor in a first round trip, after the fence
	// check, and sends the rest only when the answer comes. With the
	// cursors table locked, such a batch waits in its first round trip,
	// holding the lease row FOR SHARE.
	// The writer pauses and n1 catches up first, so that no batch of a
	// cached stream waits on the lock too and holds up the partitions.
	w.pause(t)
	c.waitCaughtUp(p, 30*time.Second)
	release := c.holdTable("pgscribe.cursors", "ACCESS EXCLUSIVE")
	if _, err := c.admin.Exec(c.ctx, `INSERT INTO events (stream_id, stream_position, type, data)
		VALUES ('fresh-frozen', 1, 'Deposited', '{"amount": 1}')`); err != nil {
		t.Fatal(err)
	}
	backends := func(state string) int {
		var k int
		c.queryRow(`SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND application_name = 'pgscribe' AND backend_xid IS NOT NULL
			AND (state = $2 OR $2 = 'lock wait' AND wait_event_type = 'Lock' AND query LIKE '%CROSS JOIN LATERAL%')`, []any{n1.role, state}, &k)
		return k
	}
	waitFor(t, 30*time.Second, "a batch of n1 to wait on the cursors lock in its first round trip", func() bool { return backends("lock wait") > 0 })

	before := c.lease(p)
	t0 := time.Now()
	n1.signal(syscall.SIGSTOP)
	release()
	w.resume()
	// The batch's first round trip completes; the rest never comes.
	waitFor(t, 10*time.Second, "n1's batch to sit idle in transaction", func() bool { return backends("idle in transaction") > 0 })

	l := c.waitTakeover(p, before, "n1", foLeaseTimeout+foStandbyPoll+foSlack+5*time.Second)
	took := foSince(t0, l.acquired)
	frozenRows := c.committedBy(p, n1)
	c.waitProgress(p, n2, 30*time.Second)
	t.Logf("SIGSTOP: takeover (epoch %d → %d on %s) %s after the freeze (lease_timeout %s, standby_poll %s)",
		before.epoch, l.epoch, l.node, took, foLeaseTimeout, foStandbyPoll)
	if took > foLeaseTimeout+foStandbyPoll+foSlack {
		t.Errorf("takeover took %s, want within lease_timeout + standby_poll (%s, slack %s)", took, foLeaseTimeout+foStandbyPoll, foSlack)
	}
	if k := backends("idle in transaction"); k != 0 {
		t.Errorf("%d frozen transactions of n1 survived the takeover", k)
	}

	n1.signal(syscall.SIGCONT)
	waitFor(t, 30*time.Second, "n1 to notice it lost the projection", func() bool {
		return n1.logged("lost ownership") || n1.logged("lock session lost")
	})
	n1.waitState(p, "standby", 30*time.Second)
	w.waitWritten(t, 300)
	w.stop(t)
	c.waitCaughtUp(p, 60*time.Second)
	if k := c.committedBy(p, n1); k != frozenRows {
		t.Errorf("n1 committed %d entries after it was fenced", k-frozenRows)
	}
	c.verify(p)
}

// TestFailoverNetworkFaults runs each node through its own TCP proxy.
// Cutting the active's network (connections closed) hands over within
// standby_poll; blackholing it (connections silent, as in a partition)
// within lease_timeout + standby_poll. After each fault heals the old
// active stands by and has committed nothing since the takeover.
func TestFailoverNetworkFaults(t *testing.T) {
	const p = "netfault"
	c := newFailoverCluster(t, p)
	proxy := func() *pgtest.Proxy {
		pr, err := pgtest.NewProxy(srv().HostPort())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pr.Close() })
		return pr
	}
	p1, p2 := proxy(), proxy()
	n1, n2 := c.node("n1", foOptions{proxy: p1}), c.node("n2", foOptions{proxy: p2})
	w := c.startWriter(2, 40)
	startPair(t, p, n1, n2)
	c.waitProgress(p, n1, 30*time.Second)

	fault := func(name string, from, to *foNode, px *pgtest.Proxy, apply func(), within time.Duration) {
		t.Helper()
		before := c.lease(p)
		t0 := time.Now()
		apply()
		l := c.waitTakeover(p, before, from.name, within+5*time.Second)
		took := foSince(t0, l.acquired)
		isolatedRows := c.committedBy(p, from)
		c.waitProgress(p, to, 30*time.Second)
		t.Logf("%s: takeover (epoch %d → %d on %s) %s after the fault", name, before.epoch, l.epoch, l.node, took)
		if took > within {
			t.Errorf("%s: takeover took %s, want within %s (slack included)", name, took, within)
		}
		px.Restore()
		from.waitState(p, "standby", 30*time.Second)
		w.waitWritten(t, 200)
		if k := c.committedBy(p, from); k != isolatedRows {
			t.Errorf("%s: %s committed %d entries after the takeover", name, from.name, k-isolatedRows)
		}
	}
	fault("cut", n1, n2, p1, p1.Cut, foStandbyPoll+time.Second+foSlack)
	fault("blackhole", n2, n1, p2, p2.Blackhole, foLeaseTimeout+foStandbyPoll+foSlack)

	c.drain(w, p)
}

// TestFailoverRollingRestart restarts three nodes one at a time under load
// with SIGTERM: each exits 0 well within shutdown_timeout, releasing its
// lock, so a standby takes over within standby_poll (not lease_timeout),
// and the result is exact.
func TestFailoverRollingRestart(t *testing.T) {
	const p = "rolling"
	c := newFailoverCluster(t, p)
	nodes := []*foNode{c.node("n1", foOptions{}), c.node("n2", foOptions{}), c.node("n3", foOptions{})}
	w := c.startWriter(2, 40)
	nodes[0].start()
	nodes[0].waitState(p, "live", 60*time.Second)
	for _, n := range nodes[1:] {
		n.start()
		n.waitState(p, "standby", 30*time.Second)
	}
	for round := range 2 {
		// n1 starts active: begin each round elsewhere so that standbys are
		// stopped too, not only whoever is active.
		for i := range nodes {
			n := nodes[(round+1+i)%len(nodes)]
			wasActive := n.state(p) == "live"
			before := c.lease(p)
			mark := n.mark()
			t0 := time.Now()
			n.signal(syscall.SIGTERM)
			code := n.wait(10*time.Second + foSlack)
			stopped := foSince(t0, time.Now())
			if code != 0 {
				t.Errorf("%s exited %d after SIGTERM, want 0", n.name, code)
			}
			if !n.loggedAfter(mark, "all projections stopped") {
				t.Errorf("%s did not stop in order", n.name)
			}
			msg := fmt.Sprintf("round %d: %s (active %v) stopped in %s", round, n.name, wasActive, stopped)
			if wasActive {
				l := c.waitTakeover(p, before, n.name, foStandbyPoll+foSlack+5*time.Second)
				took := foSince(t0, l.acquired)
				msg += fmt.Sprintf(", %s took over %s after SIGTERM", l.node, took)
				if took > foStandbyPoll+time.Second+foSlack {
					t.Errorf("takeover after a graceful stop took %s: the lock was not released", took)
				}
			}
			t.Log(msg)
			w.waitWritten(t, 100)
			n.start()
			n.waitState(p, "standby", 30*time.Second)
		}
	}
	c.drain(w, p)
}

// TestFailoverSpread: two nodes, two projections in groups of their own,
// max_active_projections = 1: each node runs one group and stands by for
// the other.
func TestFailoverSpread(t *testing.T) {
	c := newFailoverCluster(t, "spread_a", "spread_b")
	n1, n2 := c.node("n1", foOptions{maxActive: 1, ownGroups: true}), c.node("n2", foOptions{maxActive: 1, ownGroups: true})
	w := c.startWriter(2, 40)
	n1.start()
	var first string
	waitFor(t, 60*time.Second, "n1 to run one projection", func() bool {
		for _, p := range c.projections {
			if n1.state(p) == "live" {
				first = p
				return true
			}
		}
		return false
	})
	n2.start()
	second := c.projections[0]
	if second == first {
		second = c.projections[1]
	}
	// n2 may first poll the projection n1 holds; within a few polls it
	// must run the other one. If it never does, n2 keeps its only slot
	// while polling the lock n1 holds, and never tries the free projection.
	waitFor(t, 3*foStandbyPoll+foSlack+10*time.Second,
		"n2 to run "+second+" (a standby must not keep its max_active_projections slot while it polls a lock held elsewhere)",
		func() bool { return n2.state(second) == "live" })
	for _, n := range []*foNode{n1, n2} {
		live := 0
		for _, p := range c.projections {
			if n.state(p) == "live" {
				live++
			}
		}
		if live != 1 {
			t.Errorf("%s runs %d projections, want 1", n.name, live)
		}
	}
	if l := c.lease(first); l.node != "n1" {
		t.Errorf("lease of %s held by %q, want n1", first, l.node)
	}
	if l := c.lease(second); l.node != "n2" {
		t.Errorf("lease of %s held by %q, want n2", second, l.node)
	}
	w.waitWritten(t, 300)
	c.drain(w, c.projections...)
}

// TestFailoverHealth checks /healthz and /readyz on two nodes: both ready
// (live and caught up, standby); the active not ready while it lags; the
// active unhealthy once it halts, holding the lock, while the standby stays
// healthy and ready; after the fix and a restart, nothing is lost.
func TestFailoverHealth(t *testing.T) {
	const p = "health"
	c := newFailoverCluster(t, p)
	n1, n2 := c.node("n1", foOptions{}), c.node("n2", foOptions{})
	w := c.startWriter(1, 10)
	startPair(t, p, n1, n2)
	w.waitWritten(t, 50)
	c.drain(w, p)
	for _, n := range []*foNode{n1, n2} {
		for _, path := range []string{"/healthz", "/readyz"} {
			n := n
			waitFor(t, 10*time.Second, n.name+path+" = 200", func() bool { code, _ := n.probe(path); return code == 200 })
		}
	}

	// Lagging: the active's batch waits on a lock, events pile up.
	release := c.holdEntries(p)
	c.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('lagging', 1, 'Deposited', '{"amount": 5}')`)
	waitFor(t, 10*time.Second, "n1 /readyz = 503 while it lags", func() bool { code, _ := n1.probe("/readyz"); return code == 503 })
	if code, _ := n1.probe("/healthz"); code != 200 {
		t.Errorf("lagging n1 /healthz = %d, want 200", code)
	}
	if code, _ := n2.probe("/readyz"); code != 200 {
		t.Errorf("standby n2 /readyz = %d, want 200", code)
	}
	release()
	waitFor(t, 10*time.Second, "n1 /readyz = 200 once caught up", func() bool { code, _ := n1.probe("/readyz"); return code == 200 })

	// A broken deployment halts the active loudly: /healthz 503 naming the
	// SQLSTATE. It keeps the lock, so the standby does not take over only
	// to halt the same way, and stays a healthy standby.
	before := c.lease(p)
	c.exec(fmt.Sprintf(`ALTER TABLE %s_balances RENAME TO %[1]s_balances_gone`, p))
	c.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('lagging', 2, 'Deposited', '{"amount": 5}')`)
	waitFor(t, 30*time.Second, "n1 /healthz = 503 after the halt", func() bool {
		code, hs := n1.probe("/healthz")
		return code == 503 && len(hs) == 1 && hs[0].State == "halted" && strings.Contains(hs[0].Error, "42P01")
	})
	if code, _ := n1.probe("/readyz"); code != 503 {
		t.Errorf("halted n1 /readyz = %d, want 503", code)
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, hs := n2.probe(path); code != 200 || len(hs) != 1 || hs[0].State != "standby" {
			t.Errorf("n2 %s = %d %+v while n1 is halted, want 200 standby", path, code, hs)
		}
	}
	if l := c.lease(p); l.epoch != before.epoch || l.node != "n1" {
		t.Errorf("lease moved to %s epoch %d while n1 is halted, want n1 epoch %d", l.node, l.epoch, before.epoch)
	}
	var cursor int64
	c.queryRow(`SELECT stream_position FROM pgscribe.cursors WHERE projection = $1 AND stream_id = 'lagging'`, []any{p}, &cursor)
	if cursor != 1 {
		t.Errorf("cursor of the halting stream at %d, want 1 (nothing of the failing batch committed)", cursor)
	}

	// Fix the cause and restart the halted node: the standby takes over and
	// nothing is lost.
	c.exec(fmt.Sprintf(`ALTER TABLE %s_balances_gone RENAME TO %[1]s_balances`, p))
	n1.signal(syscall.SIGTERM)
	if code := n1.wait(10*time.Second + foSlack); code != 0 {
		t.Errorf("halted n1 exited %d after SIGTERM, want 0", code)
	}
	c.waitTakeover(p, before, "n1", foStandbyPoll+foSlack+5*time.Second)
	n1.start()
	n1.waitState(p, "standby", 30*time.Second)
	c.waitCaughtUp(p, 30*time.Second)
	c.verify(p)
	for _, n := range []*foNode{n1, n2} {
		if code, _ := n.probe("/healthz"); code != 200 {
			t.Errorf("%s /healthz = %d after the fix, want 200", n.name, code)
		}
	}
}

// TestFailoverShutdownSignals: SIGTERM stops gracefully and leaves nothing
// unconfirmed on the slot; with a batch stuck past shutdown_timeout the
// process rolls it back and still exits 0 within the timeout; a second
// signal exits at once. Nothing is lost either way.
func TestFailoverShutdownSignals(t *testing.T) {
	const p = "signals"
	c := newFailoverCluster(t, p)
	n1 := c.node("n1", foOptions{shutdownTimeout: 2 * time.Second})
	n2 := c.node("n2", foOptions{shutdownTimeout: time.Minute})
	w := c.startWriter(1, 10)
	n1.start()
	n1.waitState(p, "live", 60*time.Second)
	w.waitWritten(t, 100)
	w.stop(t)
	c.waitCaughtUp(p, 60*time.Second)

	// Graceful: exit 0, lock released, slot confirmed past every event.
	n1.signal(syscall.SIGTERM)
	if code := n1.wait(10 * time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM, want 0", code)
	}
	var locks, pending int
	c.queryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, nil, &locks)
	if locks != 0 {
		t.Errorf("%d advisory locks held after a graceful stop", locks)
	}
	// The process is gone, but its walsender may not have noticed yet:
	// peeking a slot it still holds fails (55006).
	slot := c.id + "_" + p + "_v1"
	waitFor(t, 30*time.Second, "the slot's walsender to exit", func() bool {
		var active bool
		c.queryRow(`SELECT COALESCE(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, []any{slot}, &active)
		return !active
	})
	c.queryRow(`SELECT count(*) FROM pg_logical_slot_peek_binary_changes($1, NULL, NULL,
		'proto_version', '1', 'publication_names', 'pgscribe_events') WHERE substr(data, 1, 1) = 'I'::bytea`,
		[]any{slot}, &pending)
	if pending != 0 {
		t.Errorf("slot not confirmed: %d events still to deliver after a graceful stop", pending)
	}

	// stuck makes the next batch of n wait on a table lock and returns
	// the release.
	stuck := func(n *foNode, pos int) func() {
		t.Helper()
		release := c.holdEntries(p)
		c.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('stuck', $1, 'Deposited', '{"amount": 1}')`, pos)
		waitFor(t, 30*time.Second, n.name+"'s batch to wait on the lock", func() bool {
			var k int
			c.queryRow(`SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND wait_event_type = 'Lock'`, []any{n.role}, &k)
			return k > 0
		})
		return release
	}

	// shutdown_timeout: the stuck batch is rolled back, exit 0 in time.
	n1.start()
	n1.waitState(p, "live", 60*time.Second)
	release := stuck(n1, 1)
	t0 := time.Now()
	n1.signal(syscall.SIGTERM)
	code := n1.wait(2*time.Second + foSlack + 5*time.Second)
	took := foSince(t0, time.Now())
	release()
	t.Logf("SIGTERM with a stuck batch: exit %d after %s (shutdown_timeout 2s)", code, took)
	// The hard stop fires at shutdown_timeout; rolling back, confirming and
	// unlocking take a moment more.
	if code != 0 || took > 3*time.Second {
		t.Errorf("exit %d after %s, want 0 within shutdown_timeout (2s) and a second", code, took)
	}

	// Second signal: exits at once, whatever shutdown_timeout says.
	n2.start()
	n2.waitState(p, "live", 60*time.Second)
	c.waitCaughtUp(p, 30*time.Second)
	release = stuck(n2, 2)
	mark := n2.mark()
	n2.signal(syscall.SIGTERM)
	waitFor(t, 10*time.Second, "n2 to begin stopping", func() bool { return n2.loggedAfter(mark, "stopping") })
	t0 = time.Now()
	n2.signal(syscall.SIGINT)
	code = n2.wait(5 * time.Second)
	took = foSince(t0, time.Now())
	release()
	t.Logf("second signal: exit %d after %s", code, took)
	if took > time.Second {
		t.Errorf("second signal: exit took %s, want at once", took)
	}
	if code == 0 {
		t.Errorf("second signal: exit 0, want non-zero (in-flight batch abandoned)")
	}

	// Nothing lost: a fresh run applies what the stuck batches held.
	n1.start()
	n1.waitState(p, "live", 60*time.Second)
	c.waitCaughtUp(p, 60*time.Second)
	c.verify(p)
}

// Lease-level tests: the leader package against the real server, without
// processes. They pin the properties the fencing argument in leader/doc.go
// rests on.

// foLeaseDB returns a migrated database for lease tests.
func foLeaseDB(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	dsn := newDatabase(t)
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := migrations.Apply(context.Background(), conn, "pgscribe"); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return dsn, pool
}

// foAcquire takes the lease of a projection version for node, failing the
// test unless it gets it.
func foAcquire(t *testing.T, ctx context.Context, dsn, projection string, version int64, node string, timeout time.Duration) *leader.Lease {
	t.Helper()
	l, err := leader.TryAcquire(ctx, dsn, "pgscribe", projection, version, node, timeout)
	if err != nil || l == nil {
		t.Fatalf("TryAcquire(%s v%d) for %s = %v, %v; want the lease", projection, version, node, l, err)
	}
	return l
}

// foCheck runs l's fence check in a transaction of its own.
func foCheck(ctx context.Context, pool *pgxpool.Pool, l *leader.Lease) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return l.Check(ctx, tx) })
}

// TestLeaseExclusiveAndEpoch: one holder at a time; each acquisition bumps
// the epoch; a released lock is free at once; a stale lease is fenced.
func TestLeaseExclusiveAndEpoch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool := foLeaseDB(t)

	a := foAcquire(t, ctx, dsn, "p", 1, "a", 5*time.Second)
	defer a.Release(ctx)
	if b, err := leader.TryAcquire(ctx, dsn, "pgscribe", "p", 1, "b", 5*time.Second); err != nil || b != nil {
		t.Fatalf("second TryAcquire while held = %v, %v; want nil, nil", b, err)
	}
	other := foAcquire(t, ctx, dsn, "p", 2, "b", 5*time.Second)
	other.Release(ctx)

	if err := foCheck(ctx, pool, a); err != nil {
		t.Fatalf("holder's check: %v", err)
	}
	a.Release(ctx)
	b := foAcquire(t, ctx, dsn, "p", 1, "b", 5*time.Second)
	defer b.Release(ctx)
	if b.Epoch != a.Epoch+1 {
		t.Errorf("epoch %d after %d, want a bump by one", b.Epoch, a.Epoch)
	}
	if err := foCheck(ctx, pool, a); !errors.Is(err, event.ErrFenced) {
		t.Errorf("stale lease's check = %v, want ErrFenced", err)
	}
	if err := foCheck(ctx, pool, b); err != nil {
		t.Errorf("new holder's check: %v", err)
	}
	var node string
	if err := pool.QueryRow(ctx, `SELECT node FROM pgscribe.leases WHERE projection = 'p' AND version = 1`).Scan(&node); err != nil || node != "b" {
		t.Errorf("lease node = %q, %v; want b", node, err)
	}
}

// TestLeaseLostBump: a PostgreSQL failover with asynchronous replication
// can lose the last epoch bump; the next holder then bumps to the same
// epoch again. The old holder must still be fenced.
func TestLeaseLostBump(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, pool := foLeaseDB(t)
	first := foAcquire(t, ctx, dsn, "p", 1, "a", 5*time.Second)
	first.Release(ctx)
	old := foAcquire(t, ctx, dsn, "p", 1, "old", 5*time.Second)
	// The promoted server never saw old's bump.
	if _, err := pool.Exec(ctx, `UPDATE pgscribe.leases SET epoch = $1, node = 'a', acquired_at = $2`, first.Epoch, first.Acquired); err != nil {
		t.Fatal(err)
	}
	old.Release(ctx) // its lock session died with the old primary
	next := foAcquire(t, ctx, dsn, "p", 1, "next", 5*time.Second)
	defer next.Release(ctx)
	if next.Epoch != old.Epoch {
		t.Fatalf("setup: epoch %d, want the reused %d", next.Epoch, old.Epoch)
	}
	if err := foCheck(ctx, pool, old); !errors.Is(err, event.ErrFenced) {
		t.Fatalf("old holder with the reused epoch: Check = %v, want ErrFenced", err)
	}
	if err := foCheck(ctx, pool, next); err != nil {
		t.Fatalf("new holder: %v", err)
	}
}

// foMarksDB is foLeaseDB with a table marks (n int) that test batches
// write, and a context bounded to a minute.
func foMarksDB(t *testing.T) (context.Context, string, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	dsn, pool := foLeaseDB(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE marks (n int)`); err != nil {
		t.Fatal(err)
	}
	return ctx, dsn, pool
}

// TestLeaseFenceOrdersTakeover: a batch that passed the check holds the
// takeover until it ends; its commit is visible to the new holder's first
// transaction; a batch checking after the takeover is fenced.
func TestLeaseFenceOrdersTakeover(t *testing.T) {
	ctx, dsn, pool := foMarksDB(t)
	old := foAcquire(t, ctx, dsn, "p", 1, "old", 5*time.Second)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if err := old.Check(ctx, tx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO marks VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	// The old node's lock session dies (as if cut off); its batch goes on.
	old.Release(ctx)

	type result struct {
		l   *leader.Lease
		err error
	}
	took := make(chan result, 1)
	go func() {
		l, err := leader.TryAcquire(ctx, dsn, "pgscribe", "p", 1, "new", 5*time.Second)
		took <- result{l, err}
	}()
	select {
	case r := <-took:
		t.Fatalf("takeover completed while a checked batch was open: %v, %v", r.l, r.err)
	case <-time.After(500 * time.Millisecond):
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the checked batch must still commit: %v", err)
	}
	r := <-took
	if r.err != nil || r.l == nil {
		t.Fatalf("takeover after the batch = %v, %v", r.l, r.err)
	}
	defer r.l.Release(ctx)
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := r.l.Check(ctx, tx); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM marks`).Scan(&n); err != nil {
			return err
		}
		if n != 1 {
			return fmt.Errorf("new holder sees %d marks, want the old batch's 1", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := old.Check(ctx, tx); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO marks VALUES (2)`)
		return err
	})
	if !errors.Is(err, event.ErrFenced) {
		t.Fatalf("old holder's batch after the takeover = %v, want ErrFenced", err)
	}
}

// TestLeaseFencePipelined: the engine pipelines BEGIN, the fence check,
// the writes and COMMIT in one round trip, so a failed check must stop
// everything queued behind it on the server: a stale or deleted lease
// commits nothing, and the failure reads as fenced.
func TestLeaseFencePipelined(t *testing.T) {
	ctx, dsn, pool := foMarksDB(t)
	old := foAcquire(t, ctx, dsn, "p", 1, "old", 5*time.Second)
	old.Release(ctx)
	cur := foAcquire(t, ctx, dsn, "p", 1, "new", 5*time.Second)
	defer cur.Release(ctx)

	// batch runs BEGIN, l's check, an insert of n and COMMIT as one
	// pipeline, as apply does.
	batch := func(l *leader.Lease, n int) error {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		b := &pgx.Batch{}
		b.Queue("begin")
		sql, args := l.CheckStatement()
		b.Queue(sql, args...)
		b.Queue(`INSERT INTO marks VALUES ($1)`, n)
		b.Queue("commit")
		br := conn.SendBatch(ctx, b)
		defer func() {
			_ = br.Close()
			_, _ = conn.Exec(ctx, "rollback")
		}()
		if _, err := br.Exec(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		if _, err := br.Exec(); err != nil {
			return l.CheckFailed(err)
		}
		for range 2 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return nil
	}
	marks := func() []int {
		rows, _ := pool.Query(ctx, `SELECT n FROM marks ORDER BY n`)
		ns, err := pgx.CollectRows(rows, pgx.RowTo[int])
		if err != nil {
			t.Fatal(err)
		}
		return ns
	}

	if err := batch(old, 1); !errors.Is(err, event.ErrFenced) || !strings.Contains(err.Error(), fmt.Sprintf("now epoch %d", cur.Epoch)) {
		t.Fatalf("stale lease's pipelined batch = %v, want ErrFenced naming epoch %d", err, cur.Epoch)
	}
	if err := batch(cur, 2); err != nil {
		t.Fatalf("holder's pipelined batch: %v", err)
	}
	if _, err := pool.Exec(ctx, `DELETE FROM pgscribe.leases WHERE projection = 'p' AND version = 1`); err != nil {
		t.Fatal(err)
	}
	if err := batch(cur, 3); !errors.Is(err, event.ErrFenced) || !strings.Contains(err.Error(), "row is gone") {
		t.Fatalf("pipelined batch with the lease row gone = %v, want ErrFenced (row is gone)", err)
	}
	if got := marks(); len(got) != 1 || got[0] != 2 {
		t.Fatalf("marks = %v, want only the holder's [2]", got)
	}
}

// TestLeaseTimeouts: a lock session that is not pinged ends after the
// lease timeout (the lock frees itself); a batch left idle in its
// transaction by a frozen node is ended by the server, so the takeover's
// epoch bump proceeds; Watch keeps a healthy session alive past the
// timeout and reports the loss of a killed one.
func TestLeaseTimeouts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn, pool := foLeaseDB(t)
	const lease = time.Second

	// Watched: survives several lease timeouts.
	kept := foAcquire(t, ctx, dsn, "kept", 1, "a", lease)
	wctx, wcancel := context.WithCancel(ctx)
	watched := make(chan error, 1)
	go func() { watched <- kept.Watch(wctx, lease/3) }()

	// Not watched, and a batch frozen inside its transaction with the
	// engine's idle_in_transaction_session_timeout.
	frozen := foAcquire(t, ctx, dsn, "p", 1, "frozen", lease)
	defer frozen.Release(ctx)
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(lease.Milliseconds())
	batch, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer batch.Close(ctx)
	tx, err := batch.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := frozen.Check(ctx, tx); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()

	var next *leader.Lease
	waitFor(t, 10*lease, "the frozen holder's lock to expire and the takeover to bump the epoch", func() bool {
		l, err := leader.TryAcquire(ctx, dsn, "pgscribe", "p", 1, "next", lease)
		if err != nil {
			t.Logf("takeover attempt: %v", err)
			return false
		}
		next = l
		return l != nil
	})
	defer next.Release(ctx)
	t.Logf("unwatched lease (timeout %s) taken over after %s", lease, foSince(t0, time.Now()))
	if d := time.Since(t0); d < lease {
		t.Errorf("lock freed after %s, before the lease timeout %s", d, lease)
	}
	if next.Epoch != frozen.Epoch+1 {
		t.Errorf("epoch %d, want %d", next.Epoch, frozen.Epoch+1)
	}
	if err := tx.Commit(ctx); err == nil {
		t.Error("the frozen batch committed after the takeover")
	}
	if err := frozen.Watch(ctx, lease/3); !errors.Is(err, leader.ErrLost) {
		t.Errorf("Watch on an expired session = %v, want ErrLost", err)
	}

	// The watched lease is still held, and releasing it frees it at once.
	if l, err := leader.TryAcquire(ctx, dsn, "pgscribe", "kept", 1, "b", lease); err != nil || l != nil {
		t.Fatalf("watched lease taken after %s: %v, %v", time.Since(t0), l, err)
	}
	wcancel()
	if err := <-watched; err != nil {
		t.Errorf("Watch of a healthy session = %v", err)
	}
	kept.Release(ctx)
	l := foAcquire(t, ctx, dsn, "kept", 1, "b", lease)
	l.Release(ctx)

	// A lock session killed under a watcher: reported as lost.
	lost := foAcquire(t, ctx, dsn, "lost", 1, "a", time.Minute)
	defer lost.Release(ctx)
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE application_name = 'pgscribe-lock' AND datname = current_database()`)
	}()
	if err := lost.Watch(ctx, 50*time.Millisecond); !errors.Is(err, leader.ErrLost) {
		t.Errorf("Watch of a terminated session = %v, want ErrLost", err)
	}
}
