package engine

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/control"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// Stages of a halt, for the log, the lease row and pgscribe_halts_total.
const (
	stageSource = "source" // reading the events table: connect, slot, snapshot, stream
	stageLock   = "lock"   // taking the projection's lock on the target
	stageCommit = "commit" // a batch's transaction (apply.HaltError)
	// stageResource: the server refused a connection or a slot for want
	// of room (max_connections, max_wal_senders, max_replication_slots).
	stageResource = "resource"
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
	p.setHaltErr(errors.New(reason))
	p.setState(StateHalted)
	p.metrics.Halt(stageSource, code)
	p.log.Error("projection halted: the source cannot be read; nothing was acknowledged, probing every standby_poll, resumes by itself once the cause is gone",
		"stage", stageSource, "sqlstate", code, "err", err, "probe", errString(perr))
	if err := p.withTarget(ctx, func(conn *pgx.Conn) error { return lease.RecordHalt(ctx, conn, reason) }); err != nil {
		p.log.Warn("record halt on lease", "err", err)
	}
	failed := perr != nil && replication.Classify(perr) == sqlstate.ClassStructural
	return p.holdHaltedUntil(ctx, lease, ctl, seen, stageSource, func() bool {
		fp2, perr2 := p.probe(ctx)
		switch {
		case ctx.Err() != nil:
			return false
		case perr2 != nil && replication.Classify(perr2) != sqlstate.ClassStructural:
			p.log.Debug("source probe failed, retrying", "err", perr2)
			return false // the server is away: says nothing of the cause
		case perr2 != nil:
			if !failed || sqlstate.Code(perr2) != sqlstate.Code(perr) {
				p.log.Warn("source still cannot be read", "sqlstate", sqlstate.Code(perr2), "probe", perr2.Error())
			}
			failed, perr = true, perr2
			return false
		case failed:
			p.log.Info("source fault cleared: resuming", "stage", stageSource, "was", perr.Error())
		case fp2 != fp:
			p.log.Info("source changed since the halt: resuming", "stage", stageSource, "source", fp2)
		default:
			return false
		}
		return true
	})
}

// holdHaltedUntil keeps a halted projection's lock (lease) and reports its
// lag while check, called every standby_poll, says the cause is still
// there. It returns nil, the halt cleared, when check says it is gone or
// an operator resumes the projection (a resume after seen); or why not:
// ctx's error, or leader.ErrLost when the lock session is lost.
func (p *Projection) holdHaltedUntil(ctx context.Context, lease *leader.Lease, ctl *controls, seen control.State, stage string, check func() bool) error {
	stopReport := p.reportStandby(ctx) // lag keeps being reported while halted
	defer stopReport()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan error, 1)
	go func() { lost <- lease.Watch(wctx, p.cfg.Engine.LeaseTimeout/3) }()
	t := time.NewTicker(p.cfg.Engine.StandbyPoll)
	defer t.Stop()
	for {
		st, changed := ctl.current()
		if st.ResumeSeq != seen.ResumeSeq {
			p.log.Info("resume requested by an operator: retrying now", "stage", stage)
			break
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
		if check() {
			break
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	p.clearHalt(ctx, lease)
	p.setState(StateStarting)
	return nil
}

// resourceFault handles a session that ended because the server had no
// room for a connection or a slot (sqlstate.ResourceSetting) while lease
// is held, and returns nil when a new session should run (with the same
// lease), or why not: ctx's error or leader.ErrLost. Retrying at once,
// as for a transient error, only adds to the load, and every projection
// of a crowded server does so: instead the projection halts loudly,
// naming the setting (pgscribe_halted, the log, the lease row when a
// connection can be had for it, /readyz 503), keeps its lock, and checks
// every standby_poll whether the server has room again; it resumes then,
// logged, or at once on `pgscribe resume`. The probe needs one connection
// where a session needs several: a session that fails again within a
// minute makes the next resume wait longer (resourceBackoff), so that a
// server short of room is not retried every standby_poll. Nothing of what
// failed was acknowledged.
func (p *Projection) resourceFault(ctx context.Context, lease *leader.Lease, err error, ctl *controls) error {
	seen, _ := ctl.current()
	setting := sqlstate.ResourceSetting(err)
	code := sqlstate.Code(err)
	reason := fmt.Sprintf("resource halt (sqlstate %s): the server has no room (%s): %s", code, setting, err.Error())
	p.setHaltErr(errors.New(reason))
	p.setState(StateHalted)
	p.metrics.Halt(stageResource, code)
	p.resourceHalts++
	wait := resourceBackoff(p.cfg.Engine.StandbyPoll, p.resourceHalts)
	p.log.Error("projection halted: the server has no room for it; raise "+setting+" or make pgscribe use less (fewer groups, a smaller parallelism); nothing was acknowledged, checking every standby_poll, resumes by itself once there is room",
		"stage", stageResource, "setting", setting, "sqlstate", code, "err", err, "halts_in_a_row", p.resourceHalts, "resume_after", wait.String())
	halted := time.Now()
	if err := p.withTarget(ctx, func(conn *pgx.Conn) error { return lease.RecordHalt(ctx, conn, reason) }); err != nil {
		p.log.Warn("record halt on lease", "err", err)
	}
	return p.holdHaltedUntil(ctx, lease, ctl, seen, stageResource, func() bool {
		if time.Since(halted) < wait {
			return false
		}
		room, err := p.hasRoom(ctx, setting)
		if err != nil {
			p.log.Debug("resource probe failed, retrying", "setting", setting, "err", err)
		}
		if room {
			p.log.Info("the server has room again: resuming", "stage", stageResource, "setting", setting)
		}
		return room
	})
}

// resourceBackoff is how long the n-th resource halt in a row waits
// before it checks for room: standby_poll, doubled at each, at most a
// minute (the pipeline's restart backoff).
func resourceBackoff(poll time.Duration, n int) time.Duration {
	return min(poll<<min(max(n-1, 0), 16), time.Minute)
}

// hasRoom says whether the server now has room for what setting
// refused: a connection to the source and one to the target, a WAL
// sender, or a replication slot.
func (p *Projection) hasRoom(ctx context.Context, setting string) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	src, err := pgx.Connect(cctx, p.cfg.Database.URL)
	if err != nil {
		if sqlstate.ResourceSetting(err) != "" {
			return false, nil
		}
		return false, err
	}
	defer src.Close(context.WithoutCancel(ctx))
	var room bool
	switch setting {
	case "max_replication_slots":
		err = src.QueryRow(cctx, `SELECT count(*) < current_setting('max_replication_slots')::int FROM pg_replication_slots`).Scan(&room)
	case "max_wal_senders":
		err = src.QueryRow(cctx, `SELECT count(*) < current_setting('max_wal_senders')::int FROM pg_stat_replication`).Scan(&room)
	default:
		err = p.withTarget(cctx, func(*pgx.Conn) error { return nil })
		if sqlstate.ResourceSetting(err) != "" {
			return false, nil
		}
		room = err == nil
	}
	return room, err
}

// lockFault reports a lock attempt that failed: a structural failure (a
// failed password, a missing database, a revoked privilege) halts the
// projection loudly once, instead of standing by as if another node held
// the lock; acquire keeps trying every standby_poll. It returns whether
// the projection is now halted at the lock.
func (p *Projection) lockFault(err error, halted bool) bool {
	if setting := sqlstate.ResourceSetting(err); setting != "" {
		if !halted {
			code := sqlstate.Code(err)
			p.setHaltErr(fmt.Errorf("resource halt (sqlstate %s): the server has no room (%s): %w", code, setting, err))
			p.setState(StateHalted)
			p.metrics.Halt(stageLock, code)
			p.log.Error("projection halted: the server has no room for its lock session; raise "+setting+" or make pgscribe use less (fewer groups, a smaller parallelism); retrying every standby_poll, resumes by itself once there is room",
				"stage", stageLock, "setting", setting, "sqlstate", code, "err", err)
		}
		return true
	}
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
		p.setHaltErr(errors.New(reason + ": " + err.Error()))
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
	switch {
	case strings.HasPrefix(reason, "source halt"):
		stage = stageSource
	case strings.HasPrefix(reason, "resource halt"):
		stage = stageResource
	}
	if m := haltSQLState.FindStringSubmatch(reason); m != nil {
		code = m[1]
	}
	return stage, code
}

// SourceHalt reports whether a recorded halt reason is a source halt,
// which resumes by itself once its cause is gone.
func SourceHalt(reason string) bool { stage, _ := HaltCause(reason); return stage == stageSource }

// ResourceHalt reports whether a recorded halt reason is a resource halt
// (the server had no room), which resumes by itself once there is room.
func ResourceHalt(reason string) bool { stage, _ := HaltCause(reason); return stage == stageResource }
