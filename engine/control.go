package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/control"
	"github.com/pgscribe/pgscribe/leader"
)

// This file is how the active node obeys the operator controls stored in
// the engine schema (package control): it polls them every controlPoll
// while it holds the lock, and pauses, resumes, wakes from a halt and runs
// dead-letter retries when they change. A poll is one statement of two
// primary-key (or partial-index) lookups on a connection of its own.

// controlPoll is how often the active node reads its controls: a control
// is obeyed within a second.
const controlPoll = 500 * time.Millisecond

// retryAgain is how long a retry request that failed (its reads or
// bookkeeping; not its events) waits before it is run again.
const retryAgain = 5 * time.Second

// errPaused ends a live session because an operator paused the projection;
// Run keeps the lock and waits for the resume.
var errPaused = errors.New("paused by an operator")

// controls is the last-read controls of the projection version, and a
// channel closed whenever they change.
type controls struct {
	mu      sync.Mutex
	state   control.State
	changed chan struct{}
	poke    chan struct{}
	stop    context.CancelFunc
	done    chan struct{}
}

// watchControls starts polling the controls until stop is called. The first
// read is done before it returns, so that a paused version is never
// started. A read that fails keeps the last state (none at first): a pause
// is obeyed once the database answers again, which it must for anything to
// be applied anyway.
func (p *Projection) watchControls(ctx context.Context) *controls {
	ctx, cancel := context.WithCancel(ctx)
	c := &controls{changed: make(chan struct{}), poke: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	var conn *pgx.Conn
	failing := false
	read := func() {
		if conn == nil || conn.IsClosed() {
			cctx, cancelConn := context.WithTimeout(ctx, 5*time.Second)
			var err error
			conn, err = pgx.Connect(cctx, p.cfg.TargetURL())
			cancelConn()
			if err != nil {
				conn = nil
				p.controlReadFailed(ctx, &failing, err)
				return
			}
		}
		qctx, cancelQuery := context.WithTimeout(ctx, 5*time.Second)
		st, err := control.Load(qctx, conn, p.cfg.Engine.Schema, p.spec.Name, p.spec.Version)
		cancelQuery()
		if err != nil {
			conn.Close(context.WithoutCancel(ctx))
			conn = nil
			p.controlReadFailed(ctx, &failing, err)
			return
		}
		failing = false
		c.set(st)
	}
	read()
	go func() {
		defer close(c.done)
		defer func() {
			if conn != nil {
				conn.Close(context.WithoutCancel(ctx))
			}
		}()
		t := time.NewTicker(controlPoll)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-c.poke:
			}
			read()
		}
	}()
	return c
}

func (p *Projection) controlReadFailed(ctx context.Context, failing *bool, err error) {
	if ctx.Err() == nil && !*failing {
		p.log.Warn("read operator controls (pause, resume, retries): keeping the last ones read", "err", err)
	}
	*failing = true
}

func (c *controls) set(st control.State) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.PausedAt == nil && c.state.PausedAt == nil || st.PausedAt != nil && c.state.PausedAt != nil && st.PausedAt.Equal(*c.state.PausedAt) {
		if st.ResumeSeq == c.state.ResumeSeq && st.PendingRetry == c.state.PendingRetry {
			return
		}
	}
	c.state = st
	close(c.changed)
	c.changed = make(chan struct{})
}

// current returns the controls and a channel closed at their next change.
func (c *controls) current() (control.State, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state, c.changed
}

// refresh asks for a poll now.
func (c *controls) refresh() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

func (c *controls) close() {
	c.stop()
	<-c.done
}

// awaitResume holds a paused projection: the lock and the slot are kept,
// nothing is applied, lag is reported from the database. It returns nil
// once the projection is resumed (or ctx ends), an error wrapping
// leader.ErrLost when the lock session broke meanwhile.
func (p *Projection) awaitResume(ctx context.Context, lease *leader.Lease, ctl *controls) error {
	st, changed := ctl.current()
	if !st.Paused() {
		return nil
	}
	p.setState(StatePaused)
	p.log.Warn("paused by an operator: holding the lock and the slot, applying nothing until pgscribe resume",
		"reason", st.PauseReason, "by", st.PausedBy, "since", st.PausedAt)
	stopReport := p.reportStandby(ctx)
	defer stopReport()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan error, 1)
	go func() { lost <- lease.Watch(wctx, p.cfg.Engine.LeaseTimeout/3) }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-lost:
			if err != nil {
				return fmt.Errorf("while paused: %w", err)
			}
			return nil
		case <-changed:
		}
		if st, changed = ctl.current(); !st.Paused() {
			p.log.Info("resumed by an operator")
			p.setState(StateStarting)
			return nil
		}
	}
}

// activeSession runs sessions while this node holds lease: it waits while
// the projection is paused, and starts a new session after a pause ended
// one. It returns the error of the session that ended otherwise.
func (p *Projection) activeSession(ctx context.Context, lease *leader.Lease, ctl *controls) error {
	for {
		if err := p.awaitResume(ctx, lease, ctl); err != nil || ctx.Err() != nil {
			return err
		}
		err := p.session(ctx, lease, ctl)
		switch {
		case errors.Is(err, errSlowMember):
			// The group's stream went on without it: a new session
			// under the same lock catches up on a copy of the group's
			// slot and joins again.
			p.log.Info("catching up on a slot of its own after a detach from the group's stream")
		case errors.Is(err, errSlowSeat):
			// The group's scan went on without it: a new session under
			// the same lock backfills on a slot of its own and joins.
			p.log.Info("backfilling on a slot of its own after a drop from the group's scan")
		case !errors.Is(err, errPaused):
			return err
		}
	}
}

// obeyControls applies control changes to the running session until ctx
// ends: a pause of a live session ends it (endSession; the in-flight
// batches commit, the slot is confirmed, Run keeps the lock), a pause of a
// backfill holds the partition workers between batches (the snapshot stays
// open, so the resume goes on from where it was), and queued dead-letter
// retries run one request at a time while not paused.
func (s *session) obeyControls(ctx context.Context, endSession context.CancelFunc) {
	held := false
	retrying, lastRetry := false, int64(0)
	type retryEnd struct {
		id int64
		ok bool
	}
	retryDone := make(chan retryEnd, 1)
	var again <-chan time.Time // a failed request is tried again after retryAgain
	defer func() {
		if retrying {
			<-retryDone
		}
	}()
	for {
		st, changed := s.ctl.current()
		switch {
		case st.Paused() && !s.backfilling.Load():
			s.log.Info("pausing: ending the stream after the in-flight batches", "reason", st.PauseReason, "by", st.PausedBy)
			s.pausing.Store(true)
			endSession()
			return
		case st.Paused() && !held:
			s.parts.Hold(true)
			held = true
			s.setState(StatePaused)
			s.log.Warn("backfill paused by an operator: in-flight batches commit, nothing more is applied until pgscribe resume",
				"reason", st.PauseReason, "by", st.PausedBy)
		case !st.Paused() && held:
			s.parts.Hold(false)
			held = false
			s.setState(StateBackfilling)
			s.log.Info("backfill resumed by an operator")
		}
		if !st.Paused() && !retrying && st.PendingRetry > lastRetry {
			retrying = true
			go func(id int64) { retryDone <- retryEnd{id, s.runRetry(ctx, id)} }(st.PendingRetry)
		}
		select {
		case <-ctx.Done():
			if held {
				s.parts.Hold(false) // the workers see stop; let them return
			}
			return
		case <-changed:
		case end := <-retryDone:
			retrying = false
			if end.ok {
				lastRetry = end.id
				s.ctl.refresh()
			} else {
				lastRetry = end.id // not before retryAgain
				again = time.After(retryAgain)
			}
		case <-again:
			again, lastRetry = nil, lastRetry-1
		}
	}
}
