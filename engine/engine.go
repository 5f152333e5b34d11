// Package engine runs one projection version through its whole lifecycle:
// stand by until its advisory lock is ours, decide between streaming from
// the slot and (re)building from a snapshot, backfill, stream, apply, and
// shut down in order. It wires replication (the source), apply (the
// partitioned single-transaction commits) and lag (the watermark) together;
// those packages never import each other.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/lag"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/rules"
)

// State is where a projection is in its lifecycle.
type State string

// States reported by status and health.
const (
	StateStarting    State = "starting"
	StateStandby     State = "standby"
	StateBackfilling State = "backfilling"
	StateLive        State = "live"
	StateHalted      State = "halted"
	StateStopped     State = "stopped"
)

// Projection runs one projection version.
type Projection struct {
	cfg     *config.Config
	prog    *rules.Program
	spec    rules.Spec
	slot    string
	log     *slog.Logger
	metrics *lag.Projection
	hard    context.Context // cancelled on a hard stop: in-flight batches roll back
	slots   chan struct{}   // max_active_projections semaphore; nil = unlimited

	state   atomic.Value // State
	caught  atomic.Bool  // live and nothing in flight at the last lag tick
	haltErr atomic.Value // error
}

// New prepares a projection. hard is cancelled on a hard stop (second
// signal or shutdown timeout); until then in-flight batches complete.
func New(cfg *config.Config, spec rules.Spec, prog *rules.Program, m *lag.Metrics, log *slog.Logger, hard context.Context) *Projection {
	p := &Projection{cfg: cfg, prog: prog, spec: spec, slot: cfg.SlotName(spec),
		log: log.With("projection", spec.Name, "version", spec.Version), metrics: m.For(spec.Name, spec.Version), hard: hard}
	p.state.Store(StateStarting)
	return p
}

// State returns the current lifecycle state.
func (p *Projection) State() State { return p.state.Load().(State) }

// Ready reports whether the projection is live and caught up, or a healthy
// standby.
func (p *Projection) Ready() bool {
	switch p.State() {
	case StateStandby:
		return true
	case StateLive:
		return p.caught.Load()
	}
	return false
}

func (p *Projection) setState(s State) {
	if p.State() != s {
		p.log.Info("state", "state", string(s))
	}
	p.state.Store(s)
	p.metrics.SetActive(s == StateBackfilling || s == StateLive)
	p.metrics.SetHalted(s == StateHalted)
}

// Run stands by, becomes active, and keeps the projection running until ctx
// ends (graceful stop: the in-flight batches finish, the slot is confirmed,
// the lock released) or it halts. A halt is logged and reported in metrics
// and Run returns nil: other projections keep running.
func (p *Projection) Run(ctx context.Context) error {
	defer func() {
		if p.State() != StateHalted {
			p.setState(StateStopped)
		}
	}()
	backoff := time.Second
	for ctx.Err() == nil {
		stopStandby := p.reportStandby(ctx) // lag from the database until this node is active
		lease, err := p.acquire(ctx)
		stopStandby()
		if err != nil || lease == nil {
			return err
		}
		p.clearHalt(ctx, lease)
		start := time.Now()
		err = p.session(ctx, lease)
		var halt *apply.HaltError
		if errors.As(err, &halt) && ctx.Err() == nil {
			p.haltErr.Store(err)
			p.setState(StateHalted)
			p.log.Error("projection halted: fix the cause and restart pgscribe; nothing of the failing batch was acknowledged",
				"sqlstate", halt.SQLState, "table", halt.Table, "reason", halt.Reason, "err", halt.Err)
			p.holdHalted(ctx, lease, halt)
			lease.Release(context.WithoutCancel(ctx))
			p.releaseSlot()
			return nil
		}
		lease.Release(context.WithoutCancel(ctx))
		p.releaseSlot()
		p.metrics.SetActive(false)
		switch {
		case ctx.Err() != nil:
			return nil
		case errors.Is(err, apply.ErrFenced), errors.Is(err, leader.ErrLost):
			p.log.Warn("lost ownership, standing by", "err", err)
			backoff = time.Second
			continue
		}
		if time.Since(start) > time.Minute {
			backoff = time.Second // progress was made: reset
		}
		p.metrics.Restarted()
		p.log.Warn("pipeline stopped, restarting", "err", err, "backoff", backoff)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Minute)
	}
	return nil
}

// holdHalted keeps a halted projection's lock until the process stops, so
// no standby takes over only to halt the same way, and records the halt on
// the lease row for `pgscribe status`. The process keeps serving /metrics
// (pgscribe_halted 1) and /healthz (503).
func (p *Projection) holdHalted(ctx context.Context, lease *leader.Lease, halt *apply.HaltError) {
	leases := pgx.Identifier{p.cfg.Engine.Schema, "leases"}.Sanitize()
	reason := halt.Error()
	if err := p.withTarget(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `UPDATE `+leases+` SET halted_at = now(), halt_reason = $4
			WHERE projection = $1 AND version = $2 AND epoch = $3`, p.spec.Name, p.spec.Version, lease.Epoch, reason)
		return err
	}); err != nil {
		p.log.Warn("record halt on lease", "err", err)
	}
	// Lag keeps being reported from the database while halted.
	stopReport := p.reportStandby(ctx)
	defer stopReport()
	// Keep the lock session alive; if it is lost anyway, another node may
	// take over (and will halt the same way until the cause is fixed).
	if err := lease.Watch(ctx, p.cfg.Engine.LeaseTimeout/3); err != nil {
		p.log.Warn("lock session lost while halted", "err", err)
	}
	<-ctx.Done()
}

// clearHalt removes a recorded halt from the lease row once this node owns
// the projection again (after a restart that fixed the cause).
func (p *Projection) clearHalt(ctx context.Context, lease *leader.Lease) {
	leases := pgx.Identifier{p.cfg.Engine.Schema, "leases"}.Sanitize()
	err := p.withTarget(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, `UPDATE `+leases+` SET halted_at = NULL, halt_reason = NULL
			WHERE projection = $1 AND version = $2 AND epoch = $3 AND halted_at IS NOT NULL`, p.spec.Name, p.spec.Version, lease.Epoch)
		return err
	})
	if err != nil && ctx.Err() == nil {
		p.log.Warn("clear halt on lease", "err", err)
	}
}

// withTarget runs fn on a short-lived connection to the target database.
func (p *Projection) withTarget(ctx context.Context, fn func(*pgx.Conn) error) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, p.cfg.TargetURL())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn)
}

func (p *Projection) releaseSlot() {
	if p.slots != nil {
		<-p.slots
	}
}

// acquire stands by until the lock is ours; nil lease when ctx ended.
//
// With max_active_projections it takes one of this node's slots for each
// attempt and keeps it only with the lock (Run frees it when the session
// ends). Holding a slot while polling a lock that another node holds would
// keep this node's other projections from ever trying theirs.
func (p *Projection) acquire(ctx context.Context) (*leader.Lease, error) {
	logged := false
	for {
		if p.slots != nil {
			p.setState(StateStandby) // not active while waiting for a slot
			select {
			case p.slots <- struct{}{}:
			case <-ctx.Done():
				return nil, nil
			}
		}
		l, err := leader.TryAcquire(ctx, p.cfg.TargetURL(), p.cfg.Engine.Schema, p.spec.Name, p.spec.Version, p.cfg.Engine.Node, p.cfg.Engine.LeaseTimeout)
		if l == nil {
			p.releaseSlot()
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, nil
			}
			p.log.Warn("lock attempt failed", "err", err)
		} else if l != nil {
			p.log.Info("acquired lock", "epoch", l.Epoch, "node", p.cfg.Engine.Node)
			return l, nil
		} else if !logged {
			p.setState(StateStandby)
			p.log.Info("standing by: another node holds the lock")
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil, nil
		case <-time.After(p.cfg.Engine.StandbyPoll):
		}
	}
}

// sink adapts the pipeline to replication.Sink.
type sink struct {
	tracker *lag.Tracker
	parts   *apply.Partitions
}

func (s *sink) Begin(_ event.LSN, t time.Time) uint64 { return s.tracker.Begin(t) }
func (s *sink) Event(ctx context.Context, tok uint64, ev *event.Event) error {
	s.tracker.Add(tok, ev.Position)
	if err := s.parts.Dispatch(ctx, apply.Input{Event: ev, Token: tok}); err != nil {
		s.tracker.Done(tok, 1) // not taken: it will be offered again
		return err
	}
	return nil
}
func (s *sink) Commit(tok uint64, end event.LSN) { s.tracker.Seal(tok, end) }
func (s *sink) Confirmable() event.LSN           { l, _, _ := s.tracker.Watermark(); return l }
func (s *sink) AdvanceIdle(walEnd event.LSN)     { s.tracker.Advance(walEnd) }

// session is one active period: from holding the lock to an error or stop.
func (p *Projection) session(ctx context.Context, lease *leader.Lease) error {
	cfg := p.cfg
	sessCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	poolCfg, err := pgxpool.ParseConfig(cfg.TargetURL())
	if err != nil {
		return fmt.Errorf("parse target url: %w", err)
	}
	poolCfg.MaxConns = int32(cfg.Engine.Parallelism + 2)
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "pgscribe"
	// A node frozen inside a batch must not hold the lease row (FOR SHARE)
	// past its lease: the server ends such a transaction, so a takeover's
	// epoch bump is never blocked for longer than lease_timeout.
	poolCfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(cfg.Engine.LeaseTimeout.Milliseconds())
	store := cursor.New(cfg.Engine.Schema, p.spec.Name, p.spec.Version)
	// The engine's own statements of every batch are prepared when a
	// connection opens, so that no batch waits for a round trip that
	// prepares them (pgx prepares a statement before its first pipeline).
	fenceSQL, _ := lease.CheckStatement()
	prepared := append([]string{"begin", "commit", fenceSQL, deadletter.InsertSQL(cfg.Engine.Schema)}, store.Statements()...)
	poolCfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		for _, sql := range prepared {
			if _, err := conn.Prepare(ctx, sql, sql); err != nil {
				return fmt.Errorf("prepare engine statement: %w", err)
			}
		}
		return nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err != nil {
		return fmt.Errorf("target pool: %w", err)
	}
	defer pool.Close()
	srcConn, err := pgx.Connect(ctx, cfg.Database.URL)
	if err != nil {
		return fmt.Errorf("connect source: %w", err)
	}
	defer srcConn.Close(context.WithoutCancel(ctx))

	src := replication.Source{URL: cfg.Database.URL, Table: cfg.Source.Table, Publication: cfg.Source.Publication,
		Slot: p.slot, Columns: replication.Columns(cfg.Source.Columns)}
	// A column pgscribe cannot read halts now, not at the first event.
	if err := replication.CheckTable(ctx, srcConn, src); err != nil {
		return sourceHalt(err)
	}

	wm, haveWM, err := store.LoadWatermark(ctx, pool)
	if err != nil {
		return err
	}
	slot, err := replication.InspectSlot(ctx, srcConn, p.slot)
	if err != nil {
		return err
	}
	hasCursors, err := store.HasCursors(ctx, pool)
	if err != nil {
		return err
	}
	rebuild := !slot.Exists || slot.Lost() || !haveWM || wm.Phase != "live" || wm.SlotName != p.slot
	switch {
	case !rebuild:
		p.log.Info("resuming from slot", "slot", p.slot, "confirmed_lsn", slot.Confirmed.String())
	case hasCursors && slot.Lost():
		p.log.Warn("slot was invalidated (WAL lost): resyncing from a new snapshot, per-stream cursors skip what was applied", "slot", p.slot)
	case hasCursors && !slot.Exists:
		p.log.Warn("slot is missing: resyncing from a new snapshot, per-stream cursors skip what was applied", "slot", p.slot)
	case hasCursors:
		p.log.Info("resuming an interrupted backfill from a new snapshot; per-stream cursors skip what was applied", "slot", p.slot)
	default:
		p.log.Info("first start: creating slot and backfilling from its snapshot", "slot", p.slot)
	}
	if rebuild && slot.Exists {
		if err := replication.DropSlot(ctx, srcConn, p.slot); err != nil {
			return err
		}
	} else if !rebuild {
		// A walsender left by a node that died or froze may still hold the
		// slot; end it now rather than wait for its TCP timeout. (srcConn is
		// used by the lag reporter from here on.)
		if err := replication.TerminateSlotHolder(ctx, srcConn, p.slot); err != nil {
			return fmt.Errorf("free slot: %w", err)
		}
	}

	backfilling := atomic.Bool{}
	backfilling.Store(rebuild)
	tracker := lag.NewTracker(slot.Confirmed)
	committer := apply.NewCommitter(pool, apply.Options{
		Projection: p.spec.Name, Version: p.spec.Version, Schema: cfg.Engine.Schema,
		HaltOnError: p.spec.OnError == "halt",
		MaxAttempts: cfg.Retry.MaxAttempts, Backoff: cfg.Retry.Backoff, MaxBackoff: cfg.Retry.MaxBackoff,
	}, p.prog, lease, p.metrics, p.log)
	var applied atomic.Int64
	parts := apply.NewPartitions(committer, apply.PartitionOptions{
		Count: cfg.Engine.Parallelism, QueueSize: cfg.Engine.QueueSize,
		BatchSize: func() int {
			if backfilling.Load() {
				return cfg.Engine.BackfillBatchSize
			}
			return cfg.Engine.BatchSize
		},
		Linger: cfg.Engine.BatchTimeout,
		Committed: func(batch []apply.Input, _ apply.Result) {
			applied.Add(int64(len(batch)))
			// Tokens repeat in runs (events of one transaction): report runs.
			for i := 0; i < len(batch); {
				j := i + 1
				for j < len(batch) && batch[j].Token == batch[i].Token {
					j++
				}
				tracker.Done(batch[i].Token, j-i)
				i = j
			}
		},
	})

	// Workers run on a context that a graceful stop does not cancel: they
	// finish the in-flight batch, then return when stop closes. Only a hard
	// stop (p.hard) or a failure of the session cancels them mid-batch.
	workCtx, cancelWork := context.WithCancel(p.hard)
	defer cancelWork()
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopWorkers := func() { stopOnce.Do(func() { close(stop) }) }
	workErr := make(chan error, 1)
	go func() {
		err := parts.Run(workCtx, stop)
		if err != nil {
			cancel() // a failed partition ends the session
		}
		workErr <- err
	}()
	leaseErr := make(chan error, 1)
	go func() { leaseErr <- lease.Watch(sessCtx, cfg.Engine.LeaseTimeout/3) }()
	go func() {
		if err := <-leaseErr; err != nil {
			p.log.Error("lock session lost: stopping this projection on this node", "err", err)
			cancelWork() // fenced anyway; do not wait for in-flight batches
			cancel()
		}
	}()

	lagDone := make(chan struct{})
	go func() { defer close(lagDone); p.reportLag(sessCtx, pool, store, lease, tracker, &backfilling) }()

	replConn, err := replication.ConnectReplication(sessCtx, cfg.Database.URL)
	if err == nil {
		defer replConn.Close(context.WithoutCancel(ctx))
		if rebuild {
			p.setState(StateBackfilling)
			err = p.backfill(sessCtx, replConn, src, store, pool, lease, tracker, parts)
			if err == nil {
				backfilling.Store(false)
			}
		}
		if err == nil {
			p.setState(StateLive)
			err = replication.Stream(sessCtx, replConn, src, &sink{tracker: tracker, parts: parts}, replication.StreamOptions{
				StatusInterval: cfg.Engine.StatusInterval, StallTimeout: cfg.Engine.StallTimeout, Logger: p.log,
			})
		}
	}
	// Shutdown order: stop intake (done: the stream returned), let workers
	// finish their in-flight batch, then confirm what is durable and record
	// the watermark, then (in Run) release the lock.
	stopWorkers()
	werr := <-workErr
	cancel()
	<-lagDone
	if replConn != nil && !backfilling.Load() {
		lsn, _, _ := tracker.Watermark()
		if cerr := replication.Confirm(context.WithoutCancel(ctx), replConn, lsn); cerr == nil {
			p.saveWatermark(context.WithoutCancel(ctx), pool, store, lease, tracker)
		}
	}
	if werr != nil {
		return werr
	}
	if ctx.Err() != nil {
		return nil
	}
	return sourceHalt(err)
}

// sourceHalt makes a source error that no retry can get past a halt: an
// events table pgscribe cannot read, or an insert into a relation it
// cannot map to the events table.
func sourceHalt(err error) error {
	if errors.Is(err, replication.ErrUnreadable) || errors.Is(err, replication.ErrForeignRelation) {
		return &apply.HaltError{Reason: "source events table", Err: err}
	}
	return err
}

// backfill creates the slot with an exported snapshot, applies every event
// visible in it, and marks the projection live. Crash-safe at any point: a
// restart finds phase "backfilling" and rebuilds from a new snapshot, and
// per-stream cursors skip what was applied.
func (p *Projection) backfill(ctx context.Context, replConn *pgconn.PgConn, src replication.Source, store *cursor.Store,
	pool *pgxpool.Pool, lease *leader.Lease, tracker *lag.Tracker, parts *apply.Partitions) error {
	consistent, snapName, err := replication.CreateSlot(ctx, replConn, p.slot)
	if err != nil {
		return err
	}
	snapConn, err := pgx.Connect(ctx, p.cfg.Database.URL)
	if err != nil {
		return fmt.Errorf("connect for snapshot: %w", err)
	}
	defer snapConn.Close(context.WithoutCancel(ctx))
	snap, err := replication.OpenSnapshot(ctx, snapConn, src, snapName)
	if err != nil {
		return err
	}
	defer snap.Close(ctx)
	p.log.Info("backfill started", "slot", p.slot, "consistent_lsn", consistent.String(), "events", snap.Total)
	if err := p.fenced(ctx, pool, lease, func(tx pgx.Tx) error {
		return store.SaveWatermark(ctx, tx, cursor.Watermark{SlotName: p.slot, LSN: consistent, Phase: "backfilling",
			BackfillTotal: snap.Total})
	}); err != nil {
		return err
	}
	started := time.Now()
	lastLog := started
	var done int64
	for {
		evs, err := snap.Next(ctx, p.cfg.Engine.BackfillBatchSize)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			break
		}
		tok := tracker.Begin(time.Time{})
		for _, ev := range evs {
			tracker.Add(tok, ev.Position)
			if err := parts.Dispatch(ctx, apply.Input{Event: ev, Token: tok}); err != nil {
				return err
			}
		}
		tracker.Seal(tok, 0)
		done += int64(len(evs))
		p.metrics.SetBackfill(done, snap.Total)
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			p.logProgress(done, snap.Total, started)
			_ = p.fenced(ctx, pool, lease, func(tx pgx.Tx) error {
				return store.SetPhase(ctx, tx, "backfilling", snap.Total, done)
			})
		}
	}
	if err := tracker.WaitIdle(ctx); err != nil {
		return err
	}
	if err := p.fenced(ctx, pool, lease, func(tx pgx.Tx) error {
		return store.SetPhase(ctx, tx, "live", snap.Total, done)
	}); err != nil {
		return err
	}
	tracker.Advance(consistent)
	el := time.Since(started)
	p.log.Info("backfill complete", "events", done, "seconds", el.Round(time.Millisecond).Seconds(),
		"events_per_second", int64(float64(done)/max(el.Seconds(), 1e-9)))
	return nil
}

func (p *Projection) logProgress(done, total int64, started time.Time) {
	el := time.Since(started).Seconds()
	rate := float64(done) / max(el, 1e-9)
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	eta := time.Duration(0)
	if rate > 0 && total > done {
		eta = time.Duration(float64(total-done)/rate) * time.Second
	}
	p.log.Info("backfill progress", "done", done, "total", total, "percent", fmt.Sprintf("%.1f", pct),
		"events_per_second", int64(rate), "eta", eta.Round(time.Second).String())
}

// fenced runs fn in a transaction that verifies the lease epoch first.
//
// Transient failures (a killed pooled connection, a server restart) are
// retried like a batch's ([retry] backoff and max_attempts): one broken
// connection must not end the session, which would restart a backfill from
// a new snapshot. fn must be safe to run again.
func (p *Projection) fenced(ctx context.Context, pool *pgxpool.Pool, lease *leader.Lease, fn func(pgx.Tx) error) error {
	backoff := p.cfg.Retry.Backoff
	for attempt := 1; ; attempt++ {
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := lease.Check(ctx, tx); err != nil {
				return err
			}
			return fn(tx)
		})
		if err == nil || ctx.Err() != nil || apply.Classify(err) != apply.ClassTransient ||
			(p.cfg.Retry.MaxAttempts > 0 && attempt >= p.cfg.Retry.MaxAttempts) {
			return err
		}
		p.log.Warn("transient failure, retrying", "attempt", attempt, "sqlstate", apply.SQLState(err), "backoff", backoff, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, p.cfg.Retry.MaxBackoff)
	}
}

func (p *Projection) saveWatermark(ctx context.Context, pool *pgxpool.Pool, store *cursor.Store, lease *leader.Lease, tracker *lag.Tracker) {
	// Position first: both only grow, so the position read before the
	// watermark belongs to transactions at or below it.
	pos := tracker.Position()
	lsn, ct, _ := tracker.Watermark()
	if lsn == 0 {
		return
	}
	err := p.fenced(ctx, pool, lease, func(tx pgx.Tx) error {
		// Phase is left as stored: only backfill's SetPhase moves it, after
		// every snapshot event committed.
		return store.SaveWatermark(ctx, tx, cursor.Watermark{SlotName: p.slot, LSN: lsn, Position: pos, CommitTime: ct})
	})
	if err != nil && ctx.Err() == nil {
		p.log.Warn("save watermark", "err", err)
	}
}
