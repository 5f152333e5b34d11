package engine

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// Stages of a halt, for the log, the lease row and pgscribe_halts_total.
const (
	stageSource = "source" // reading the events table: connect, slot, snapshot, stream
	stageLock   = "lock"   // taking the projection's lock on the target
	stageCommit = "commit" // a batch's transaction (apply.HaltError)
)

// sourceError marks an error of the source: the session's connection to
// the events database, its slot, its snapshot or its stream. slot is set
// for errors of the stream itself (the output plugin or the decoder
// failing on the slot's changes), after which a resync may help.
type sourceError struct {
	err  error
	slot bool
}

func (e *sourceError) Error() string { return e.err.Error() }
func (e *sourceError) Unwrap() error { return e.err }

// atSource marks err (nil stays nil) as the source's.
func atSource(err error) error {
	if err == nil {
		return nil
	}
	return &sourceError{err: err}
}

// atSlot marks err (nil stays nil) as the stream's.
func atSlot(err error) error {
	if err == nil {
		return nil
	}
	return &sourceError{err: err, slot: true}
}

// sourceStructural reports whether err is a source error that retrying
// cannot fix (replication.Classify): those halt the projection.
func sourceStructural(err error) bool {
	var se *sourceError
	return errors.As(err, &se) && replication.Classify(se.err) == sqlstate.ClassStructural
}

// source is the projection's source, as sessions and probes read it.
func (p *Projection) source() replication.Source {
	return replication.Source{URL: p.cfg.Database.URL, Table: p.cfg.Source.Table, Publication: p.cfg.Source.Publication,
		Slot: p.slot, Columns: replication.Columns(p.cfg.Source.Columns)}
}

// probe runs replication.Probe, bounded so that a hung server does not
// hold up the halted loop.
func (p *Projection) probe(ctx context.Context) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return replication.Probe(cctx, p.source())
}

// sourceFault handles a session that ended with a structural source error
// while lease is held, and returns nil when a new session should run
// (with the same lease), or why not: ctx's error or leader.ErrLost.
//
// Nothing of what failed was acknowledged, so nothing applied is at risk:
//   - When the probe passes at once and the stream failed on the slot's own
//     changes (a publication dropped and recreated is absent from the
//     catalog snapshot at the slot's position; a change the decoder
//     cannot read stays in the slot), the slot is resynced exactly as a
//     lost one: new slot, new snapshot, the cursors skip what was applied.
//     Once per source fingerprint, so never a loop.
//   - Otherwise the projection halts loudly (pgscribe_halted, the log, the
//     lease row for status, /healthz and /readyz 503), keeps its lock, and
//     probes every standby_poll. It resumes, logged, when the probe passes
//     after failing, when the fingerprint (publication, column types)
//     changed since the halt, or at once on `pgscribe resume`.
func (p *Projection) sourceFault(ctx context.Context, lease *leader.Lease, err error, ctl *controls) error {
	seen, _ := ctl.current() // a resume after this wakes it (pgscribe resume)
	var se *sourceError
	errors.As(err, &se)
	fp, perr := p.probe(ctx)
	if perr == nil && se.slot && fp != p.resyncedAt {
		p.resyncedAt = fp
		p.resync = "the slot's changes cannot be decoded (" + err.Error() + ") though the source passes every check"
		return nil
	}
	code := sqlstate.Code(err)
	if code == "" {
		code = sqlstate.Code(perr)
	}
	reason := "source halt"
	if code != "" {
		reason += " (sqlstate " + code + ")"
	}
	reason += ": " + err.Error()
	if perr != nil {
		reason += "; probe: " + perr.Error()
	}
	p.haltErr.Store(errors.New(reason))
	p.setState(StateHalted)
	p.metrics.Halt(stageSource, code)
	p.log.Error("projection halted: the source cannot be read; nothing was acknowledged, probing every standby_poll, resumes by itself once the cause is gone",
		"stage", stageSource, "sqlstate", code, "err", err, "probe", errString(perr))
	if err := p.withTarget(ctx, func(conn *pgx.Conn) error { return lease.RecordHalt(ctx, conn, reason) }); err != nil {
		p.log.Warn("record halt on lease", "err", err)
	}
	stopReport := p.reportStandby(ctx) // lag keeps being reported while halted
	defer stopReport()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan error, 1)
	go func() { lost <- lease.Watch(wctx, p.cfg.Engine.LeaseTimeout/3) }()

	failed := perr != nil && replication.Classify(perr) == sqlstate.ClassStructural
	t := time.NewTicker(p.cfg.Engine.StandbyPoll)
	defer t.Stop()
	for {
		st, changed := ctl.current()
		if st.ResumeSeq != seen.ResumeSeq {
			p.log.Info("resume requested by an operator: retrying the source now", "stage", stageSource)
			p.clearHalt(ctx, lease)
			p.setState(StateStarting)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-lost:
			if err == nil {
				return ctx.Err()
			}
			p.log.Warn("lock session lost while halted", "err", err)
			return leader.ErrLost
		case <-changed:
			continue
		case <-t.C:
		}
		fp2, perr2 := p.probe(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case perr2 != nil && replication.Classify(perr2) != sqlstate.ClassStructural:
			p.log.Debug("source probe failed, retrying", "err", perr2)
			continue // the server is away: says nothing of the cause
		case perr2 != nil:
			if !failed || sqlstate.Code(perr2) != sqlstate.Code(perr) {
				p.log.Warn("source still cannot be read", "sqlstate", sqlstate.Code(perr2), "probe", perr2.Error())
			}
			failed, perr = true, perr2
			continue
		case failed:
			p.log.Info("source fault cleared: resuming", "stage", stageSource, "was", perr.Error())
		case fp2 != fp:
			p.log.Info("source changed since the halt: resuming", "stage", stageSource, "source", fp2)
		default:
			continue
		}
		p.clearHalt(ctx, lease)
		p.setState(StateStarting)
		return nil
	}
}

// lockFault reports a lock attempt that failed: a structural failure (a
// failed password, a missing database, a revoked privilege) halts the
// projection loudly once, instead of standing by as if another node held
// the lock; acquire keeps trying every standby_poll. It returns whether
// the projection is now halted at the lock.
func (p *Projection) lockFault(err error, halted bool) bool {
	if sqlstate.Classify(err) != sqlstate.ClassStructural {
		p.log.Warn("lock attempt failed", "err", err)
		return halted
	}
	if !halted {
		code := sqlstate.Code(err)
		reason := "lock halt"
		if code != "" {
			reason += " (sqlstate " + code + ")"
		}
		p.haltErr.Store(errors.New(reason + ": " + err.Error()))
		p.setState(StateHalted)
		p.metrics.Halt(stageLock, code)
		p.log.Error("projection halted: cannot take its lock on the target; retrying every standby_poll, resumes by itself once the cause is gone",
			"stage", stageLock, "sqlstate", code, "err", err)
	}
	return true
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

var haltSQLState = regexp.MustCompile(`\(sqlstate ([0-9A-Z]{5})\)`)

// HaltCause reads the stage and SQLSTATE ("" when none) back from a halt
// reason the engine recorded on the lease row, for `pgscribe status`:
// source halts are recorded as "source halt (sqlstate …): …", commit
// halts as apply.HaltError's text.
func HaltCause(reason string) (stage, code string) {
	stage = stageCommit
	if strings.HasPrefix(reason, "source halt") {
		stage = stageSource
	}
	if m := haltSQLState.FindStringSubmatch(reason); m != nil {
		code = m[1]
	}
	return stage, code
}

// SourceHalt reports whether a recorded halt reason is a source halt,
// which resumes by itself once its cause is gone.
func SourceHalt(reason string) bool { stage, _ := HaltCause(reason); return stage == stageSource }
