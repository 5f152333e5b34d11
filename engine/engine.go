// Package engine runs one projection version through its whole lifecycle:
// stand by until its advisory lock is ours, decide between streaming from
// the slot and (re)building from a snapshot, backfill, stream, apply, and
// shut down in order. It wires replication (the source), apply (the
// partitioned single-transaction commits) and lag (the watermark) together;
// those packages never import each other.
//
// Projection.Run is the loop over active periods; a session (session.go)
// is one of them, its steps methods on the state they share; the ledger
// (ledger.go) is the one place that decides what is durable, tells the
// stream what it may confirm, saves the watermark and confirms the slot.
// The operator commands are in package admin.
package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/lag"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/rules"
	"github.com/pgscribe/pgscribe/sqlstate"
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
	StatePaused      State = "paused" // by an operator: lock and slot kept, nothing applied
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
	hub     *hub            // the group's stream, set by the group before Run
	onGroup atomic.Bool     // the version streams from its group's slot (for the lag probe)

	state   atomic.Value             // State
	caught  atomic.Bool              // live and nothing in flight at the last lag tick
	haltErr atomic.Pointer[haltedBy] // why it halted (setHaltErr)

	// Set and read by Run's goroutine only (sessions run on it).
	resync     string // why the next session must resync from a new snapshot; "" = plan decides
	resyncedAt string // source fingerprint of the last resync sourceFault decided
	// resourceHalts counts resource halts in a row, each session failing
	// again within a minute of its start (resourceFault's backoff).
	resourceHalts int
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
	p.metrics.SetActive(s == StateBackfilling || s == StateLive || s == StatePaused)
	p.metrics.SetHalted(s == StateHalted)
	p.metrics.SetPaused(s == StatePaused)
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
	// Restarts are unbounded; the wait doubles from a second to a minute.
	restart := sqlstate.Policy{Backoff: time.Second, MaxBackoff: time.Minute}.Start()
	for ctx.Err() == nil {
		stopStandby := p.reportStandby(ctx) // lag from the database until this node is active
		lease, err := p.acquire(ctx)
		stopStandby()
		if err != nil || lease == nil {
			return err
		}
		p.clearHalt(ctx, lease)
		ctl := p.watchControls(ctx)
		start := time.Now()
		err = p.activeSession(ctx, lease, ctl)
		end := classifyEnd(err)
		// A source halt keeps the lock and probes; once its cause is gone
		// a new session runs under the same lease.
		for (end == endSourceHalt || end == endResourceHalt) && ctx.Err() == nil {
			fault := p.sourceFault
			if end == endResourceHalt {
				fault = p.resourceFault
				if time.Since(start) > time.Minute {
					p.resourceHalts = 0 // the session made progress
				}
			}
			if ferr := fault(ctx, lease, err, ctl); ferr != nil {
				err, end = ferr, classifyEnd(ferr)
				break
			}
			start = time.Now()
			err = p.activeSession(ctx, lease, ctl)
			end = classifyEnd(err)
		}
		if end == endHalt && ctx.Err() == nil {
			var halt *apply.HaltError
			errors.As(err, &halt)
			p.setHaltErr(err)
			p.setState(StateHalted)
			p.metrics.Halt(stageCommit, halt.SQLState)
			p.log.Error("projection halted: fix the cause, then pgscribe resume (or restart pgscribe); nothing of the failing batch was acknowledged",
				"stage", stageCommit, "sqlstate", halt.SQLState, "table", halt.Table, "reason", halt.Reason, "err", halt.Err)
			woken := p.holdHalted(ctx, lease, halt, ctl)
			ctl.close()
			lease.Release(context.WithoutCancel(ctx))
			p.releaseSlot()
			if !woken {
				return nil
			}
			// pgscribe resume: retry now, from a new lock (this node takes
			// it again at once unless a standby is quicker; either retries).
			p.log.Info("resume requested by an operator: retrying the halted projection now")
			p.setState(StateStarting)
			restart.Reset()
			continue
		}
		ctl.close()
		lease.Release(context.WithoutCancel(ctx))
		p.releaseSlot()
		p.metrics.SetActive(false)
		switch {
		case ctx.Err() != nil:
			return nil
		case end == endStandby:
			p.log.Warn("lost ownership, standing by", "err", err)
			restart.Reset()
			continue
		}
		if time.Since(start) > time.Minute {
			restart.Reset() // progress was made
		}
		p.metrics.Restarted()
		if restart.Wait(ctx, p.log, "pipeline stopped, restarting", err) != nil {
			return nil
		}
	}
	return nil
}

// ending is what Run does after a session ended while ctx is live.
type ending int

const (
	endRestart      ending = iota // restart the pipeline after a backoff
	endStandby                    // another node owns the projection: stand by at once
	endHalt                       // hold the lock, halted, until the process stops
	endSourceHalt                 // hold the lock, halted or resyncing, until the source can be read (sourceFault)
	endResourceHalt               // hold the lock, halted, until the server has room again (resourceFault)
)

// classifyEnd is the one place that decides, from the error a session
// ended with, between restarting, standing by and halting. A commit
// classified the batch's error already (apply.HaltError). A source error
// (connect, slot, snapshot, stream: sourceError) is classified here with
// the same taxonomy (replication.Classify): a structural one halts the
// source (sourceFault), a transient one — connection loss, 08xxx, 53xxx,
// 57P0x — restarts with backoff like every other error.
func classifyEnd(err error) ending {
	var halt *apply.HaltError
	switch {
	case errors.As(err, &halt):
		return endHalt
	case errors.Is(err, event.ErrFenced), errors.Is(err, leader.ErrLost):
		return endStandby
	case sqlstate.ResourceSetting(err) != "":
		return endResourceHalt
	case sourceStructural(err):
		return endSourceHalt
	}
	return endRestart
}

// holdHalted keeps a halted projection's lock until the process stops or
// an operator runs `pgscribe resume` (it returns true then), so no standby
// takes over only to halt the same way, and records the halt on the lease
// row for `pgscribe status`. The process keeps serving /metrics
// (pgscribe_halted 1) and /healthz (503).
func (p *Projection) holdHalted(ctx context.Context, lease *leader.Lease, halt *apply.HaltError, ctl *controls) (woken bool) {
	// Only a resume after the halt wakes it.
	seen, _ := ctl.current()
	if err := p.withTarget(ctx, func(conn *pgx.Conn) error {
		return lease.RecordHalt(ctx, conn, halt.Error())
	}); err != nil {
		p.log.Warn("record halt on lease", "err", err)
	}
	// Lag keeps being reported from the database while halted.
	stopReport := p.reportStandby(ctx)
	defer stopReport()
	// Keep the lock session alive; if it is lost anyway, another node may
	// take over (and will halt the same way until the cause is fixed).
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		if err := lease.Watch(wctx, p.cfg.Engine.LeaseTimeout/3); err != nil {
			p.log.Warn("lock session lost while halted", "err", err)
		}
	}()
	for {
		st, changed := ctl.current()
		if st.ResumeSeq != seen.ResumeSeq {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-changed:
		}
	}
}

// clearHalt removes a recorded halt from the lease row once this node owns
// the projection again (after a restart that fixed the cause).
func (p *Projection) clearHalt(ctx context.Context, lease *leader.Lease) {
	err := p.withTarget(ctx, func(conn *pgx.Conn) error { return lease.ClearHalt(ctx, conn) })
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
	logged, lockHalted := false, false
	for {
		if p.slots != nil {
			if !lockHalted {
				p.setState(StateStandby) // not active while waiting for a slot
			}
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
			lockHalted = p.lockFault(err, lockHalted)
		} else if lockHalted {
			p.log.Info("lock fault cleared: resuming", "stage", stageLock)
			lockHalted, logged = false, false
			p.setState(StateStarting)
		}
		if err == nil && l != nil {
			p.log.Info("acquired lock", "epoch", l.Epoch, "node", p.cfg.Engine.Node)
			return l, nil
		} else if err == nil && !logged {
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

// haltedBy holds a halt's error. An atomic.Value of the error itself
// panicked ("store of inconsistently typed value") when a projection that
// had halted on a source fault (an *errors.errorString) later halted on a
// commit (a wrapped error), taking the node's every projection down
// (campaign seed 2032: a dropped publication, then alter-break).
type haltedBy struct{ err error }

// setHaltErr records why the projection halted, whatever the error's type.
func (p *Projection) setHaltErr(err error) { p.haltErr.Store(&haltedBy{err: err}) }

// haltError is the error of the last halt, nil before any.
func (p *Projection) haltError() error {
	if h := p.haltErr.Load(); h != nil {
		return h.err
	}
	return nil
}
