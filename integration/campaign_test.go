package integration

// The seeded fault campaign, part two: the run (issue 30,
// docs/testing.md#the-fault-campaign-make-campaign). A plan
// (campaign_plan_test.go) runs against the shared PostgreSQL: its own
// database, one or two engine nodes (child processes) connected through a
// TCP proxy on loopback, concurrent writers appending with expected
// versions, and the schedule's faults and operator actions one after the
// other. After
// every step, at a quiet point (writers held), and at the end, one oracle:
//
//   - every fault is visible or recovered within a bound: a dropped
//     publication halts every projection visibly (pgscribe_halted 1)
//     within haltVisible; the other faults recover by themselves, and
//     every projection catches up within waitLong;
//   - conservation per projection: events == applied + skipped +
//     dead_lettered + adopted, never more, and dead_lettered == its dead
//     letters (a skip or a discard moves their count to skipped);
//   - every read model equals a computation from the events table alone
//     (cProj.want), dead letters exactly the events that must fail, less
//     those an operator skipped (recorded in campaign_skipped);
//   - nothing halted at a quiet point, and `pgscribe verify` finds no drift.
//
// The first violated property fails the test, which then prints the seed,
// the plan and what was done when. Run by `make campaign` and `go run
// ./internal/tools/campaign` (env PGSCRIBE_CAMPAIGN_*), and, as a short
// campaign of fixed seeds, by `make test`.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

// The environment of a campaign run by `make campaign`.
const (
	campaignSeedEnv     = "PGSCRIBE_CAMPAIGN_SEED"     // the seed; unset: the fixed seeds, short
	campaignDurationEnv = "PGSCRIBE_CAMPAIGN_DURATION" // the history's length (Go duration); default 60s
	campaignSkipEnv     = "PGSCRIBE_CAMPAIGN_SKIP"     // steps not to run, by number ("2,5"): minimising
	campaignDryEnv      = "PGSCRIBE_CAMPAIGN_DRY"      // "1": print the plan, run nothing
	campaignLogsEnv     = "PGSCRIBE_CAMPAIGN_LOGS"     // a directory: every node's output is copied there at the end, passed or failed
	campaignParkEnv     = "PGSCRIBE_CAMPAIGN_PARK"     // "0": on_error park runs as dead_letter (cPlan.withoutPark); else as drawn
)

// campaignPlan is the plan TestCampaign runs for seed: newPlan, with
// on_error park run as dead_letter when PGSCRIBE_CAMPAIGN_PARK=0.
func campaignPlan(seed uint64, duration time.Duration) cPlan {
	pl := newPlan(seed, duration)
	if os.Getenv(campaignParkEnv) == "0" {
		pl = pl.withoutPark()
	}
	return pl
}

// campaignSeeds are the fixed seeds `make test` runs, each for
// campaignShort: between them a group of two with a dropped publication,
// kill -9, a PostgreSQL restart, a cut and a dropped slot (the plans say
// which; TestCampaignPlan keeps them so).
var campaignSeeds = []uint64{7, 27}

const campaignShort = 12 * time.Second

func TestCampaign(t *testing.T) {
	seed := os.Getenv(campaignSeedEnv)
	if seed == "" {
		requireServer(t)
		for _, s := range campaignSeeds {
			t.Run(fmt.Sprint(s), func(t *testing.T) { runCampaign(t, campaignPlan(s, campaignShort), nil) })
		}
		return
	}
	s, err := strconv.ParseUint(seed, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", campaignSeedEnv, seed, err)
	}
	duration := 60 * time.Second
	if d := os.Getenv(campaignDurationEnv); d != "" {
		if duration, err = time.ParseDuration(d); err != nil {
			t.Fatalf("%s=%q: %v", campaignDurationEnv, d, err)
		}
	}
	skip := map[int]bool{}
	for _, f := range strings.FieldsFunc(os.Getenv(campaignSkipEnv), func(r rune) bool { return r == ',' || r == ' ' }) {
		i, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("%s: %q is not a step number", campaignSkipEnv, f)
		}
		skip[i] = true
	}
	pl := campaignPlan(s, duration)
	if os.Getenv(campaignDryEnv) == "1" {
		t.Logf("campaign plan (dry run):\n%s", pl)
		return
	}
	requireServer(t)
	runCampaign(t, pl, skip)
}

// TestCampaignPlan: a seed's plan is the same every time (replay), and
// the fixed seeds cover what the short campaign promises.
func TestCampaignPlan(t *testing.T) {
	if a, b := newPlan(7, time.Minute).String(), newPlan(7, time.Minute).String(); a != b {
		t.Fatalf("seed 7 drew two plans:\n%s\n%s", a, b)
	}
	h1, h2 := newHistory(newPlan(7, time.Minute), 0), newHistory(newPlan(7, time.Minute), 0)
	for range 50 {
		a, _ := h1.next()
		b, _ := h2.next()
		if !slices.Equal(a, b) {
			t.Fatalf("seed 7 drew two histories: %v, %v", a, b)
		}
	}
	kinds, group, bump, halt := map[string]bool{}, false, false, false
	for _, s := range campaignSeeds {
		pl := newPlan(s, campaignShort)
		bump = bump || pl.bump >= 0
		for _, p := range pl.projs {
			halt = halt || (p.onError == "halt" && pl.poison > 0)
		}
		for _, st := range pl.steps {
			kinds[st.kind] = true
			if st.kind == stepPubDrop && pl.groupOfTwo() {
				group = true
			}
		}
	}
	for _, k := range []string{stepKill, stepPGRestart, stepCut, stepPubDrop, stepSlotDrop} {
		if !kinds[k] {
			t.Errorf("no fixed seed's plan has a %s step", k)
		}
	}
	if !group {
		t.Errorf("no fixed seed drops the publication under a group of two")
	}
	if !bump {
		t.Errorf("no fixed seed bumps a version (promote, retire)")
	}
	if !halt {
		t.Errorf("no fixed seed has a projection under on_error = \"halt\" with poison")
	}
	// What generators 4, 5 and 7 added (cPlan.more, on_error, the
	// alter-break and overlap swaps) is drawn by some of the first 60
	// seeds, for a minute of history: more than 4 projections and never
	// more than 8, the upd part under both if_missing, the del part, a
	// blackhole, a discard, an alter-break, a cut+kill-9, on_error halt
	// and park.
	seen := map[string]bool{}
	for s := range uint64(60) {
		pl := newPlan(s+1, time.Minute)
		if len(pl.projs) > 8 {
			t.Errorf("seed %d draws %d projections", s+1, len(pl.projs))
		}
		seen[fmt.Sprint("projections>4 ", len(pl.projs) > 4)] = true
		for _, p := range pl.projs {
			if p.has(partUpd) {
				seen["upd "+p.ifMissing] = true
			}
			if p.has(partDel) {
				seen["del"] = true
			}
			seen["on_error "+p.onError] = true
		}
		for _, st := range pl.steps {
			seen[st.kind] = true
		}
	}
	for _, k := range []string{"projections>4 true", "upd ignore", "upd dead_letter", "del", stepBlackhole, stepDiscard, stepBreak, stepOverlap, "on_error halt", "on_error park"} {
		if !seen[k] {
			t.Errorf("none of seeds 1–60 draws %s", k)
		}
	}
}

// campaign is one run of a plan.
type campaign struct {
	t      *testing.T
	pl     cPlan
	e      *faultEnv
	direct string // DSN of the database, not through the proxy
	proxy  *pgtest.Proxy
	nodes  []*node // engine nodes on the configuration: with two, the one holding a group's lock is active, the other its standby
	start  time.Time

	// gate holds the writers at a quiet point: each transaction holds a
	// read lock, quiet takes the write lock.
	gate    sync.RWMutex
	stopc   chan struct{}
	writers sync.WaitGroup
	werr    chan error

	cfg  *config // the configuration file's contents (its projections change with a version bump)
	live []cProj // the projection versions configured: pl.projs, and after a version bump its v2 in place of v1

	mu       sync.Mutex
	journal  []string        // what was done, when
	skipped  map[string]bool // projections whose dead letters an operator skipped (verify counts those as drift)
	faults   map[string]int
	txs, evs int
}

// note records what the campaign did, for a failing run's report.
func (c *campaign) note(format string, args ...any) {
	line := fmt.Sprintf("%8s  ", time.Since(c.start).Round(10*time.Millisecond)) + fmt.Sprintf(format, args...)
	c.t.Log(line) // as it happens, with -v
	c.mu.Lock()
	defer c.mu.Unlock()
	c.journal = append(c.journal, line)
}

// violation fails the run: the first violated property.
func (c *campaign) violation(property, format string, args ...any) {
	c.t.Helper()
	c.note("VIOLATION %s", property)
	c.t.Fatalf("campaign seed %d: VIOLATION of %q: %s", c.pl.seed, property, fmt.Sprintf(format, args...))
}

func runCampaign(t *testing.T, pl cPlan, skip map[int]bool) {
	c := &campaign{t: t, pl: pl, stopc: make(chan struct{}), werr: make(chan error, pl.writers), faults: map[string]int{}, skipped: map[string]bool{}}
	t.Logf("campaign plan:\n%s", pl)
	t.Logf("campaign: %d steps", len(pl.steps)) // read by internal/tools/campaign to minimise
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if t.Failed() {
			var skipped []string
			for i := range skip {
				skipped = append(skipped, fmt.Sprint(i))
			}
			slices.Sort(skipped)
			env := ""
			if os.Getenv(campaignParkEnv) == "0" {
				env = campaignParkEnv + "=0 "
			}
			t.Logf("campaign seed %d FAILED. What it did:\n  %s\nreplay: %smake campaign SEED=%d DURATION=%s SKIP=%s",
				pl.seed, strings.Join(c.journal, "\n  "), env, pl.seed, pl.duration, strings.Join(skipped, ","))
		}
	})
	c.setup()

	c.start = time.Now()
	for w := range pl.writers {
		c.writers.Add(1)
		go c.write(newHistory(pl, w))
	}
	for i, st := range pl.steps {
		if skip[i] {
			c.note("step %d %s skipped", i, st.kind)
			continue
		}
		if time.Since(c.start) >= pl.duration {
			// Steps wait for the ones before them to recover; those the
			// history's end overtook do not run.
			c.note("step %d %s not reached: the history ended", i, st.kind)
			continue
		}
		if d := st.at - time.Since(c.start); d > 0 {
			time.Sleep(d)
		}
		c.note("step %d %s begins", i, st)
		c.step(i, st)
		c.quiet(fmt.Sprintf("after step %d (%s)", i, st.kind))
	}
	if d := pl.duration - time.Since(c.start); d > 0 {
		time.Sleep(d)
	}
	close(c.stopc)
	c.writers.Wait()
	select {
	case err := <-c.werr:
		t.Fatalf("a writer gave up: %v", err)
	default:
	}
	c.quiet("at the end")
	for _, p := range pl.projs {
		if !p.has(partTrail) && !c.skipped[p.name] && p.onError == "" {
			requireNoDrift(t, pgscribeBinary(t), c.e.config, p.name, 1)
		}
	}
	if pl.bump >= 0 {
		c.bumpVersion(pl.bump)
	}
	c.mu.Lock()
	t.Logf("campaign seed %d passed: %d transactions, %d events appended by the writers (%d in the table), %d dead letters; faults and actions %v",
		pl.seed, c.txs, c.evs, c.e.events(t),
		c.e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters`), c.faults)
	c.mu.Unlock()
	for _, n := range c.nodes {
		n.stop()
	}
}

// setup creates the database, the proxy, the configuration, the events
// table and the read models, appends the backlog and starts the engine.
func (c *campaign) setup() {
	t := c.t
	c.direct = newDatabase(t)
	pool, err := pgxpool.New(context.Background(), c.direct)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if c.proxy, err = pgtest.NewProxy(srv().HostPort()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.proxy.Close() })
	through, err := c.proxy.DSN(c.direct)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// e.dsn is what the engine runs with (through the proxy); the
	// configuration file names the database directly, for the commands.
	c.e = &faultEnv{dsn: through, dir: dir, config: filepath.Join(dir, "pgscribe.toml"), slotPrefix: uniqueID("cmp_"), pool: pool}
	c.cfg = faultConfig(c.direct, c.e.slotPrefix, 5)
	c.live = slices.Clone(c.pl.projs)
	c.writeConfig(c.live)
	c.e.exec(t, c.pl.shape.ddl())
	migrate(t, c.e.config)
	for _, p := range c.pl.projs {
		c.e.exec(t, p.ddl())
	}
	h := newHistory(c.pl, 1000)
	for n := 0; n < c.pl.backlog; {
		evs, _ := h.next()
		if err := c.appendTx(context.Background(), pool, evs); err != nil {
			t.Fatalf("backlog: %v", err)
		}
		n += len(evs)
	}
	c.e.exec(t, `CREATE TABLE campaign_skipped (projection text, event_id text, version int NOT NULL DEFAULT 1)`)
	for k := range c.pl.nodes {
		n := newNode(t, fmt.Sprintf("pgscribe-%c", 'a'+k), c.e.config, "PGSCRIBE_DATABASE_URL="+c.e.dsn)
		n.stopTimeout = 40 * time.Second // shutdown_timeout is 20s
		n.start()
		c.nodes = append(c.nodes, n)
	}
	if dir := os.Getenv(campaignLogsEnv); dir != "" {
		// Registered last, so run first: before the temporary directory
		// with the outputs is removed.
		t.Cleanup(func() {
			for _, n := range c.nodes {
				keep := filepath.Join(dir, fmt.Sprintf("campaign-%d-%s.log", c.pl.seed, n.name))
				if b, err := os.ReadFile(n.output); err == nil && os.WriteFile(keep, b, 0o644) == nil {
					t.Logf("%s: output kept in %s", n.name, keep)
				}
			}
		})
	}
}

// pickNode is the node a fault strikes: with two nodes, for an even
// target the one active for the projection the target picks (holding its
// group's lock), else the other one, the standby — or, while none is
// active, the node the target names.
// role says which it is, for the journal.
func (c *campaign) pickNode(target int) (n *node, role string) {
	if len(c.nodes) == 1 {
		return c.nodes[0], "the only node"
	}
	p := c.pl.projs[(target/2)%len(c.pl.projs)].name
	for k, n := range c.nodes {
		if n.metric("pgscribe_active", projLabels(p)) == 1 {
			if target%2 == 0 {
				return n, "active for " + p
			}
			return c.nodes[(k+1)%len(c.nodes)], "standby for " + p
		}
	}
	return c.nodes[target%len(c.nodes)], "none active for " + p
}

// broken says why no node can make progress any more: one exited
// without being told to.
func (c *campaign) broken() string {
	for _, n := range c.nodes {
		if why := n.broken(); why != "" {
			return why
		}
	}
	return ""
}

// halted reports whether a node shows the projection halted
// (pgscribe_halted 1) and, if so, whether its /readyz answers 503.
func (c *campaign) halted(projection string) (halted, notReady bool) {
	return c.haltedAt(projection, 1)
}

// haltedAt is halted for a version of the projection.
func (c *campaign) haltedAt(projection string, version int) (halted, notReady bool) {
	for _, n := range c.nodes {
		if n.metric("pgscribe_halted", projLabels(projection, "version", fmt.Sprint(version))) == 1 {
			code, _ := n.get("/readyz")
			return true, code == 503
		}
	}
	return false, false
}

// paused reports whether a node shows the projection paused.
func (c *campaign) paused(projection string) bool {
	for _, n := range c.nodes {
		if n.metric("pgscribe_paused", projLabels(projection)) == 1 {
			return true
		}
	}
	return false
}

// appendTx appends evs in one transaction, each at its stream's next
// position (expected version: a concurrent append to the stream makes
// the transaction fail with a unique violation; the caller retries).
func (c *campaign) appendTx(ctx context.Context, db interface {
	Begin(context.Context) (pgx.Tx, error)
}, evs []cEvent) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		b := &pgx.Batch{}
		for _, x := range evs {
			b.Queue(c.pl.shape.appendSQL(), x.stream, x.typ, x.data)
		}
		return tx.SendBatch(ctx, b).Close()
	})
}

// write is one writer: its history's transactions until the campaign
// stops, each retried until it commits (through restarts and conflicts
// of expected versions), for two minutes at most.
func (c *campaign) write(h *history) {
	defer c.writers.Done()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-c.stopc:
			return
		default:
		}
		evs, pause := h.next()
		c.gate.RLock()
		deadline := time.Now().Add(2 * time.Minute)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			var err error
			if conn == nil {
				conn, err = pgx.Connect(ctx, c.direct)
			}
			if err == nil {
				err = c.appendTx(ctx, conn, evs)
			}
			cancel()
			if err == nil {
				break
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "23505" { // not a conflict: reconnect
				if conn != nil {
					conn.Close(context.Background())
				}
				conn = nil
			}
			if time.Now().After(deadline) {
				c.gate.RUnlock()
				c.werr <- err
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.gate.RUnlock()
		c.mu.Lock()
		c.txs++
		c.evs += len(evs)
		c.mu.Unlock()
		select {
		case <-c.stopc:
			return
		case <-time.After(pause):
		}
	}
}

// step runs one step of the schedule, including the wait for what it
// must show.
func (c *campaign) step(i int, st cStep) {
	t, e := c.t, c.e
	c.mu.Lock()
	c.faults[st.kind]++
	c.mu.Unlock()
	switch st.kind {
	case stepKill:
		n, role := c.pickNode(st.target)
		n.kill()
		c.note("killed %s (%s)", n.name, role)
		time.Sleep(st.hold)
		n.start()
	case stepOverlap:
		// The second fault while the first holds: the node dies with its
		// connections already cut, and starts again before they return.
		c.proxy.Cut()
		n, role := c.pickNode(st.target)
		n.kill()
		c.note("cut the connections, then killed %s (%s)", n.name, role)
		time.Sleep(st.hold)
		n.start()
		time.Sleep(st.hold)
		c.proxy.Restore()
		c.note("started %s while cut, then restored the connections", n.name)
	case stepFreeze:
		n, role := c.pickNode(st.target)
		n.signal(syscall.SIGSTOP)
		c.note("stopped %s (%s)", n.name, role)
		time.Sleep(2*time.Second + 4*st.hold)
		n.signal(syscall.SIGCONT)
	case stepPGRestart:
		if !srv().CanRestart() {
			c.note("step %d: the %s server cannot restart; nothing done", i, srv().Mode())
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := srv().Restart(ctx, true); err != nil {
			t.Fatalf("restart PostgreSQL: %v", err)
		}
		e.pool.Reset()
	case stepCut:
		c.proxy.Cut()
		time.Sleep(st.hold)
		c.proxy.Restore()
	case stepBlackhole:
		// Every connection of every node hangs, nothing is closed; new
		// ones are accepted and hang too. The hold (up to 14 s) stays
		// under stall_timeout (30 s): the engine must come back by itself
		// once the bytes flow again (the quiet point after the step).
		c.proxy.Blackhole()
		c.note("blackholed the engine's connections")
		time.Sleep(2*time.Second + 4*st.hold)
		c.proxy.Restore()
	case stepPubDrop:
		pub := scalar[string](t, e.pool, `SELECT pubname FROM pg_publication`)
		e.exec(t, "DROP PUBLICATION "+pgx.Identifier{pub}.Sanitize())
		c.note("dropped publication %s", pub)
		// A change of every type: every stream must decode one, even
		// while the writers idle.
		var evs []cEvent
		for _, ty := range campaignTypes {
			evs = append(evs, cEvent{stream: fmt.Sprintf("fault-%d", i), typ: ty,
				data: `{"v": 0, "acct": "a-0", "amount": 1, "name": "fault", "q": 0, "fail": false}`})
		}
		if err := c.appendTx(context.Background(), e.pool, evs); err != nil {
			t.Fatalf("append after the drop: %v", err)
		}
		c.visibleHalt("publication dropped")
		c.statusHalted("publication dropped")
		migrateAs(t, e, c.direct) // the documented fix: pgscribe migrate recreates it
		c.note("pgscribe migrate recreated the publication")
		c.recovered("publication recreated")
	case stepSlotDrop:
		slots := slices.Sorted(func(yield func(string) bool) {
			for s := range prefixSlots(t, e.pool, e.slotPrefix) {
				if !yield(s) {
					return
				}
			}
		})
		if len(slots) == 0 {
			c.note("step %d: no slot to drop", i)
			return
		}
		slot := slots[st.target%len(slots)]
		c.dropSlot(slot)
	case stepPause:
		p := ""
		for k := range c.pl.projs {
			if q := c.pl.projs[(st.target+k)%len(c.pl.projs)]; !c.haltsForGood(q) {
				p = q.name
				break
			}
		}
		if p == "" {
			c.note("step %d: every projection is halted for good; nothing to pause", i)
			return
		}
		e.operate(t, 0, "pause", "-projection", p, "-version", "1", "-reason", "campaign")
		c.within(5*time.Second, "pause visible", p+" paused (pgscribe_paused 1)", func() bool { return c.paused(p) })
		time.Sleep(st.hold)
		e.operate(t, 0, "resume", "-projection", p, "-version", "1")
		c.within(5*time.Second, "resume visible", p+" resumed (pgscribe_paused 0)", func() bool { return !c.paused(p) })
	case stepAlter:
		p := c.pl.projs[st.target%len(c.pl.projs)]
		rm := p.want()
		if len(rm) == 0 {
			c.note("step %d: %s has no read model", i, p.name)
			return
		}
		table := rm[st.target%len(rm)][0]
		e.exec(t, "ALTER TABLE "+table+" ADD COLUMN campaign_extra int DEFAULT 7")
		c.note("added a column to %s", table)
		time.Sleep(st.hold)
		e.exec(t, "ALTER TABLE "+table+" DROP COLUMN campaign_extra")
		c.note("dropped it")
	case stepBreak:
		var p cProj
		var table, col string
		for k := range c.pl.projs {
			if q := c.pl.projs[(st.target+k)%len(c.pl.projs)]; !c.haltsForGood(q) {
				if table, col = q.breakable(st.target); table != "" {
					p = q
					break
				}
			}
		}
		if table == "" {
			c.note("step %d: no projection that is not halted for good writes a column", i)
			return
		}
		gone := col + "_gone"
		e.exec(t, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s", table, col, gone))
		c.note("renamed %s.%s: a rule of %s writes a column that is gone", table, col, p.name)
		// An event of each of its types, so that it meets the change even
		// while the writers idle (only its upd part's open insert, at a
		// stream's first position, writes opened: a new stream).
		var evs []cEvent
		for _, ty := range p.types {
			evs = append(evs, cEvent{stream: fmt.Sprintf("fault-%d", i), typ: ty,
				data: `{"v": 0, "acct": "a-0", "amount": 1, "name": "fault", "q": 0, "fail": false}`})
		}
		if err := c.appendTx(context.Background(), e.pool, evs); err != nil {
			t.Fatalf("append after the rename: %v", err)
		}
		c.within(haltVisible, "every fault visible or recovered", "column renamed: "+p.name+" halted visibly (pgscribe_halted 1, /readyz 503)",
			func() bool { h, nr := c.halted(p.name); return h && nr })
		c.statusHaltedOf("column renamed", []cProj{p})
		time.Sleep(st.hold)
		e.exec(t, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s", table, gone, col))
		e.operate(t, 0, "resume", "-projection", p.name, "-version", "1")
		c.note("renamed it back; pgscribe resume -projection %s", p.name)
		c.recovered("column restored, projection resumed")
	case stepRetry, stepSkip, stepDiscard:
		p := c.pl.projs[st.target%len(c.pl.projs)].name
		c.quietThen("before "+st.kind, func() {
			n := c.e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1 AND version = 1`, p)
			if n == 0 {
				c.note("step %d: %s has no dead letters", i, p)
				return
			}
			args := []string{"deadletters", strings.TrimPrefix(st.kind, "deadletter-"), "-projection", p, "-version", "1"}
			if st.kind == stepDiscard && c.pl.projs[st.target%len(c.pl.projs)].onError == "park" {
				// Refused on a parking projection (cli.md): exit 2, nothing
				// discarded (the next quiet point checks the dead letters).
				out := e.operate(t, 2, append(args, "-yes")...)
				c.note("deadletters discard %s refused (on_error park): %s", p, strings.TrimSpace(out))
				return
			}
			if st.kind != stepRetry {
				// Skipped or discarded: they leave the dead letters and
				// count as skipped (cli.md), and verify would report them.
				c.skipped[p] = true
				e.exec(t, `INSERT INTO campaign_skipped SELECT projection, event_id FROM pgscribe.dead_letters WHERE projection = $1 AND version = 1`, p)
			}
			if st.kind == stepDiscard {
				args = append(args, "-yes") // done by the command itself, no engine needed
			}
			out := e.operate(t, 0, args...)
			c.note("deadletters %s %s (%d): %s", args[1], p, n, strings.TrimSpace(out))
		})
	case stepVerify:
		for k := range c.pl.projs {
			p := c.pl.projs[(st.target+k)%len(c.pl.projs)]
			if p.has(partTrail) || p.onError != "" {
				continue // verify does not rebuild an sql rule; halt and park are not tried
			}
			c.quiet("before verify")
			requireNoDrift(t, pgscribeBinary(t), e.config, p.name, 1)
			c.note("verify %s: no drift", p.name)
			return
		}
		c.note("step %d: every projection has an sql rule; nothing to verify", i)
	default:
		t.Fatalf("unknown step %q", st.kind)
	}
}

// dropSlot drops the slot by hand, ending the walsender that holds it;
// a slot the engine dropped itself meanwhile is dropped already.
func (c *campaign) dropSlot(slot string) {
	dropped := poll(c.t, 30*time.Second, "slot "+slot+" to be dropped", func(ctx context.Context) (bool, error) {
		var exists bool
		if err := c.e.pool.QueryRow(ctx, `SELECT count(*) > 0 FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&exists); err != nil || !exists {
			return err == nil, nil
		}
		_, _ = c.e.pool.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL`, slot)
		_, err := c.e.pool.Exec(ctx, `SELECT pg_drop_replication_slot($1)`, slot)
		return err == nil, nil
	})
	if !dropped {
		c.t.Fatalf("could not drop slot %s", slot)
	}
	c.note("dropped slot %s", slot)
}

// within polls cond for bound; it is a violation of property when cond
// never holds.
func (c *campaign) within(bound time.Duration, property, what string, cond func() bool) {
	c.t.Helper()
	if !poll(c.t, bound, what, func(context.Context) (bool, error) { return cond(), nil }, c.broken) {
		c.violation(property, "%s: not within %s", what, bound)
	}
	c.note("%s", what)
}

// haltsWithin polls, for every projection, cond of what halted says of it
// (pgscribe_halted 1, /readyz 503) for bound, as within does; what is
// "<cause>: <projection> <state>".
func (c *campaign) haltsWithin(bound time.Duration, property, cause, state string, cond func(halted, notReady bool) bool) {
	c.t.Helper()
	for _, p := range c.pl.projs {
		c.within(bound, property, cause+": "+p.name+" "+state, func() bool { return cond(c.halted(p.name)) })
	}
}

// visibleHalt: a fault that cannot recover by itself shows on every
// projection within haltVisible: pgscribe_halted 1 and /readyz 503.
func (c *campaign) visibleHalt(fault string) {
	c.t.Helper()
	c.haltsWithin(haltVisible, "every fault visible or recovered", fault, "halted visibly (pgscribe_halted 1, /readyz 503)",
		func(halted, notReady bool) bool { return halted && notReady })
}

// statusHalted waits until `pgscribe status -json` shows every projection
// halted with a reason: what an operator reads besides the metrics.
func (c *campaign) statusHalted(fault string) {
	c.t.Helper()
	c.statusHaltedOf(fault, c.pl.projs)
}

// statusHaltedOf is statusHalted for the projections projs.
func (c *campaign) statusHaltedOf(fault string, projs []cProj) {
	c.t.Helper()
	var why string
	ok := poll(c.t, haltVisible, "status to show the halts", func(ctx context.Context) (bool, error) {
		out, err := cliCommand(ctx, pgscribeBinary(c.t), "status", "-json", "-config", c.e.config).Output()
		var st sourceStatus
		if err == nil {
			err = json.Unmarshal(out, &st)
		}
		if err != nil {
			why = fmt.Sprintf("status -json: %v: %s", err, out)
			return false, nil
		}
		for _, p := range projs {
			i := slices.IndexFunc(st.Projections, func(s sourceStatusProjection) bool { return s.Projection == p.name })
			if i < 0 || st.Projections[i].State != "halted" || st.Projections[i].HaltReason == "" {
				why = fmt.Sprintf("status -json does not show %s halted with a reason: %s", p.name, out)
				return false, nil
			}
		}
		return true, nil
	}, c.broken)
	if !ok {
		c.violation("every fault visible or recovered", "%s: %s", fault, why)
	}
	c.note("%s: pgscribe status shows %d projection(s) halted, with the reason", fault, len(projs))
}

// recovered: once the cause of a halt is gone, every projection resumes
// by itself within waitLong.
func (c *campaign) recovered(fix string) {
	c.t.Helper()
	for _, p := range c.pl.projs {
		// One halted for good (its poison, maybe appended meanwhile: the
		// writers run) halts again.
		c.within(waitLong, "halts end once their cause does", fix+": "+p.name+" no longer halted (or halted for good)", func() bool {
			h, _ := c.halted(p.name)
			return !h || c.haltsForGood(p)
		})
	}
}

// haltsForGood reports whether p halts on an event of its table and stays
// halted: on_error "halt" and an event of its types that fails.
func (c *campaign) haltsForGood(p cProj) bool {
	return p.onError == "halt" && c.e.scalar(c.t, `SELECT count(*) FROM events WHERE type = ANY($1) AND `+p.poison(), p.types) > 0
}

// haltedExactly checks a projection halted for good: visibly halted
// within haltVisible, no stream acknowledged from its first failing event
// on (failures.md: nothing of the batch is acknowledged), no dead letter,
// and each keyed read model holds only rows of events before that event.
func (c *campaign) haltedExactly(when string, p cProj) {
	t, e := c.t, c.e
	t.Helper()
	c.within(haltVisible, "a halting projection halts visibly", when+": "+p.name+" halted on its poison (pgscribe_halted 1, /readyz 503)",
		func() bool { h, nr := c.halted(p.name); return h && nr })
	if n := e.scalar(t, `SELECT count(*) FROM pgscribe.cursors c WHERE c.projection = $1 AND c.version = 1
  AND c.applied + c.skipped + c.dead_lettered + c.adopted + c.parked > (SELECT count(*) FROM events
    WHERE events.stream_id = c.stream_id AND NOT `+p.behind()+` AND NOT (type = ANY($2) AND `+p.poison()+`))`, p.name, p.types); n > 0 {
		c.violation("nothing acknowledged past a halt", "%s: %s: %d stream(s) account for events at or after their first failing event", when, p.name, n)
	}
	if n := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1 AND version = 1`, p.name); n > 0 {
		c.violation("nothing acknowledged past a halt", "%s: %s (on_error halt) has %d dead letters", when, p.name, n)
	}
	for _, rm := range p.want() {
		if part := strings.TrimPrefix(rm[0], p.name+"_"); part != partRows && part != partSeen && part != partNote && part != partCheck {
			continue // aggregates: no row-wise bound
		}
		if n := e.scalar(t, `SELECT count(*) FROM ((`+rm[1]+`) EXCEPT ALL (`+rm[2]+`)) x`, p.types); n > 0 {
			c.violation("nothing acknowledged past a halt", "%s: %s holds %d row(s) of no event before its stream's first failing one", when, rm[0], n)
		}
	}
}

// diagnose logs what the engine recorded of p: its dead letters and its
// parked streams, for a failing run's report.
func (c *campaign) diagnose(p cProj) {
	for _, q := range []string{
		`SELECT stream_id, stream_position, event_type, error_kind FROM pgscribe.dead_letters WHERE projection = $1 AND version = 1 ORDER BY 1, 2`,
		`SELECT stream_id, applied, skipped, dead_lettered, parked, parked_since FROM pgscribe.cursors WHERE projection = $1 AND version = 1 ORDER BY 1`,
		`SELECT stream_id, stream_position FROM pgscribe.parked_events WHERE projection = $1 AND version = 1 ORDER BY 1, 2`,
		`SELECT stream_id, stream_position, type, id FROM events WHERE $1 <> '' AND type = ANY(` + p.typesSQL() + `) AND ` + p.poison() + ` ORDER BY 1, 2`,
	} {
		rows, err := c.e.pool.Query(context.Background(), q, p.name)
		if err != nil {
			c.t.Logf("diagnose %s: %v", p.name, err)
			continue
		}
		var lines []string
		for rows.Next() {
			vals, _ := rows.Values()
			f := make([]string, len(vals))
			for k, v := range vals {
				f[k] = fmt.Sprint(v)
			}
			lines = append(lines, strings.Join(f, " "))
		}
		rows.Close()
		c.t.Logf("diagnose %s: %s\n  %s", p.name, q, strings.Join(lines, "\n  "))
	}
}

// writeConfig writes the configuration file with projs.
func (c *campaign) writeConfig(projs []cProj) {
	c.cfg.projections = nil
	for _, p := range projs {
		c.cfg.add(p.toml())
	}
	c.cfg.write(c.t, c.e.config)
}

// restartNodes stops every node (SIGTERM) and starts it again: a changed
// configuration is read at start.
func (c *campaign) restartNodes() {
	for _, n := range c.nodes {
		n.stop()
		n.start()
	}
}

// bumpVersion runs the version bump of rebuilds.md on projection i once
// the history ended (writers stopped): v2 in its own schema beside v1,
// migrate, restart, v2 rebuilt and exact beside v1 (a quiet point checks
// both); promote v2, whose served views must then read v2's rows; v1
// removed from the configuration, restart, retire v1, which must leave no
// slot, cursor, dead letter or lease of v1; v2 exact and without drift.
func (c *campaign) bumpVersion(i int) {
	t, e := c.t, c.e
	v1 := c.pl.projs[i]
	v2 := v1
	v2.version, v2.schema, v2.serve = 2, v1.name+"_v2", v1.name+"_read"
	if err := os.WriteFile(filepath.Join(filepath.Dir(e.config), v2.ddlFile()), []byte(v2.ddl()), 0o644); err != nil {
		t.Fatal(err)
	}
	e.exec(t, "CREATE SCHEMA IF NOT EXISTS "+v2.serve)
	c.live = append(c.live, v2)
	c.writeConfig(c.live)
	migrate(t, e.config)
	c.restartNodes()
	c.note("version bump: %s v2 in schema %s beside v1, nodes restarted", v2.name, v2.schema)
	c.quiet("with " + v2.name + " v2 beside v1")
	out := e.operate(t, 0, "promote", "-projection", v2.name, "-version", "2")
	c.note("promote %s v2: %s", v2.name, strings.TrimSpace(out))
	for _, rm := range v2.want() {
		// The served view has the table's name in the serve schema.
		served := v2.serve + strings.TrimPrefix(rm[0], v2.schema)
		sameRows(t, e.pool, "served view "+served, strings.Replace(rm[1], rm[0], served, 1), rm[2], v2.types)
	}
	if t.Failed() {
		c.violation("promote serves the new version", "the served views of %s do not read v2's rows (above)", v2.name)
	}
	c.live = slices.DeleteFunc(c.live, func(p cProj) bool { return p.name == v1.name && p.ver() == 1 })
	c.writeConfig(c.live)
	c.restartNodes()
	out = e.operate(t, 0, "retire", "-projection", v1.name, "-version", "1")
	c.note("retire %s v1: %s", v1.name, strings.TrimSpace(out))
	for _, q := range []string{
		`SELECT count(*) FROM pgscribe.cursors WHERE projection = $1 AND version = 1 AND $2::text <> ''`,
		`SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1 AND version = 1 AND $2::text <> ''`,
		`SELECT count(*) FROM pgscribe.leases WHERE projection = $1 AND version = 1 AND $2::text <> ''`,
		`SELECT count(*) FROM pg_replication_slots WHERE slot_name = $2 AND $1::text <> ''`,
	} {
		if n := e.scalar(t, q, v1.name, slotName(e.slotPrefix, v1.name, 1)); n != 0 {
			c.violation("retire removes the version", "after retire of %s v1: %d row(s) of %s", v1.name, n, q)
		}
	}
	c.quiet("after " + v1.name + " v1 retired")
	requireNoDrift(t, pgscribeBinary(t), e.config, v2.name, 2)
	c.note("verify %s v2: no drift", v2.name)
}

// campaignAccountedSQL is what the projection's cursors account for ($1
// the projection, version 1): applied + skipped + dead_lettered + adopted
// + parked (failures.md: a parked stream's held events count as parked).
const campaignAccountedSQL = `SELECT coalesce(sum(applied + skipped + dead_lettered + adopted + parked), 0)::bigint
FROM pgscribe.cursors WHERE projection = $1 AND version = $2`

// quiet holds the writers and checks the oracle: every projection
// catches up within waitLong (recovered), conservation, exact read
// models and dead letters, nothing halted.
func (c *campaign) quiet(when string) { c.quietThen(when, nil) }

// quietThen is quiet, then then (if not nil) with the writers still held.
func (c *campaign) quietThen(when string, then func()) {
	t, e := c.t, c.e
	t.Helper()
	c.gate.Lock()
	defer c.gate.Unlock()
	events := e.events(t)
	forGood := map[string]bool{}
	for _, p := range c.live {
		if c.haltsForGood(p) {
			forGood[p.name] = true
			c.haltedExactly(when, p)
			continue
		}
		var got int64
		ok := poll(t, waitLong, p.name+" to catch up", func(ctx context.Context) (bool, error) {
			var err error
			err = e.pool.QueryRow(ctx, campaignAccountedSQL, p.name, p.ver()).Scan(&got)
			return got >= events, err
		}, c.broken)
		switch {
		case got > events:
			c.violation("conservation", "%s: %s accounts for %d events, the table has %d", when, p.name, got, events)
		case !ok:
			if halted, _ := c.haltedAt(p.name, p.ver()); halted {
				c.violation("halts end once their cause does", "%s: %s is halted, accounting for %d of %d events after %s", when, p.name, got, events, waitLong)
			}
			c.violation("every fault visible or recovered", "%s: %s accounts for %d of %d events after %s, and shows no halt", when, p.name, got, events, waitLong)
		}
	}
	for _, p := range c.live {
		if forGood[p.name] {
			continue // checked above
		}
		for _, rm := range p.want() {
			sameRows(t, e.pool, when+": read model "+rm[0], rm[1], rm[2], p.types)
		}
		sameRows(t, e.pool, when+": dead letters of "+p.name,
			`SELECT event_id FROM pgscribe.dead_letters WHERE projection = $1 AND version = `+fmt.Sprint(p.ver()),
			p.deadSQL(), p.name, p.types)
		if t.Failed() {
			c.diagnose(p)
			c.violation("read models exact", "%s: %s differs from the events table (above)", when, p.name)
		}
		// The cursors count what the table of dead letters holds: a skip
		// or a discard moves its count to skipped (the sum, above, stays).
		counted := e.scalar(t, `SELECT coalesce(sum(dead_lettered), 0)::bigint FROM pgscribe.cursors WHERE projection = $1 AND version = $2`, p.name, p.ver())
		if rows := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1 AND version = $2`, p.name, p.ver()); counted != rows {
			c.violation("conservation", "%s: %s counts %d events dead-lettered, its dead letters are %d", when, p.name, counted, rows)
		}
		if halted, _ := c.haltedAt(p.name, p.ver()); halted {
			c.violation("nothing halted at a quiet point", "%s: %s v%d is halted", when, p.name, p.ver())
		}
	}
	if len(forGood) > 0 {
		c.note("quiet point %s: %d events, every projection exact but %d halted for good as promised", when, events, len(forGood))
	} else {
		c.note("quiet point %s: %d events, every projection exact", when, events)
	}
	if then != nil {
		then()
	}
}
