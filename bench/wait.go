package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reading your own writes (issue 17), with -w4-wait: one more W4 step at
// W4's first rate, during which a few waiters each append an event of
// their own, call pgscribe.wait_for_stream (or wait_for_lsn) for it, and
// note when the call returned. An event's wait latency is that moment less
// its commit timestamp: the same origin as W4's end-to-end latency, which
// is measured over the same step's events (the waiters' included), so the
// two compare under the same load. Then, with the engine idle, 50
// connections wait at once for an event that never comes, and their
// backends' CPU time says what waiting costs.

// WaitFigures is what the wait step measured, in ms.
type WaitFigures struct {
	Rate    int     `json:"rate"`
	Seconds float64 `json:"seconds"`
	Load    string  `json:"load"`
	// W4's commit-to-row-commit latency over the step's events.
	EngineP50 float64 `json:"engine_p50_ms"`
	EngineP99 float64 `json:"engine_p99_ms"`
	// Commit to wait_for_stream returning true.
	StreamN   int     `json:"stream_waits"`
	StreamP50 float64 `json:"stream_p50_ms"`
	StreamP99 float64 `json:"stream_p99_ms"`
	StreamMax float64 `json:"stream_max_ms"`
	// Commit to wait_for_lsn(pg_current_wal_lsn() after the commit)
	// returning true.
	LSNN        int     `json:"lsn_waits"`
	LSNP50      float64 `json:"lsn_p50_ms"`
	LSNP99      float64 `json:"lsn_p99_ms"`
	LSNMax      float64 `json:"lsn_max_ms"`
	IdleWaiters int     `json:"idle_waiters"`
	IdleSeconds float64 `json:"idle_seconds"`
	IdleCores   float64 `json:"idle_cores"` // their backends' CPU time / wall time
}

const waitWaiters = 4 // two by stream position, two by LSN

// waitStep runs the measurement on W4's engine and producer, for at least
// 30 s (enough waits for a p99), and records it in w.
func (b *bench) waitStep(ctx context.Context, w *Workload, lv *liveRun, rate int) error {
	step := max(lv.step, 30*time.Second)
	f := WaitFigures{Rate: rate, Seconds: step.Seconds(), Load: loadAverage()}
	say("W4 wait: %d events/s for %s with %d waiters (load %s) …", rate, step, waitWaiters, f.Load)
	pos0, err := maxPosition(ctx, lv.db)
	if err != nil {
		return err
	}
	stepCtx, stop := context.WithCancel(ctx)
	defer stop()
	type waited struct {
		stream string
		pos    int64
		at     time.Time
		byLSN  bool
	}
	var (
		mu    sync.Mutex
		waits []waited
		wg    sync.WaitGroup
	)
	errs := make([]error, waitWaiters)
	for k := range waitWaiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, lv.db.dsn)
			if err != nil {
				errs[k] = err
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			stream := fmt.Sprintf("waiter-%d", k)
			byLSN := k%2 == 1
			for pos := int64(1); stepCtx.Err() == nil; pos++ {
				_, err := conn.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
  VALUES ($1, $2, 'Deposited', jsonb_build_object('account_id', $1::text, 'amount', 1))`, stream, pos)
				var lsn string
				if err == nil && byLSN {
					// What an application takes after its append commits.
					err = conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn)
				}
				var ok bool
				if err == nil && byLSN {
					err = conn.QueryRow(ctx, "SELECT pgscribe.wait_for_lsn('activity', 1, $1::pg_lsn, '30s')", lsn).Scan(&ok)
				} else if err == nil {
					err = conn.QueryRow(ctx, "SELECT pgscribe.wait_for_stream('activity', 1, $1, $2, '30s')", stream, pos).Scan(&ok)
				}
				at := time.Now()
				if err == nil && !ok {
					err = fmt.Errorf("%s/%d: wait timed out", stream, pos)
				}
				if err != nil {
					errs[k] = err
					return
				}
				mu.Lock()
				waits = append(waits, waited{stream, pos, at, byLSN})
				mu.Unlock()
				select {
				case <-stepCtx.Done():
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
	}
	sent, err := lv.prod.run(ctx, rate, step)
	stop()
	wg.Wait()
	if err != nil {
		return err
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("waiters: %w", err)
	}
	pos1, err := maxPosition(ctx, lv.db)
	if err != nil {
		return err
	}
	lv.total += sent + int64(len(waits))
	if _, _, err := b.waitAccounted(ctx, lv.db, lv.p, lv.targets, lv.total, false); err != nil {
		return err
	}
	var row LatencyRow
	if err := latency(ctx, lv.db, lv.table, pos0, pos1, &row); err != nil {
		return err
	}
	f.EngineP50, f.EngineP99 = row.P50, row.P99

	commits := map[[2]any]int64{}
	rows, err := lv.db.pool.Query(ctx, `SELECT stream_id, stream_position,
  (extract(epoch FROM pg_xact_commit_timestamp(xmin)) * 1000000)::bigint
FROM events WHERE position > $1 AND stream_id LIKE 'waiter-%'`, pos0)
	if err != nil {
		return err
	}
	var stream string
	var pos, us int64
	if _, err := pgx.ForEachRow(rows, []any{&stream, &pos, &us}, func() error {
		commits[[2]any{stream, pos}] = us
		return nil
	}); err != nil {
		return fmt.Errorf("waiter commits: %w", err)
	}
	var byStream, byLSN []float64
	for _, w := range waits {
		us, ok := commits[[2]any{w.stream, w.pos}]
		if !ok {
			return fmt.Errorf("waiter event %s/%d has no commit timestamp", w.stream, w.pos)
		}
		ms := float64(w.at.UnixMicro()-us) / 1000
		if w.byLSN {
			byLSN = append(byLSN, ms)
		} else {
			byStream = append(byStream, ms)
		}
	}
	f.StreamN, f.StreamP50, f.StreamP99, f.StreamMax = spread(byStream)
	f.LSNN, f.LSNP50, f.LSNP99, f.LSNMax = spread(byLSN)
	say("W4 wait: %d/s: engine p50 %.1f ms, p99 %.1f ms; wait_for_stream (%d) p50 %.1f ms, p99 %.1f ms, max %.1f ms; wait_for_lsn (%d) p50 %.1f ms, p99 %.1f ms, max %.1f ms",
		rate, f.EngineP50, f.EngineP99, f.StreamN, f.StreamP50, f.StreamP99, f.StreamMax, f.LSNN, f.LSNP50, f.LSNP99, f.LSNMax)

	if err := idleWaiters(ctx, lv.db.dsn, &f); err != nil {
		return err
	}
	say("W4 wait: %d idle waiters for %.0f s: %.3f cores of PostgreSQL backend CPU", f.IdleWaiters, f.IdleSeconds, f.IdleCores)
	w.Wait = &f
	return nil
}

// markdown renders the figures in RESULTS.md, under W4.
func (f *WaitFigures) markdown(p func(string, ...any)) {
	p("Reading your own writes (`-w4-wait`, bench/wait.go): one more step at %s events/s for %.0f s, during which "+
		"%d waiters each append an event of their own, wait for it (half with `pgscribe.wait_for_stream`, half with "+
		"`pgscribe.wait_for_lsn` of `pg_current_wal_lsn()` taken after the commit), and note when the call returned; "+
		"latency is that moment less the event's commit timestamp, the origin of the engine's latency, which is "+
		"measured over the same step's events. Load %s.", thousands(int64(f.Rate)), f.Seconds, waitWaiters, f.Load)
	p("")
	p("| latency, commit to … | events | p50 ms | p99 ms | max ms |")
	p("|---|--:|--:|--:|--:|")
	p("| read-model row commit (the engine, W4) | all | %.1f | %.1f | |", f.EngineP50, f.EngineP99)
	p("| wait_for_stream true | %d | %.1f | %.1f | %.1f |", f.StreamN, f.StreamP50, f.StreamP99, f.StreamMax)
	p("| wait_for_lsn true | %d | %.1f | %.1f | %.1f |", f.LSNN, f.LSNP50, f.LSNP99, f.LSNMax)
	p("")
	p("Then, the engine idle, %d connections wait %.0f s at once for an event that never comes: their backends "+
		"used %.3f cores.", f.IdleWaiters, f.IdleSeconds, f.IdleCores)
	p("")
}

// spread returns the count, p50, p99 and max of ms.
func spread(ms []float64) (n int, p50, p99, top float64) {
	if len(ms) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(ms)
	return len(ms), percentile(ms, 0.5), percentile(ms, 0.99), ms[len(ms)-1]
}

// idleWaiters has 50 connections wait 10 s for an event that never comes
// and measures their backends' CPU (they run on this machine: -pg-mode
// local or docker).
func idleWaiters(ctx context.Context, dsn string, f *WaitFigures) error {
	const n, wait = 50, 10 * time.Second
	conns := make([]*pgx.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			_ = c.Close(context.WithoutCancel(ctx))
		}
	}()
	pids := make([]int, n)
	for i := range n {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pids[i]); err != nil {
			return err
		}
	}
	cpu := func() (time.Duration, error) {
		var sum time.Duration
		for _, pid := range pids {
			c, err := processCPU(pid)
			if err != nil {
				return 0, fmt.Errorf("backend CPU (is PostgreSQL on this machine?): %w", err)
			}
			sum += c
		}
		return sum, nil
	}
	before, err := cpu()
	if err != nil {
		return err
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ok bool
			errs[i] = c.QueryRow(ctx, "SELECT pgscribe.wait_for_stream('activity', 1, 'never', 1, $1)", wait).Scan(&ok)
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	after, err := cpu()
	if err != nil {
		return err
	}
	f.IdleWaiters, f.IdleSeconds, f.IdleCores = n, el.Seconds(), (after-before).Seconds()/el.Seconds()
	return nil
}
