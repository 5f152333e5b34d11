package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// W7 is "many projections, one events table": how the engine's cost grows
// with the number N of projections that read the same events table.
//
// Catch-up (-w7-counts): for each N, a fresh database and N identical
// projections w7p1…w7pN, each one upsert rule (no `on`: every event) into a
// read model of its own, w7_counts_<i>: per stream, the events seen (`inc
// n = 1`) and the last type (`set`). The engine starts on the empty events
// table, every projection goes live (so each has joined whatever it streams
// from: a slot of its own, or a shared one), the engine stops gracefully,
// -w7-events events are appended in transactions of -w5-tx-events, and the
// restarted engine is timed, as W5 is, until every projection's cursors
// account for every event. PostgreSQL's CPU over that run (the whole
// server, as the other workloads measure it) divided by events × N says
// what each projection costs the server: with a slot per projection the
// WAL is decoded N times. Each read model is then compared, EXCEPT ALL
// both ways, with one computed by SQL from the events table.
//
// Live (-w7-live): for each N, a fresh database and N projections
// w7l1…w7lN, each one insert rule writing a row per event (keyed by the
// event id) into w7_live_<i>, the shape of W4's activity log: a per-event
// row is what gives every event a read-model commit timestamp, so the
// latency is measured as W4 measures it, by PostgreSQL alone
// (pg_xact_commit_timestamp of the event's row to that of its read-model
// row). W4's producer runs at -w7-rate for one W4 step. p50 and p99 are
// over the rows of all N projections pooled (N rows per event); the worst
// single projection's p99 is reported beside them.
//
// One slow member (-w7-slow, when 8 is in -w7-live): the live step once
// more with 8 projections, the 8th of which (w7s8) also runs an `sql` rule
// that sleeps in PostgreSQL for -w7-slow-ms per event on average (pg_sleep
// sleeps in whole milliseconds, so a share of the events sleeps one more
// millisecond, chosen by position). Its one partition then applies fewer
// events per second than the producer appends: its queues fill, and the
// group's stream, which waits for a member whose queue is full, slows the
// other 7 down to its pace. The step is compared with the normal 8 run
// (whose 8th, w7l8, is like the others): the 7 others' latency pooled, the
// 8th's, how many events each had not accounted for when the producer
// stopped (the 7 others: the furthest behind), what each applied per
// second over the step, and the engine's peak RSS, which the bounded
// queues keep where it was.

// w7Figures are W7's results.
type w7Figures struct {
	Events   int64       `json:"events"`
	TxEvents int64       `json:"tx_events"`
	CatchUp  []w7CatchUp `json:"catch_up,omitempty"`
	Backfill []w7CatchUp `json:"backfill,omitempty"` // -w7-backfill: the same events before the first start`
	Live     []w7Live    `json:"live,omitempty"`
	LiveRate int         `json:"live_rate"`
	Slow     []w7Slow    `json:"slow_member,omitempty"` // -w7-slow: 8 live, none slow, then the 8th slow
}

// w7Slow is one case of W7's slow-member comparison: 8 projections live,
// the 8th normal (SleepMS 0) or slow. Latencies in ms; "others" are
// projections 1 to 7, "last" the 8th.
type w7Slow struct {
	Case          string  `json:"case"`
	SleepMS       float64 `json:"sleep_ms_per_event,omitempty"` // the 8th's pg_sleep per event, mean
	Events        int64   `json:"events"`
	Achieved      float64 `json:"achieved_rate"`
	OthersP50     float64 `json:"others_p50_ms"`
	OthersP99     float64 `json:"others_p99_ms"`
	OthersWorst   float64 `json:"others_worst_p99_ms"`
	OthersMax     float64 `json:"others_max_ms"`
	LastP50       float64 `json:"last_p50_ms"`
	LastP99       float64 `json:"last_p99_ms"`
	LastMax       float64 `json:"last_max_ms"`
	OthersBacklog int64   `json:"others_backlog,omitempty"` // events not accounted for when the producer stopped: the furthest behind of the 7
	LastBacklog   int64   `json:"last_backlog,omitempty"`   // … and the 8th
	OthersRate    float64 `json:"others_applied_rate"`      // events/s applied over the step: the slowest of the 7
	LastRate      float64 `json:"last_applied_rate"`
	PeakRSSMB     float64 `json:"peak_rss_mb"` // over the engine's run (VmHWM)
	// The highest RSS sampled (every 500 ms) in each half of the step.
	RSSFirstHalfMB  float64 `json:"rss_first_half_mb,omitempty"`
	RSSSecondHalfMB float64 `json:"rss_second_half_mb,omitempty"`
	Load            string  `json:"load"`
}

// rssSampler samples a process's RSS until stopped.
type rssSampler struct {
	start time.Time
	end   time.Duration // since start, when stopped
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
	at    []time.Duration // since start
	rss   []int64
}

func sampleRSS(pid int, every time.Duration) *rssSampler {
	s := &rssSampler{start: time.Now(), done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			if r, err := currentRSS(pid); err == nil {
				s.at, s.rss = append(s.at, time.Since(s.start)), append(s.rss, r)
			}
			select {
			case <-s.done:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// stop ends the sampling (idempotent); the samples may be read after it.
func (s *rssSampler) stop() {
	s.once.Do(func() {
		s.end = time.Since(s.start)
		close(s.done)
		s.wg.Wait()
	})
}

// halves returns the highest RSS sampled in each half of the sampling, MB.
func (s *rssSampler) halves() (first, second float64) {
	for i, at := range s.at {
		if at < s.end/2 {
			first = max(first, mb(s.rss[i]))
		} else {
			second = max(second, mb(s.rss[i]))
		}
	}
	return first, second
}

func (s *rssSampler) write(path string) error {
	var sb strings.Builder
	sb.WriteString("seconds,rss_mb\n")
	for i, at := range s.at {
		fmt.Fprintf(&sb, "%.1f,%.1f\n", at.Seconds(), mb(s.rss[i]))
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

// w7CatchUp is one N of W7's catch-up. CPU figures are µs per event and
// projection (-1 not measured); ratios are against N = 1 (0 without it).
type w7CatchUp struct {
	Projections     int       `json:"projections"`
	Events          int64     `json:"events"`
	Seconds         float64   `json:"seconds"`       // engine start → every projection accounted for every event
	FirstSeconds    float64   `json:"first_seconds"` // → the first projection did
	SecondsVsOne    float64   `json:"seconds_vs_one"`
	CPUPerEventProj float64   `json:"cpu_us_per_event_projection"`
	PGPerEventProj  float64   `json:"pg_cpu_us_per_event_projection"`
	PGVsOne         float64   `json:"pg_cpu_vs_one"`
	PeakRSSMB       float64   `json:"peak_rss_mb"`
	OtherCores      float64   `json:"other_cores"`
	DifferingRows   []int64   `json:"differing_rows"`         // per projection, against the SQL expectation
	Poison          int64     `json:"poison"`                 // poison events appended (-w7-poison)
	DeadLetterDiff  []int64   `json:"dead_letter_diff"`       // per projection: dead-lettered positions not poison, and poison not dead-lettered
	Runs            []float64 `json:"runs_seconds,omitempty"` // -w7-repeat: every run's catch-up time, in run order; the figures are the median run's
	Load            string    `json:"load"`
}

// w7Live is one N of W7's live part.
type w7Live struct {
	Projections int        `json:"projections"`
	Rules       int        `json:"rules,omitempty"` // > 0: one projection with this many rules (-w7-rules), not Projections of one each
	Step        LatencyRow `json:"step"`            // P50/P99/Max pooled over all tables' rows; WorstP99 the worst table's
	P99VsOne    float64    `json:"p99_vs_one"`
	RunsP99     []float64  `json:"runs_p99_ms,omitempty"` // every run's pooled p99, in order (-w7-repeat)
}

// w7Block is the configuration of W7 projection i: kind "p" counts events
// per stream (catch-up), kind "l" writes a row per event (live).
func w7Block(kind string, i int) string {
	name := fmt.Sprintf("w7%s%d", kind, i)
	head := fmt.Sprintf("[[projection]]\n# %s: one of W7's identical projections (bench/w7.go).\nname     = %q\nversion  = 1\non_error = \"dead_letter\"\n\n", name, name)
	switch kind {
	case "l":
		return head + w7Record(i)
	case "r":
		var sb strings.Builder
		sb.WriteString(head)
		for j := 1; j <= i; j++ {
			if j > 1 {
				sb.WriteString("\n")
			}
			sb.WriteString(strings.Replace(w7Record(j), `"record"`, fmt.Sprintf(`"record_%d"`, j), 1))
		}
		return sb.String()
	}
	return head + fmt.Sprintf(`  [[projection.rule]]
  name  = "count"
  op    = "upsert"
  table = "w7_counts_%d"
  key   = { stream_id = "stream_id" }
  set   = { last_type = "type", last_ref = "data.reference ?? \"\"" }
  inc   = { n = "1" }
`, i)
}

func w7Record(i int) string {
	return fmt.Sprintf(`  [[projection.rule]]
  name  = "record"
  op    = "insert"
  table = "w7_live_%d"
  set   = { event_id = "id", stream_id = "stream_id" }
`, i)
}

// w7SlowBlock is W7's slow projection w7s<i>: a live one (a row per event
// into w7_live_<i>) whose events also sleep in PostgreSQL, ms on average.
func w7SlowBlock(i int, ms float64) string {
	name := fmt.Sprintf("w7s%d", i)
	return fmt.Sprintf("[[projection]]\n# %s: W7's slow projection (bench/w7.go).\nname     = %q\nversion  = 1\non_error = \"dead_letter\"\n\n", name, name) +
		w7Record(i) + w7SleepRule(ms)
}

// w7SleepRule is the slow projection's rule: w7SleepSQL, its argument
// the event's position when it reads one.
func w7SleepRule(ms float64) string {
	q := w7SleepSQL(ms)
	r := fmt.Sprintf(`
  [[projection.rule]]
  name = "slow"
  op   = "sql"
  sql  = %q
`, q)
	if strings.Contains(q, "$1") {
		r += "  args = [\"position\"]\n"
	}
	return r
}

// w7SleepSQL is a statement that sleeps ms on average over consecutive
// positions ($1). pg_sleep waits in whole milliseconds: it rounds what is
// left up to one, and its wait may end a hair before the time asked for,
// which costs one more (pg_sleep(0.001) takes 2 ms). So it is asked for
// half a millisecond less than the whole milliseconds wanted, and a
// fraction of a millisecond is a share of the events that sleep one more.
func w7SleepSQL(ms float64) string {
	whole := math.Floor(ms)
	pct := int(math.Round((ms - whole) * 100))
	if pct == 100 {
		whole, pct = whole+1, 0
	}
	secs := func(ms float64) float64 { return max(ms-0.5, 0) / 1000 }
	if pct == 0 {
		return fmt.Sprintf("SELECT pg_sleep(%g)", secs(whole))
	}
	return fmt.Sprintf("SELECT pg_sleep(CASE WHEN $1::bigint %% 100 < %d THEN %g ELSE %g END)", pct, secs(whole+1), secs(whole))
}

// w7DDL is the read models of the W7 projections among targets ("" when
// there are none).
func w7DDL(targets []target) string {
	var sb strings.Builder
	for _, t := range targets {
		kind, i, ok := w7Projection(t.projection)
		switch {
		case !ok:
		case kind == "l" || kind == "s":
			fmt.Fprintf(&sb, "\nCREATE TABLE IF NOT EXISTS w7_live_%d (event_id uuid PRIMARY KEY, stream_id text NOT NULL);", i)
		case kind == "r":
			for j := 1; j <= i; j++ {
				fmt.Fprintf(&sb, "\nCREATE TABLE IF NOT EXISTS w7_live_%d (event_id uuid PRIMARY KEY, stream_id text NOT NULL);", j)
			}
		default:
			fmt.Fprintf(&sb, "\nCREATE TABLE IF NOT EXISTS w7_counts_%d (stream_id text PRIMARY KEY, n bigint NOT NULL, last_type text NOT NULL, last_ref varchar(40));", i)
		}
	}
	return sb.String()
}

// w7Projection parses a W7 projection name: w7p<i>, w7l<i>, w7s<i> or
// w7r<n> (one projection of n rules).
func w7Projection(name string) (kind string, i int, ok bool) {
	rest, found := strings.CutPrefix(name, "w7")
	if !found || len(rest) < 2 || !strings.ContainsRune("plsr", rune(rest[0])) {
		return "", 0, false
	}
	i, err := strconv.Atoi(rest[1:])
	return rest[:1], i, err == nil && i > 0
}

// w7Targets registers N projections of a kind in the configuration
// template and returns them as targets.
func (b *bench) w7Targets(kind string, n int) []target {
	out := make([]target, n)
	for i := range n {
		name := fmt.Sprintf("w7%s%d", kind, i+1)
		b.tmpl.projections[name] = w7Block(kind, i+1)
		out[i] = target{projection: name, version: 1}
	}
	return out
}

func (b *bench) w7(ctx context.Context) error {
	o := b.opts
	n := o.scaled(o.w7Events)
	hist := newHistory(n, o.streams, o.active)
	hist.poison = o.w7Poison
	n = hist.events()
	f := &w7Figures{Events: n, TxEvents: o.w5TxEvents, LiveRate: o.w7Rate}
	w := b.res.workload("W7", "many projections, one events table",
		fmt.Sprintf("N identical projections (one upsert + inc rule each, into a read model of its own) on one events table: "+
			"WAL catch-up of %s events over %s streams appended in transactions of %d while the engine was stopped, "+
			"for N in %s; then live at %s events/s for %s, for N in %s",
			thousands(n), thousands(hist.streams), o.w5TxEvents, joinInts(o.w7Counts), thousands(int64(o.w7Rate)),
			o.w4Step(), joinInts(o.w7Live))+w7SlowSummary(o), n)
	w.W7 = f
	// Rounds of every N, so that a change of the machine's load between
	// rounds lands on each N alike; each N's median run is its figure.
	runs := map[int][]w7CatchUp{}
	for round := range o.w7Repeat {
		for _, k := range o.w7Counts {
			if o.w7Repeat > 1 {
				say("W7: catch-up round %d of %d", round+1, o.w7Repeat)
			}
			c, err := b.w7CatchUp(ctx, w, hist, k, false)
			if err != nil {
				return fmt.Errorf("catch-up with %d projections: %w", k, err)
			}
			runs[k] = append(runs[k], c)
		}
		for _, k := range o.w7Backfill {
			c, err := b.w7CatchUp(ctx, w, hist, k, true)
			if err != nil {
				return fmt.Errorf("backfill with %d projections: %w", k, err)
			}
			runs[-k] = append(runs[-k], c)
		}
	}
	for _, k := range o.w7Counts {
		if _, done := runs[k]; done {
			f.CatchUp = append(f.CatchUp, w7Median(runs[k]))
			delete(runs, k) // a count given twice is reported once
		}
	}
	for _, k := range o.w7Backfill {
		if _, done := runs[-k]; done {
			f.Backfill = append(f.Backfill, w7Median(runs[-k]))
			delete(runs, -k)
		}
	}
	if err := b.write(); err != nil {
		return err
	}
	w7VsOne(f.CatchUp)
	w7VsOne(f.Backfill)
	// Live steps in rounds as well: one 60 s step's p99 moves by 10% and
	// more between back-to-back runs of the same binary.
	type liveRun struct {
		l  w7Live
		sl *w7Slow
	}
	// A step is keyed by its k, negative for one projection of k rules
	// (-w7-rules), which runs right after the k projections' step.
	live := map[int][]liveRun{}
	var order []int
	for round := range o.w7Repeat {
		for _, k := range o.w7Live {
			if o.w7Repeat > 1 {
				say("W7: live round %d of %d", round+1, o.w7Repeat)
			}
			steps := []w7Variant{w7Plain}
			if o.w7Rules && k > 1 {
				steps = append(steps, w7OneOfK)
			}
			for _, v := range steps {
				l, sl, err := b.w7LiveRun(ctx, k, v)
				if err != nil {
					return fmt.Errorf("live with %d projections: %w", k, err)
				}
				key := k
				if v == w7OneOfK {
					key = -k
				}
				if round == 0 {
					order = append(order, key)
				}
				live[key] = append(live[key], liveRun{l, sl})
			}
		}
	}
	for _, key := range order {
		runs, done := live[key]
		if !done {
			continue
		}
		delete(live, key)
		m := medianBy(runs, func(r liveRun) float64 { return r.l.Step.P99 })
		for _, r := range runs {
			m.l.RunsP99 = append(m.l.RunsP99, r.l.Step.P99)
		}
		f.Live = append(f.Live, m.l)
		if m.sl != nil {
			f.Slow = append(f.Slow, *m.sl)
		}
	}
	if err := b.write(); err != nil {
		return err
	}
	if w7SlowSummary(o) != "" {
		_, sl, err := b.w7LiveRun(ctx, w7SlowN, w7SlowLast)
		if err != nil {
			return fmt.Errorf("live with %d projections, one slow: %w", w7SlowN, err)
		}
		f.Slow = append(f.Slow, *sl)
		if err := b.write(); err != nil {
			return err
		}
	}
	for _, l := range f.Live {
		if l.Projections != 1 || l.Rules > 0 || l.Step.P99 <= 0 {
			continue
		}
		for i := range f.Live {
			f.Live[i].P99VsOne = f.Live[i].Step.P99 / l.Step.P99
		}
	}
	return nil
}

// w7CatchUp runs W7's catch-up with k projections: from the WAL, or with
// backfill from the snapshot of a first start on the filled events table
// (-w7-backfill).
func (b *bench) w7CatchUp(ctx context.Context, w *Workload, hist history, k int, backfill bool) (w7CatchUp, error) {
	id := fmt.Sprintf("W7c%d", k)
	if backfill {
		id = fmt.Sprintf("W7b%d", k)
	}
	targets := b.w7Targets("p", k)
	db, cfg, err := b.setup(ctx, id, targets)
	if err != nil {
		return w7CatchUp{}, err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	if !backfill {
		say("W7: %d projection(s): first start on the empty events table …", k)
		if err := b.firstStartEmpty(ctx, db, cfg, filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-first-start.log"), targets); err != nil {
			return w7CatchUp{}, err
		}
	}
	if err := b.fill(ctx, w, db, hist, b.opts.w5TxEvents); err != nil {
		return w7CatchUp{}, err
	}
	n := hist.events()
	c := w7CatchUp{Projections: k, Events: n, Load: loadAverage(), PGPerEventProj: -1}
	if backfill {
		say("W7: %d projection(s): first start and backfill (load %s) …", k, c.Load)
	} else {
		say("W7: %d projection(s): engine restart and catch-up (load %s) …", k, c.Load)
	}
	logPath := filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-engine.log")
	// -profile: the backfill runs in-process under the CPU profiler.
	r, err := b.measure(ctx, db, b.starter(id, cfg, logPath, backfill), targets, n, false)
	if err != nil {
		return c, err
	}
	w.Statements = r.statements // with -statements: those of the last (largest) N
	per := float64(n) * float64(k)
	c.Seconds = r.duration.Seconds()
	c.FirstSeconds = c.Seconds
	for _, d := range r.reached {
		c.FirstSeconds = min(c.FirstSeconds, d.Seconds())
	}
	c.CPUPerEventProj = us(r.cpu) / per
	if r.pgOK {
		c.PGPerEventProj = us(r.pgCPU) / per
	}
	c.PeakRSSMB = mb(r.at.hwm)
	c.OtherCores = r.otherCores
	if c.DifferingRows, err = w7Check(ctx, db, k); err != nil {
		return c, err
	}
	if c.Poison, c.DeadLetterDiff, err = w7DeadLetters(ctx, db, targets); err != nil {
		return c, err
	}
	say("W7: %d projection(s): caught up in %.2f s (first %.2f s), engine %.1f and PG %s µs CPU per event·projection, differing rows %v, %d poison events, dead letters differing %v",
		k, c.Seconds, c.FirstSeconds, c.CPUPerEventProj, optFloat(c.PGPerEventProj), c.DifferingRows, c.Poison, c.DeadLetterDiff)
	return c, nil
}

// w7VsOne sets each run's ratios to the run with one projection.
func w7VsOne(cs []w7CatchUp) {
	for _, c := range cs {
		if c.Projections != 1 {
			continue
		}
		for i := range cs {
			cs[i].SecondsVsOne = cs[i].Seconds / c.Seconds
			if c.PGPerEventProj > 0 && cs[i].PGPerEventProj >= 0 {
				cs[i].PGVsOne = cs[i].PGPerEventProj / c.PGPerEventProj
			}
		}
	}
}

// w7Median returns the run of median catch-up time (the lower middle of an
// even number), with every run's time in Runs.
func w7Median(runs []w7CatchUp) w7CatchUp {
	m := medianBy(runs, func(c w7CatchUp) float64 { return c.Seconds })
	m.Runs = nil
	for _, r := range runs {
		m.Runs = append(m.Runs, r.Seconds)
	}
	return m
}

// w7Check compares each w7_counts_<i> with the read model computed by SQL
// from the events table (EXCEPT ALL both ways) and returns, per
// projection, how many rows differ.
func w7Check(ctx context.Context, db *database, k int) ([]int64, error) {
	if _, err := db.pool.Exec(ctx, `DROP TABLE IF EXISTS w7_expected;
CREATE TABLE w7_expected AS SELECT stream_id::text AS stream_id, count(*)::bigint AS n,
  (array_agg(type::text ORDER BY position DESC))[1] AS last_type,
  (array_agg(coalesce(data->>'reference', '') ORDER BY position DESC))[1] AS last_ref
FROM events WHERE NOT `+w7Bad+` GROUP BY 1`); err != nil {
		return nil, fmt.Errorf("expected read model: %w", err)
	}
	out := make([]int64, k)
	for i := range k {
		t := pgx.Identifier{fmt.Sprintf("w7_counts_%d", i+1)}.Sanitize()
		err := db.pool.QueryRow(ctx, fmt.Sprintf(`SELECT
  (SELECT count(*) FROM (SELECT stream_id, n, last_type, last_ref::text FROM %[1]s EXCEPT ALL TABLE w7_expected) a)
+ (SELECT count(*) FROM (TABLE w7_expected EXCEPT ALL SELECT stream_id, n, last_type, last_ref::text FROM %[1]s) b)`, t)).Scan(&out[i])
		if err != nil {
			return nil, fmt.Errorf("compare %s: %w", t, err)
		}
		if out[i] != 0 {
			say("W7: WARNING: w7_counts_%d differs from the SQL expectation in %d rows", i+1, out[i])
		}
	}
	return out, nil
}

// w7Bad is the predicate of a W7 poison event (history.poison): a
// reference too long for the read models' varchar(40).
const w7Bad = `(type IN ('Deposited', 'Withdrawn') AND length(data->>'reference') > 40)`

// w7DeadLetters returns how many poison events the events table holds
// and, per target, how many positions its dead letters and the poison
// events do not share (both ways): 0 when it dead-lettered exactly them.
func w7DeadLetters(ctx context.Context, db *database, targets []target) (int64, []int64, error) {
	var poison int64
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE `+w7Bad).Scan(&poison); err != nil {
		return 0, nil, fmt.Errorf("poison events: %w", err)
	}
	out := make([]int64, len(targets))
	for i, t := range targets {
		err := db.pool.QueryRow(ctx, `WITH d AS (SELECT position FROM pgscribe.dead_letters WHERE projection = $1 AND version = $2),
p AS (SELECT position FROM events WHERE `+w7Bad+`)
SELECT (SELECT count(*) FROM (TABLE d EXCEPT ALL TABLE p) a) + (SELECT count(*) FROM (TABLE p EXCEPT ALL TABLE d) b)`,
			t.projection, t.version).Scan(&out[i])
		if err != nil {
			return 0, nil, fmt.Errorf("dead letters of %s: %w", t, err)
		}
		if out[i] != 0 {
			say("W7: WARNING: %s's dead letters differ from the poison events in %d positions", t, out[i])
			rows, err := db.pool.Query(ctx, `SELECT error_kind, left(error_message, 200), count(*) FROM pgscribe.dead_letters
WHERE projection = $1 AND version = $2 GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 3`, t.projection, t.version)
			if err != nil {
				return 0, nil, fmt.Errorf("dead letters of %s: %w", t, err)
			}
			var kind, msg string
			var n int64
			if _, err := pgx.ForEachRow(rows, []any{&kind, &msg, &n}, func() error {
				say("W7: %s: %d dead letters %s: %s", t, n, kind, msg)
				return nil
			}); err != nil {
				return 0, nil, fmt.Errorf("dead letters of %s: %w", t, err)
			}
		}
	}
	return poison, out, nil
}

// w7SlowN is how many projections W7's slow-member step runs.
const w7SlowN = 8

// w7SlowSummary is the slow-member step in W7's description ("" when it
// does not run).
func w7SlowSummary(o options) string {
	if !o.w7Slow || !slices.Contains(o.w7Live, w7SlowN) {
		return ""
	}
	return fmt.Sprintf("; then live with %d, one of which sleeps %g ms per event in PostgreSQL", w7SlowN, o.w7SlowMS)
}

// w7Variant is what a W7 live step runs besides k projections of one rule.
type w7Variant int

const (
	w7Plain    w7Variant = iota
	w7SlowLast           // the k-th projection is slow (-w7-slow)
	w7OneOfK             // one projection of k rules instead (-w7-rules)
)

// w7LiveRun runs W7's live step with k projections; with w7SlowLast, the k-th
// is w7s<k>, which sleeps in PostgreSQL per event. With -w7-slow and k =
// w7SlowN it also returns the slow-member comparison's case.
func (b *bench) w7LiveRun(ctx context.Context, k int, v w7Variant) (w7Live, *w7Slow, error) {
	id := fmt.Sprintf("W7l%d", k)
	what := fmt.Sprintf("W7 live, %d projection(s)", k)
	var targets []target
	rules := 0
	if v == w7OneOfK {
		id, what, rules = fmt.Sprintf("W7r%d", k), fmt.Sprintf("W7 live, one projection of %d rules", k), k
		name := fmt.Sprintf("w7r%d", k)
		b.tmpl.projections[name] = w7Block("r", k)
		targets = []target{{projection: name, version: 1}}
	} else {
		targets = b.w7Targets("l", k)
	}
	var sl *w7Slow
	if b.opts.w7Slow && k == w7SlowN && v != w7OneOfK {
		sl = &w7Slow{Case: "none slow"}
	}
	if v == w7SlowLast {
		id += "s"
		name := fmt.Sprintf("w7s%d", k)
		b.tmpl.projections[name] = w7SlowBlock(k, b.opts.w7SlowMS)
		targets[k-1] = target{projection: name, version: 1}
		what += fmt.Sprintf(", %s slow", name)
		sl.Case, sl.SleepMS = name+" slow", b.opts.w7SlowMS
	}
	say("%s …", what)
	lv, err := b.startLive(ctx, id, targets)
	if err != nil {
		return w7Live{}, nil, err
	}
	defer lv.close(ctx)
	lv.what = what
	for i := range k {
		lv.tables = append(lv.tables, fmt.Sprintf("w7_live_%d", i+1))
	}
	total0 := lv.total
	var (
		behind map[string]int64
		rss    *rssSampler
	)
	if sl != nil {
		rss = sampleRSS(lv.p.pid, 500*time.Millisecond)
		defer rss.stop()
		lv.stepEnd = func(ctx context.Context, _, _ int64) error {
			rss.stop()
			var e error
			behind, e = w7Behind(ctx, lv.db, targets, lv.total)
			return e
		}
	}
	row, err := b.liveStep(ctx, lv, b.opts.w7Rate, nil)
	if err != nil {
		return w7Live{}, nil, err
	}
	say("%s: worst table's p99 %.1f ms; the producer's commits p50 %.1f ms, p99 %.1f ms", what, row.WorstP99, row.AppCommitP50, row.AppCommitP99)
	if err := latencySeconds(ctx, lv.db, lv.tables, lv.lo, lv.hi, filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-seconds.csv")); err != nil {
		return w7Live{}, nil, err
	}
	if sl != nil {
		if err := sl.fill(ctx, lv, row, targets, behind, lv.total-total0); err != nil {
			return w7Live{}, nil, err
		}
		sl.RSSFirstHalfMB, sl.RSSSecondHalfMB = rss.halves()
		// The others' latency per second: where their p99 comes from (the
		// wait before a detach, or what follows it).
		if err := latencySeconds(ctx, lv.db, lv.tables[:k-1], lv.lo, lv.hi, filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-others-seconds.csv")); err != nil {
			return w7Live{}, nil, err
		}
		if err := rss.write(filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-rss.csv")); err != nil {
			return w7Live{}, nil, err
		}
		say("%s: the 7 others p50 %.1f ms, p99 %.1f ms; %s p99 %.1f ms; behind when the producer stopped: others %d, %s %d; applied %.0f/s (slowest other) and %.0f/s; peak RSS %.1f MB (step's halves %.1f, %.1f MB)",
			what, sl.OthersP50, sl.OthersP99, targets[k-1].projection, sl.LastP99, sl.OthersBacklog, targets[k-1].projection,
			sl.LastBacklog, sl.OthersRate, sl.LastRate, sl.PeakRSSMB, sl.RSSFirstHalfMB, sl.RSSSecondHalfMB)
	}
	if sts, err := b.topStatements(ctx, lv.db); err == nil {
		for _, st := range sts {
			say("W7 live %d: %8d calls %10.1f ms %s", k, st.Calls, st.TotalMS, truncate(st.Query, 120))
		}
	}
	return w7Live{Projections: k, Rules: rules, Step: row}, sl, lv.p.stop()
}

// w7Behind returns, per target, how many of the total events it has not
// accounted for, read in one snapshot.
func w7Behind(ctx context.Context, db *database, targets []target, total int64) (map[string]int64, error) {
	names := make([]string, len(targets))
	for i, t := range targets {
		names[i] = t.projection
	}
	rows, err := db.pool.Query(ctx, `SELECT projection, sum(applied + skipped + dead_lettered)::bigint
FROM pgscribe.cursors WHERE version = 1 AND projection = ANY($1) GROUP BY projection`, names)
	if err != nil {
		return nil, fmt.Errorf("backlog: %w", err)
	}
	out := make(map[string]int64, len(targets))
	for _, n := range names {
		out[n] = total
	}
	var name string
	var got int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &got}, func() error {
		out[name] = total - got
		return nil
	}); err != nil {
		return nil, fmt.Errorf("backlog: %w", err)
	}
	return out, nil
}

// fill measures the slow-member case of a finished step: latencies of the
// others pooled and of the last, from the step's rows; backlogs and
// applied rates from behind (read when the producer stopped, sent events
// after the warm-up).
func (sl *w7Slow) fill(ctx context.Context, lv *liveRun, row LatencyRow, targets []target, behind map[string]int64, sent int64) error {
	k := len(targets)
	var others, last LatencyRow
	if err := latencyOver(ctx, lv.db, lv.tables[:k-1], lv.lo, lv.hi, &others); err != nil {
		return err
	}
	if err := latencyOver(ctx, lv.db, lv.tables[k-1:], lv.lo, lv.hi, &last); err != nil {
		return err
	}
	sl.Events, sl.Achieved, sl.PeakRSSMB, sl.Load = row.Events, row.Achieved, row.PeakRSSMB, row.Load
	sl.OthersP50, sl.OthersP99, sl.OthersWorst, sl.OthersMax = others.P50, others.P99, others.WorstP99, others.Max
	sl.LastP50, sl.LastP99, sl.LastMax = last.P50, last.P99, last.Max
	secs := lv.step.Seconds()
	sl.OthersRate = -1
	for i, t := range targets {
		r := float64(sent-behind[t.projection]) / secs
		if i == k-1 {
			sl.LastBacklog, sl.LastRate = behind[t.projection], r
			continue
		}
		sl.OthersBacklog = max(sl.OthersBacklog, behind[t.projection])
		if sl.OthersRate < 0 || r < sl.OthersRate {
			sl.OthersRate = r
		}
	}
	return nil
}

// latencyOver fills the percentiles of the commit-to-commit latency of
// the events with position in (lo, hi] over the rows of all tables pooled
// (one row per event in each), and WorstP99 with the highest p99 of a
// single table. Every table must have a row of every event.
func latencyOver(ctx context.Context, db *database, tables []string, lo, hi int64, row *LatencyRow) error {
	parts := make([]string, len(tables))
	for i, t := range tables {
		parts[i] = fmt.Sprintf(`SELECT %d AS t, extract(epoch FROM pg_xact_commit_timestamp(a.xmin) - pg_xact_commit_timestamp(e.xmin)) * 1000 AS ms
  FROM events e JOIN %s a ON a.event_id = e.id WHERE e.position > $1 AND e.position <= $2`, i, pgx.Identifier{t}.Sanitize())
	}
	rows, err := db.pool.Query(ctx, `
SELECT t, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
FROM (`+strings.Join(parts, "\nUNION ALL\n")+`) l
GROUP BY GROUPING SETS ((t), ())`, lo, hi)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	var (
		t                *int
		count            int64
		p50, p99, maxMS  float64
		measured, groups int64
	)
	_, err = pgx.ForEachRow(rows, []any{&t, &count, &p50, &p99, &maxMS}, func() error {
		if t == nil {
			measured, row.P50, row.P99, row.Max = count, p50, p99, maxMS
		} else {
			groups++
			row.WorstP99 = max(row.WorstP99, p99)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	var want int64
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE position > $1 AND position <= $2`, lo, hi).Scan(&want); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	if measured != want*int64(len(tables)) || (want > 0 && groups != int64(len(tables))) {
		return fmt.Errorf("latency: %d read-model rows for %d events in %d tables", measured, want, len(tables))
	}
	return nil
}

// latencySeconds writes the step's latency per second of event commit, the
// rows of every table pooled: a p99 made of a few stalls (a burst of slow
// seconds) reads differently from one made of queueing (every second's
// p99 high).
func latencySeconds(ctx context.Context, db *database, tables []string, lo, hi int64, path string) error {
	parts := make([]string, len(tables))
	for i, t := range tables {
		parts[i] = fmt.Sprintf(`SELECT pg_xact_commit_timestamp(e.xmin) AS at,
  extract(epoch FROM pg_xact_commit_timestamp(a.xmin) - pg_xact_commit_timestamp(e.xmin)) * 1000 AS ms
  FROM events e JOIN %s a ON a.event_id = e.id WHERE e.position > $1 AND e.position <= $2`, pgx.Identifier{t}.Sanitize())
	}
	rows, err := db.pool.Query(ctx, `
SELECT to_char(date_trunc('second', at) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'), count(*),
  percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), max(ms)
FROM (`+strings.Join(parts, "\nUNION ALL\n")+`) l GROUP BY 1 ORDER BY 1`, lo, hi)
	if err != nil {
		return fmt.Errorf("latency per second: %w", err)
	}
	var (
		sb            strings.Builder
		second        string
		n             int64
		p50, p99, top float64
	)
	sb.WriteString("second,rows,p50_ms,p99_ms,max_ms\n")
	_, err = pgx.ForEachRow(rows, []any{&second, &n, &p50, &p99, &top}, func() error {
		fmt.Fprintf(&sb, "%s,%d,%.2f,%.2f,%.2f\n", second, n, p50, p99, top)
		return nil
	})
	if err != nil {
		return fmt.Errorf("latency per second: %w", err)
	}
	return os.WriteFile(path, []byte(sb.String()), 0o644)
}

// markdown renders W7's two tables.
func (f *w7Figures) markdown(p func(string, ...any)) {
	vs := func(v float64) string {
		if v <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f×", v)
	}
	f.catchUpTable(p, f.CatchUp, "WAL catch-up", "catch-up s")
	f.catchUpTable(p, f.Backfill, "Backfill (the same events appended before the engine's first start: read from the snapshot)", "backfill s")
	if len(f.Live) > 0 {
		p("Live, W4's producer at %s events/s for one W4 step, N projections each writing a row per event (keyed by the "+
			"event id) into its own table. Latency is commit to commit, read by PostgreSQL as in W4; *p50* and *p99* are "+
			"over the rows of all N tables pooled (N per event), *worst table p99* is the highest p99 of a "+
			"single table's rows (one table per projection, or per rule of the one projection of N rules). CPU is µs per event (not per projection), over the step and its catch-up. "+
			"*app commit* is the producer's own commits over the step (each tick's INSERT, autocommitted): what the "+
			"application's writes see of the load.",
			thousands(int64(f.LiveRate)))
		p("")
		for _, l := range f.Live {
			if l.Rules > 0 {
				p("*1 (N rules)* is the reference for the projections' own transactions (`-w7-rules`): one projection " +
					"whose N rules write the same N tables, so every table's row of an event commits in one transaction " +
					"per batch, with one cursor upsert and one fence check, where N projections commit N transactions, " +
					"each with its own. Its *p99 vs one* is against the one projection of one rule.")
				p("")
				break
			}
		}
		runsNote(p, len(f.Live[0].RunsP99), "each row is that N's run with the median p99, *runs p99* every run's in order.")
		p("| projections | events | achieved events/s | p50 ms | p99 ms | p99 vs one | worst table p99 ms | max ms | CPU µs/event | PG CPU µs/event | app commit p50 / p99 ms | load | runs p99 ms |")
		p("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|---|")
		for _, l := range f.Live {
			s := l.Step
			who := fmt.Sprint(l.Projections)
			if l.Rules > 0 {
				who = fmt.Sprintf("1 (%d rules)", l.Rules)
			}
			p("| %s | %s | %s | %.1f | %.1f | %s | %.1f | %.1f | %.1f | %s | %.1f / %.1f | %s | %s |", who, thousands(s.Events),
				thousands(int64(s.Achieved)), s.P50, s.P99, vs(l.P99VsOne), s.WorstP99, s.Max, s.CPUPerEvent,
				optFloat(s.PGCPUPerEvent), s.AppCommitP50, s.AppCommitP99, s.Load, joinFloats(l.RunsP99, "%.1f"))
		}
		p("")
	}
	if len(f.Slow) > 0 {
		f.slowMarkdown(p)
	}
}

// runsNote says, when each N ran more than once (-w7-repeat), which of its
// runs a table shows: rows ends the sentence.
func runsNote(p func(string, ...any), runs int, rows string) {
	if runs > 1 {
		p("Each N ran %d times, in rounds of every N; "+rows, runs)
		p("")
	}
}

// slowMarkdown renders W7's slow-member comparison.
func (f *w7Figures) slowMarkdown(p func(string, ...any)) {
	var slowMS float64
	for _, c := range f.Slow {
		slowMS = max(slowMS, c.SleepMS)
	}
	p("One slow member (`-w7-slow`): the live step again with %d projections, the 8th of which (w7s%d) also runs an `sql` "+
		"rule that sleeps in PostgreSQL %.2f ms per event on average (`pg_sleep`, which waits whole milliseconds: a "+
		"fraction is a share of the events, by position, that sleep one more), "+
		"so that its one partition applies fewer events per second than the producer's %s. The projections share one "+
		"group: one slot, one decode, a bounded queue (1,024 messages) per member before its partitions' own queues, "+
		"and the group's stream waits for a member whose queues are full. *none slow* is the normal %d run, whose 8th (w7l%d) is like the others. Latency "+
		"as above; *others* are projections 1–7 pooled; *behind at the end* is the events not yet accounted for "+
		"(cursors) when the producer stopped, for the others the furthest behind of the 7; *applied/s* is over the "+
		"step (the others: the slowest of the 7); the slow one's backlog less the others' is about what the engine "+
		"holds for it (its queues), the rest waits in PostgreSQL's WAL. *peak RSS* is the engine's over its whole run "+
		"(warm-up and catch-up included), *RSS by half* the highest of its RSS sampled every 500 ms in each half of the step.",
		w7SlowN, w7SlowN, slowMS, thousands(int64(f.LiveRate)), w7SlowN, w7SlowN)
	p("")
	p("| case | p50 ms (7 others) | p99 ms (7 others) | 8th's p99 ms | behind at the end: others / 8th | applied/s: others / 8th | peak RSS MB | RSS MB by half of the step | load |")
	p("|---|--:|--:|--:|--:|--:|--:|--:|---|")
	for _, c := range f.Slow {
		p("| %s | %.1f | %.1f | %.1f | %s / %s | %s / %s | %.1f | %.1f / %.1f | %s |", c.Case, c.OthersP50, c.OthersP99,
			c.LastP99, thousands(c.OthersBacklog), thousands(c.LastBacklog), thousands(int64(c.OthersRate)),
			thousands(int64(c.LastRate)), c.PeakRSSMB, c.RSSFirstHalfMB, c.RSSSecondHalfMB, c.Load)
	}
	p("")
	if len(f.Slow) == 2 && f.Slow[0].OthersP99 > 0 && f.Slow[0].PeakRSSMB > 0 {
		n, s := f.Slow[0], f.Slow[1]
		verdict := "they waited for it: once its queues were full the group's stream went at its pace (a projection " +
			"that must never wait for another needs a group of its own)"
		if s.OthersP99 < 2*n.OthersP99 {
			verdict = "they hardly waited for it: its queues took its backlog within the step"
		}
		memory := "no higher in the step's second half than in its first: bounded"
		if s.RSSSecondHalfMB > 1.1*s.RSSFirstHalfMB {
			memory = "still growing in the step's second half (the slow one's queues may still have been filling: " +
				"a longer step, -w4-seconds, shows whether it levels off)"
		}
		p("With one slow member the 7 others' p99 went from %.1f to %.1f ms (%.0f×), their p50 from %.1f to %.1f ms: "+
			"%s. The engine's peak RSS went from %.1f to %.1f MB (%+.1f MB), and was %s.",
			n.OthersP99, s.OthersP99, s.OthersP99/n.OthersP99, n.OthersP50, s.OthersP50, verdict, n.PeakRSSMB,
			s.PeakRSSMB, s.PeakRSSMB-n.PeakRSSMB, memory)
		p("")
	}
}

// w7DeadLettered renders a catch-up's dead letters against its poison.
func w7DeadLettered(poison int64, diff []int64) string {
	var bad []string
	for i, d := range diff {
		if d != 0 {
			bad = append(bad, fmt.Sprintf("w7p%d: %d positions", i+1, d))
		}
	}
	if len(bad) > 0 {
		return fmt.Sprintf("%s poison, **differ** (%s)", thousands(poison), strings.Join(bad, ", "))
	}
	return fmt.Sprintf("%s poison, exact (%d of %d)", thousands(poison), len(diff), len(diff))
}

func w7Identical(diff []int64) string {
	var bad []string
	for i, d := range diff {
		if d != 0 {
			bad = append(bad, fmt.Sprintf("w7p%d: %d rows", i+1, d))
		}
	}
	if len(bad) == 0 {
		return fmt.Sprintf("identical (%d of %d)", len(diff), len(diff))
	}
	return "**differ** (" + strings.Join(bad, ", ") + ")"
}

// medianBy returns the run whose key is the median (the lower one of an
// even number of runs).
func medianBy[T any](runs []T, key func(T) float64) T {
	sorted := slices.Clone(runs)
	slices.SortStableFunc(sorted, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	return sorted[(len(sorted)-1)/2]
}

// joinFloats formats each of v with format, comma-separated.
func joinFloats(v []float64, format string) string {
	s := make([]string, len(v))
	for i, f := range v {
		s[i] = fmt.Sprintf(format, f)
	}
	return strings.Join(s, ", ")
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}

// positiveInts parses a comma-separated list of positive integers.
func positiveInts(flagName, s string) ([]int, error) {
	var out []int
	if strings.TrimSpace(s) == "" {
		return nil, nil // none: that part of W7 is not run
	}
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive integer", flagName, f)
		}
		out = append(out, n)
	}
	return out, nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// catchUpTable is W7's table of the runs cs (catch-up or backfill).
func (f *w7Figures) catchUpTable(p func(string, ...any), cs []w7CatchUp, what, col string) {
	vs := func(v float64) string {
		if v <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2f×", v)
	}
	if len(cs) > 0 {
		p(what+" of %s events (transactions of %d) by N identical projections, each into its own read model. "+
			"*"+col+"* is the engine's start until every projection's cursors account for every event (the first "+
			"projection's in brackets); CPU is µs per event and projection: the engine's, and the whole PostgreSQL "+
			"server's over the same run (its walsenders' decoding included); *vs one* is against N = 1. *read models "+
			"identical*: each projection's table against one computed by SQL from the events table (per stream: count, "+
			"last type and last reference of the events that are not poison), `EXCEPT ALL` both ways. *dead letters*: "+
			"the appended poison events (a reference of 48 characters for the read models' `varchar(40)`, "+
			"`-w7-poison` per 1,000 deposits and withdrawals) and whether every projection dead-lettered exactly "+
			"those positions.", thousands(f.Events), f.TxEvents)
		p("")
		runsNote(p, len(cs[0].Runs), "the figures are each N's median run, *runs* every run's time in order.")
		p("| projections | " + col + " | vs one | engine CPU µs per event·projection | PG CPU µs per event·projection | vs one | peak RSS MB | other cores | read models identical | dead letters | load | runs s |")
		p("|--:|--:|--:|--:|--:|--:|--:|--:|---|---|---|---|")
		for _, c := range cs {
			p("| %d | %.2f (%.2f) | %s | %.1f | %s | %s | %.1f | %s | %s | %s | %s | %s |", c.Projections, c.Seconds, c.FirstSeconds,
				vs(c.SecondsVsOne), c.CPUPerEventProj, optFloat(c.PGPerEventProj), vs(c.PGVsOne), c.PeakRSSMB,
				optCores(c.OtherCores), w7Identical(c.DifferingRows), w7DeadLettered(c.Poison, c.DeadLetterDiff), c.Load,
				joinFloats(c.Runs, "%.2f"))
		}
		p("")
	}
}
