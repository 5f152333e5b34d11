package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
)

// live is W4: the engine runs live (activity projection: one row per event,
// keyed by event id) while a paced producer appends at each rate in turn.
// Latency is measured by PostgreSQL alone, independent of the engine's
// clocks: from the commit of the event's transaction to the commit of the
// transaction that wrote its read-model row (track_commit_timestamp).
func (b *bench) live(ctx context.Context) error {
	o := b.opts
	targets := targetsOf([]model{activityModel}, 1)
	step := o.w4Step()
	w := b.res.workload("W4", "live: paced producer, end-to-end latency (activity)",
		fmt.Sprintf("%s per rate; %d producer connections each committing what is due every %s, over %s streams",
			step, o.w4Producers, o.w4Tick, thousands(o.streams)), 0)

	lv, err := b.startLive(ctx, "W4", targets)
	if err != nil {
		return err
	}
	defer lv.close(ctx)
	db, cfg, p, prod := lv.db, lv.cfg, lv.p, lv.prod
	for _, rate := range o.w4Rates {
		row, err := b.liveStep(ctx, lv, rate, nil)
		if err != nil {
			return err
		}
		w.Latency = append(w.Latency, row)
	}
	if w.Statements, err = b.topStatements(ctx, db); err != nil {
		return err
	}
	if o.w4Wait {
		if err := b.waitStep(ctx, w, lv, o.w4Rates[0]); err != nil {
			return fmt.Errorf("wait step: %w", err)
		}
	}
	if o.w4Paired {
		if err := b.pairedSteps(ctx, w, lv, cfg); err != nil {
			return err
		}
	}
	if err := p.stop(); err != nil {
		return fmt.Errorf("engine stop: %w", err)
	}
	if !o.refs {
		return nil
	}
	c, err := config.Load(cfg)
	if err != nil {
		return err
	}
	w.Floor, err = b.decodeFloor(ctx, db, prod, c.Source.Publication, step)
	return err
}

// startLive sets up workload id's database and configuration, starts the
// engine on it, waits until it is live, and warms it up with a producer
// (connections, prepared statements, caches). Its close drops the database.
func (b *bench) startLive(ctx context.Context, id string, targets []target) (*liveRun, error) {
	o := b.opts
	db, cfg, err := b.setup(ctx, id, targets)
	if err != nil {
		return nil, err
	}
	lv := &liveRun{b: b, db: db, cfg: cfg, targets: targets, step: o.w4Step()}
	fail := func(err error) (*liveRun, error) { lv.close(ctx); return nil, err }
	if lv.p, err = startBinary(o.bin, cfg, filepath.Join(o.rawDir, strings.ToLower(id)+"-engine.log")); err != nil {
		return fail(err)
	}
	p := lv.p
	if err := b.waitLive(ctx, db, p, targets); err != nil {
		return fail(err)
	}
	if err := b.resetStatements(ctx, db); err != nil {
		return fail(err)
	}
	if lv.prod, err = newProducer(ctx, db, o.w4Producers, o.streams, o.w4Tick); err != nil {
		return fail(err)
	}
	if lv.total, err = lv.prod.run(ctx, 200, 2*time.Second); err != nil {
		return fail(err)
	}
	if _, _, err := b.waitAccounted(ctx, db, p, targets, lv.total, false); err != nil {
		return fail(err)
	}
	return lv, nil
}

// close stops the producer and the engine (if still running) and drops
// the database.
func (lv *liveRun) close(ctx context.Context) {
	if lv.prod != nil {
		lv.prod.close(context.WithoutCancel(ctx))
	}
	if lv.p != nil {
		_ = lv.p.stop()
	}
	lv.b.srv.drop(context.WithoutCancel(ctx), lv.db)
}

// liveRun is what W4's steps share: the engine, the producer, and the
// events appended so far.
type liveRun struct {
	b       *bench
	db      *database
	cfg     string // the engine's configuration file
	p       *engineProc
	prod    *producer
	targets []target
	step    time.Duration
	total   int64
	table   string   // the read model whose rows time the events; "" = account_activity
	tables  []string // W7: several read models whose rows time the events, pooled (overrides table)
	what    string   // how steps are logged; "" = W4
	// stepEnd, when set, runs as soon as a step's producer has stopped,
	// before the engine is waited for (W7: how far behind each projection
	// is then). lo and hi are the step's events' positions (lo, hi].
	stepEnd func(ctx context.Context, lo, hi int64) error
	lo, hi  int64 // the last step's events' positions (lo, hi]
}

// liveStep runs the producer at rate for one step and measures it. With a
// paired consumer attached it also splits each event's latency (pair) and
// writes the per-event figures to the raw directory.
func (b *bench) liveStep(ctx context.Context, lv *liveRun, rate int, paired *floorConsumer) (LatencyRow, error) {
	row := LatencyRow{TargetRate: rate, Seconds: lv.step.Seconds(), Load: loadAverage()}
	what := "W4"
	if lv.what != "" {
		what = lv.what
	}
	if paired != nil {
		what = "W4 paired"
	}
	say("%s: %d events/s for %s (load %s) …", what, rate, lv.step, row.Load)
	pos0, err := maxPosition(ctx, lv.db)
	if err != nil {
		return row, err
	}
	s0 := b.sample(lv.p)
	start := time.Now()
	sent, err := lv.prod.run(ctx, rate, lv.step)
	if err != nil {
		return row, err
	}
	row.Achieved = float64(sent) / time.Since(start).Seconds()
	row.AppCommitP50, row.AppCommitP99 = lv.prod.commitPercentiles()
	pos1, err := maxPosition(ctx, lv.db)
	if err != nil {
		return row, err
	}
	lv.total += sent
	lv.lo, lv.hi = pos0, pos1
	if lv.stepEnd != nil {
		if err := lv.stepEnd(ctx, pos0, pos1); err != nil {
			return row, err
		}
	}
	s1, _, err := b.waitAccounted(ctx, lv.db, lv.p, lv.targets, lv.total, false)
	if err != nil {
		return row, err
	}
	row.Events = sent
	row.CPUPerEvent = us(s1.cpu-s0.cpu) / float64(sent)
	row.PGCPUPerEvent = -1
	if s0.pgOK && s1.pgOK {
		row.PGCPUPerEvent = us(s1.pgCPU-s0.pgCPU) / float64(sent)
	}
	row.PeakRSSMB = mb(s1.hwm)
	row.OtherCores = otherCores(s0, s1)
	row.Poison = lv.prod.poison
	if len(lv.tables) > 0 {
		err = latencyOver(ctx, lv.db, lv.tables, pos0, pos1, &row)
	} else {
		err = latency(ctx, lv.db, lv.table, pos0, pos1, &row)
	}
	if err != nil {
		return row, err
	}
	if paired != nil {
		evs, err := eventLatencies(ctx, lv.db, pos0, pos1)
		if err != nil {
			return row, err
		}
		arrivals, err := paired.arrivalsIn(ctx, pos0, pos1, 30*time.Second)
		if err != nil {
			return row, err
		}
		if err := pair(evs, arrivals, &row, filepath.Join(b.opts.rawDir, fmt.Sprintf("w4-%d-paired.csv", rate))); err != nil {
			return row, err
		}
		say("%s: %d/s: PostgreSQL delivers p50 %.1f ms, p99 %.1f ms; pgscribe adds p50 %.1f ms, p99 %.1f ms",
			what, rate, row.Paired.DeliversP50, row.Paired.DeliversP99, row.Paired.AddsP50, row.Paired.AddsP99)
	}
	say("%s: %d/s → achieved %.0f/s, p50 %.1f ms, p99 %.1f ms, max %.1f ms", what, rate, row.Achieved, row.P50, row.P99, row.Max)
	return row, nil
}

// pairedSteps runs W4's rates again with a consumer that only receives
// attached (a temporary slot of its own on the engine's publication): per
// event, what PostgreSQL's delivery alone took at that moment (disk
// stalls and CPU contention included) and what the engine added. The
// consumer's walsender decodes everything a second time, which slows the
// engine down measurably (about +0.5 ms at p50 at 5k/s on a 2-core
// machine), so the headline steps run without it.
func (b *bench) pairedSteps(ctx context.Context, w *Workload, lv *liveRun, cfg string) error {
	c, err := config.Load(cfg)
	if err != nil {
		return err
	}
	paired, err := startFloorConsumer(ctx, lv.db.dsn, "pgscribe_bench_paired", c.Source.Publication)
	if err != nil {
		return err
	}
	defer paired.close()
	paired.mu.Lock()
	paired.arrivals = map[int64]time.Time{}
	paired.mu.Unlock()
	for i := range w.Latency {
		row, err := b.liveStep(ctx, lv, w.Latency[i].TargetRate, paired)
		if err != nil {
			return err
		}
		row.Paired.EngineP50, row.Paired.EngineP99, row.Paired.EngineMax = row.P50, row.P99, row.Max
		w.Latency[i].Paired = row.Paired
	}
	return nil
}

func maxPosition(ctx context.Context, db *database) (int64, error) {
	var n int64
	err := db.pool.QueryRow(ctx, "SELECT coalesce(max(position), 0) FROM events").Scan(&n)
	return n, err
}

// latency fills the percentiles of the commit-to-commit latency of the
// events with position in (lo, hi] that table (default account_activity)
// has a row of: all but the poison (a reference too long for W4P's
// varchar(40)), which is dead-lettered.
func latency(ctx context.Context, db *database, table string, lo, hi int64, row *LatencyRow) error {
	if table == "" {
		table = "account_activity"
	}
	var measured, want int64
	err := db.pool.QueryRow(ctx, `
SELECT count(*),
  coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), 0),
  coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY ms), 0),
  coalesce(max(ms), 0),
  (SELECT count(*) FROM events WHERE position > $1 AND position <= $2 AND coalesce(length(data->>'reference'), 0) <= 40)
FROM (SELECT extract(epoch FROM pg_xact_commit_timestamp(a.xmin) - pg_xact_commit_timestamp(e.xmin)) * 1000 AS ms
      FROM events e JOIN `+pgx.Identifier{table}.Sanitize()+` a ON a.event_id = e.id
      WHERE e.position > $1 AND e.position <= $2) l`, lo, hi).Scan(&measured, &row.P50, &row.P99, &row.Max, &want)
	if err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	if measured != want {
		return fmt.Errorf("latency: %d of %d events have a read-model row", measured, want)
	}
	return nil
}

// eventLatency is one W4 event: its position, its commit time, and the
// commit of its read-model row, in µs since the Unix epoch.
type eventLatency struct {
	pos, eventUS, rowUS int64
}

func eventLatencies(ctx context.Context, db *database, lo, hi int64) ([]eventLatency, error) {
	rows, err := db.pool.Query(ctx, `
SELECT e.position,
  (extract(epoch FROM pg_xact_commit_timestamp(e.xmin)) * 1000000)::bigint,
  (extract(epoch FROM pg_xact_commit_timestamp(a.xmin)) * 1000000)::bigint
FROM events e JOIN account_activity a ON a.event_id = e.id
WHERE e.position > $1 AND e.position <= $2
ORDER BY e.position`, lo, hi)
	if err != nil {
		return nil, fmt.Errorf("event latencies: %w", err)
	}
	var out []eventLatency
	var l eventLatency
	_, err = pgx.ForEachRow(rows, []any{&l.pos, &l.eventUS, &l.rowUS}, func() error {
		out = append(out, l)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("event latencies: %w", err)
	}
	return out, nil
}

// pair fills row.Paired from the step's events and the paired consumer's
// arrivals, and writes both to a CSV file of the raw directory (for
// looking at when the tail happens, say against the engine's log). Every
// event has an arrival (arrivalsIn waited for them).
func pair(evs []eventLatency, arrivals map[int64]time.Time, row *LatencyRow, path string) error {
	var out strings.Builder
	out.WriteString("position,event_commit_unix_us,pgscribe_ms,floor_ms\n")
	var floor, adds []float64
	for _, e := range evs {
		eng := float64(e.rowUS-e.eventUS) / 1000
		fl := ""
		if at, ok := arrivals[e.pos]; ok {
			f := float64(at.UnixMicro()-e.eventUS) / 1000
			floor, adds = append(floor, f), append(adds, eng-f)
			fl = fmt.Sprintf("%.3f", f)
		}
		fmt.Fprintf(&out, "%d,%d,%.3f,%s\n", e.pos, e.eventUS, eng, fl)
	}
	if len(floor) > 0 {
		slices.Sort(floor)
		slices.Sort(adds)
		row.Paired = &Paired{
			DeliversP50: percentile(floor, 0.5), DeliversP99: percentile(floor, 0.99), DeliversMax: floor[len(floor)-1],
			AddsP50: percentile(adds, 0.5), AddsP99: percentile(adds, 0.99), AddsMax: adds[len(adds)-1],
		}
	}
	return os.WriteFile(path, []byte(out.String()), 0o644)
}

// producer appends account events at a paced rate over several
// connections. Each connection owns a disjoint set of streams, so stream
// positions never collide, and commits every tick whatever its share of the
// rate says is due by then (an absolute schedule: a slow commit is caught
// up by the next one, not lost).
type producer struct {
	conns   []*pgx.Conn
	tick    time.Duration
	streams int64
	next    [][]int64 // per connection, per owned stream: next stream_position
	cursor  []int     // per connection: next owned stream to write to
	seq     int64     // events appended so far (for payloads)
	poison  float64   // share of deposits and withdrawals with a reference too long for varchar(40)
	mu      sync.Mutex
	commits [][]time.Duration // per connection: each append's round trip (insert and commit) in the last run
}

func newProducer(ctx context.Context, db *database, conns int, streams int64, tick time.Duration) (*producer, error) {
	conns = max(conns, 1)
	p := &producer{tick: tick, streams: streams, next: make([][]int64, conns), cursor: make([]int, conns)}
	for k := 0; k < conns; k++ {
		c, err := pgx.Connect(ctx, db.dsn)
		if err != nil {
			p.close(ctx)
			return nil, err
		}
		p.conns = append(p.conns, c)
		owned := (streams - int64(k) + int64(conns) - 1) / int64(conns)
		p.next[k] = make([]int64, owned)
		for i := range p.next[k] {
			p.next[k][i] = 1
		}
	}
	return p, nil
}

func (p *producer) close(ctx context.Context) {
	for _, c := range p.conns {
		_ = c.Close(ctx)
	}
}

// commitPercentiles returns the p50 and p99 of the last run's appends,
// every connection's pooled, in ms.
func (p *producer) commitPercentiles() (p50, p99 float64) {
	var all []time.Duration
	for _, c := range p.commits {
		all = append(all, c...)
	}
	if len(all) == 0 {
		return 0, 0
	}
	slices.Sort(all)
	at := func(q float64) float64 { return float64(all[int(q*float64(len(all)-1))]) / float64(time.Millisecond) }
	return at(0.5), at(0.99)
}

// run appends rate events/s for d and returns how many it appended.
func (p *producer) run(ctx context.Context, rate int, d time.Duration) (int64, error) {
	share := float64(rate) / float64(len(p.conns))
	start := time.Now()
	sent := make([]int64, len(p.conns))
	errs := make([]error, len(p.conns))
	p.commits = make([][]time.Duration, len(p.conns))
	var wg sync.WaitGroup
	for k := range p.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(p.tick)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					errs[k] = ctx.Err()
					return
				case <-t.C:
				}
				el := min(time.Since(start), d)
				if due := int64(share*el.Seconds()) - sent[k]; due > 0 {
					began := time.Now()
					if err := p.append(ctx, k, due); err != nil {
						errs[k] = err
						return
					}
					p.commits[k] = append(p.commits[k], time.Since(began))
					sent[k] += due
				}
				if el >= d {
					return
				}
			}
		}()
	}
	wg.Wait()
	var total int64
	for k := range sent {
		if errs[k] != nil {
			return total, errs[k]
		}
		total += sent[k]
	}
	return total, nil
}

const appendSQL = `INSERT INTO events (stream_id, stream_position, type, data, metadata)
SELECT s, p, t, d::jsonb, m::jsonb FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[]) AS u (s, p, t, d, m)`

// append commits n events on connection k, round-robin over its streams.
func (p *producer) append(ctx context.Context, k int, n int64) error {
	ids, poss := make([]string, n), make([]int64, n)
	types, data, meta := make([]string, n), make([]string, n), make([]string, n)
	p.mu.Lock()
	seq := p.seq
	p.seq += n
	p.mu.Unlock()
	owned := p.next[k]
	for i := range n {
		j := p.cursor[k]
		p.cursor[k] = (j + 1) % len(owned)
		stream := int64(j)*int64(len(p.conns)) + int64(k)
		acct := fmt.Sprintf("live-%07d", stream)
		pos := owned[j]
		owned[j]++
		r := rand.Int64N(1 << 30)
		ids[i], poss[i] = acct, pos
		switch {
		case pos == 1:
			types[i] = "AccountOpened"
			data[i] = fmt.Sprintf(`{"account_id":%q,"owner":"Owner %d","initial":%d,"currency":"EUR","branch":"branch-%d","kyc":{"level":%d,"checked":true}}`,
				acct, stream, r%10000, stream%40, 1+stream%3)
		default:
			types[i] = "Deposited"
			if r%3 == 0 {
				types[i] = "Withdrawn"
			}
			ref := fmt.Sprintf("tx-%d", seq+i)
			if p.poison > 0 && rand.Float64() < p.poison {
				ref = strings.Repeat("r", 40) + ref
			}
			data[i] = fmt.Sprintf(`{"account_id":%q,"amount":%d,"currency":"EUR","reference":%q,"channel":"card","description":"payment %d for order %d"}`,
				acct, 1+r%1000, ref, seq+i, r%100000)
		}
		meta[i] = fmt.Sprintf(`{"correlation_id":%q,"causation_id":%q,"user_id":"user-%d","source":"bench","schema_version":1}`,
			uuid(), uuid(), stream%500)
	}
	if _, err := p.conns[k].Exec(ctx, appendSQL, ids, poss, types, data, meta); err != nil {
		return fmt.Errorf("append: %w", err)
	}
	return nil
}

func uuid() string {
	a, b := rand.Uint64(), rand.Uint64()
	return fmt.Sprintf("%08x-%04x-4%03x-a%03x-%012x", a>>32, (a>>16)&0xffff, a&0xfff, b>>52, b&0xffffffffffff)
}

// w4Step is how long each W4 and W4P load step runs: -w4-seconds scaled,
// at least 2s.
func (o options) w4Step() time.Duration {
	return time.Duration(max(o.w4Seconds*o.scale, 2) * float64(time.Second))
}
