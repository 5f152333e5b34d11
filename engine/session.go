package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
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
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/rules"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// session is one active period of a projection: from holding the lock to
// an error or a stop. Its steps are methods; what they share is here.
type session struct {
	*Projection
	lease *leader.Lease
	store *cursor.Store
	src   replication.Source

	pool    *pgxpool.Pool // target: batches, cursors, watermark
	srcConn *pgx.Conn     // source: slot inspection, then the lag probe's

	retry sqlstate.Policy // [retry]: of batches and of the session's fenced writes

	rebuild     bool                  // backfill from a new snapshot before streaming
	adopt       bool                  // first start with start_after_position: adopt before the backfill
	resume      *cursor.BackfillPoint // the rebuild goes on with an interrupted backfill on the version's slot
	backfilling atomic.Bool           // until the backfill's last event committed
	ledger      *ledger
	parts       *apply.Partitions

	ctl     *controls   // the operator controls this session obeys
	pausing atomic.Bool // an operator paused the live session: it ends with errPaused

	inGroup bool      // the plan: stream from the group's slot (hub), not the version's own
	start   event.LSN // where the ledger starts: every transaction committing below it is applied
	member  *member   // attached to the group's stream
	shared  bool      // the backfill was the group's scan
}

// session runs one active period while lease is held.
func (p *Projection) session(ctx context.Context, lease *leader.Lease, ctl *controls) error {
	s := &session{Projection: p, lease: lease, ctl: ctl, store: cursor.New(p.cfg.Engine.Schema, p.spec.Name, p.spec.Version),
		src:   p.source(),
		retry: sqlstate.Policy{MaxAttempts: p.cfg.Retry.MaxAttempts, Backoff: p.cfg.Retry.Backoff, MaxBackoff: p.cfg.Retry.MaxBackoff}}
	return s.run(ctx)
}

func (s *session) run(ctx context.Context) error {
	sessCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := s.connect(ctx); err != nil {
		return err
	}
	defer s.pool.Close()
	defer s.srcConn.Close(context.WithoutCancel(ctx))
	// A column pgscribe cannot read halts now, not at the first event: at
	// stage source (sourceFault), which resumes once the columns change.
	if err := replication.CheckTable(ctx, s.srcConn, s.src); err != nil {
		return atSource(err)
	}
	confirmed, err := s.plan(ctx)
	if err != nil {
		return err
	}
	s.backfilling.Store(s.rebuild)
	s.start = confirmed
	s.ledger = newLedger(confirmed, s.store, s.slot, s.log, s.fencedPipeline)
	if s.inGroup {
		s.ledger.setSlot(s.cfg.FeedSlot(s.spec))
	}
	s.ledger.saveVia = func(ctx context.Context, w cursor.Watermark) error {
		return sqlstate.Retry(ctx, s.retry, s.log, func() error { return s.hub.saver.save(ctx, s.lease, s.store, w) })
	}
	s.parts = s.partitions()

	// Workers run on a context that a graceful stop does not cancel: they
	// finish the in-flight batch, then return when stop closes. Only a hard
	// stop (p.hard) or a failure of the session cancels them mid-batch.
	workCtx, cancelWork := context.WithCancel(s.hard)
	defer cancelWork()
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopWorkers := func() { stopOnce.Do(func() { close(stop) }) }
	workErr := make(chan error, 1)
	go func() {
		err := s.parts.Run(workCtx, stop)
		if err != nil {
			cancel() // a failed partition ends the session
		}
		workErr <- err
	}()
	leaseErr := make(chan error, 1)
	go func() { leaseErr <- s.lease.Watch(sessCtx, s.cfg.Engine.LeaseTimeout/3) }()
	go func() {
		if err := <-leaseErr; err != nil {
			s.log.Error("lock session lost: stopping this projection on this node", "err", err)
			cancelWork() // fenced anyway; do not wait for in-flight batches
			cancel()
		}
	}()

	lagDone := make(chan struct{})
	go func() { defer close(lagDone); s.reportLag(sessCtx) }()
	pubDone := make(chan struct{})
	go func() { defer close(pubDone); s.ledger.publish(sessCtx, s.backfilling.Load) }()
	ctlDone := make(chan struct{})
	go func() { defer close(ctlDone); s.obeyControls(sessCtx, cancel) }()

	// The session opens a replication connection of its own only when it
	// comes to need one: to create its slot for a backfill alone, or to
	// stream its own slot until it joins the group's stream. A member that
	// streams from the group's slot, or shares its scan, opens none (the
	// group's stream has one).
	var replConn *pgconn.PgConn
	err = s.replicate(sessCtx, &replConn)
	if replConn != nil {
		defer replConn.Close(context.WithoutCancel(ctx))
	}
	// Shutdown order: stop intake (done: the stream returned), let workers
	// finish their in-flight batch, then confirm what is durable and record
	// the watermark, then (in Run) release the lock.
	stopWorkers()
	werr := <-workErr
	cancel()
	<-lagDone
	<-pubDone
	<-ctlDone
	switch {
	case s.member != nil:
		// The group's stream confirms its slot (hub.run); the version's
		// watermark holds it back until then.
		s.ledger.save(context.WithoutCancel(ctx), nil, time.Time{})
		s.hub.hold(s.spec, s.ledger.confirmable())
	case replConn != nil && !s.backfilling.Load():
		s.ledger.confirm(context.WithoutCancel(ctx), replConn)
	}
	if werr != nil {
		return werr
	}
	if ctx.Err() != nil {
		return nil
	}
	if s.pausing.Load() {
		return errPaused
	}
	return sourceHalt(err)
}

// sourceHalt makes an insert into a relation pgscribe cannot map to the
// events table a halt that waits for the operator: as a source error the
// probe would pass and sourceFault would resync past the insert, skipping
// it silently (the runbook's way out: the table out of the publication,
// the slot dropped). An events table pgscribe cannot read (ErrUnreadable)
// stays a source error: it halts at stage source and resumes by itself
// once the columns change (sourceFault).
func sourceHalt(err error) error {
	if errors.Is(err, replication.ErrForeignRelation) {
		return &apply.HaltError{Reason: "source events table", Err: err}
	}
	return err
}

// connect opens the target pool and the source connection.
func (s *session) connect(ctx context.Context) error {
	cfg := s.cfg
	poolCfg, err := pgxpool.ParseConfig(cfg.TargetURL())
	if err != nil {
		return fmt.Errorf("parse target url: %w", err)
	}
	poolCfg.MaxConns = int32(s.parallelism() + 2)
	poolCfg.ConnConfig.RuntimeParams["application_name"] = "pgscribe"
	// A node frozen inside a batch must not hold the lease row (FOR SHARE)
	// past its lease: the server ends such a transaction, so a takeover's
	// epoch bump is never blocked for longer than lease_timeout.
	poolCfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = fmt.Sprint(cfg.Engine.LeaseTimeout.Milliseconds())
	// The engine's own statements of every batch are prepared when a
	// connection opens, so that no batch waits for a round trip that
	// prepares them (pgx prepares a statement before its first pipeline).
	fenceSQL, _ := s.lease.CheckStatement()
	prepared := append([]string{"begin", "commit", fenceSQL, deadletter.InsertSQL(cfg.Engine.Schema)}, s.store.Statements()...)
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
	srcConn, err := pgx.Connect(ctx, cfg.Database.URL)
	if err != nil {
		pool.Close()
		return atSource(fmt.Errorf("connect source: %w", err))
	}
	s.pool, s.srcConn = pool, srcConn
	return nil
}

// plan decides between resuming from the slot and rebuilding from a new
// snapshot (s.rebuild), and readies the slot for it: a rebuild drops a
// stale slot, a resume frees it from a former holder. It returns the
// slot's confirmed position, where the watermark starts.
func (s *session) plan(ctx context.Context) (event.LSN, error) {
	wm, haveWM, err := s.store.LoadWatermark(ctx, s.pool)
	if err != nil {
		return 0, err
	}
	slot, err := replication.InspectSlot(ctx, s.srcConn, s.slot)
	if err != nil {
		return 0, atSource(err)
	}
	hasCursors, err := s.store.HasCursors(ctx, s.pool)
	if err != nil {
		return 0, err
	}
	resync := s.Projection.resync
	s.Projection.resync = "" // one resync per decision; an interrupted one resumes as a backfill
	s.onGroup.Store(false)
	if haveWM && (wm.SlotName == s.cfg.FeedSlot(s.spec) || wm.SlotName == s.cfg.GroupSlotName(s.spec.GroupName())) {
		if lsn, ok, err := s.planGroup(ctx, wm, slot, resync); err != nil || ok {
			return lsn, err
		}
		if wm, haveWM, err = s.store.LoadWatermark(ctx, s.pool); err != nil {
			return 0, err
		}
		if slot, err = replication.InspectSlot(ctx, s.srcConn, s.slot); err != nil {
			return 0, atSource(err)
		}
	}
	s.rebuild = resync != "" || !slot.Exists || slot.Lost() || !haveWM || wm.Phase != "live" || wm.SlotName != s.slot
	// Adoption is for a first start only: once any cursor exists, the
	// cursors are the record of what is accounted for, and adopting again
	// would count events twice.
	s.adopt = s.rebuild && !hasCursors && s.spec.StartAfterPosition > 0
	s.resume = nil
	if s.rebuild && !s.adopt && resync == "" && haveWM && wm.Phase == "backfilling" && wm.SlotName == s.slot && slot.Exists && !slot.Lost() {
		// An interrupted backfill on this version's own slot: when nothing
		// confirmed the slot past the consistent point it recorded, its
		// scan goes on from where every event was accounted for.
		pt, ok, err := s.store.LoadBackfillPoint(ctx, s.pool)
		if err != nil {
			return 0, err
		}
		if ok && pt.LSN == slot.Confirmed {
			s.resume = &pt
		}
	}
	switch {
	case resync != "":
		s.log.Warn("resyncing from a new snapshot as for a lost slot, per-stream cursors skip what was applied: "+resync, "slot", s.slot)
	case !s.rebuild:
		s.log.Info("resuming from slot", "slot", s.slot, "confirmed_lsn", slot.Confirmed.String())
	case hasCursors && haveWM && wm.Phase == "backfilling" && wm.SlotName != s.slot:
		// Recorded on the group's slot by its scan, which ended
		// without this version (dropped from it, or interrupted).
		s.log.Info("backfilling again: the group's scan did not finish this version's backfill; the group's next scan goes on with it when every member it seats was at it, else reads a new snapshot; per-stream cursors skip what was applied", "slot", s.slot, "scan_slot", wm.SlotName)
	case hasCursors && slot.Lost():
		s.log.Warn("slot was invalidated (WAL lost): resyncing from a new snapshot, per-stream cursors skip what was applied", "slot", s.slot)
	case hasCursors && !slot.Exists:
		s.log.Warn("slot is missing: resyncing from a new snapshot, per-stream cursors skip what was applied", "slot", s.slot)
	case s.resume != nil:
		s.log.Info("resuming an interrupted backfill on its slot, from where every event was accounted for; per-stream cursors skip what was applied above it",
			"slot", s.slot, "consistent_lsn", s.resume.LSN.String(), "after_position", s.resume.After, "events_done", s.resume.Done, "events", s.resume.Total)
	case hasCursors:
		s.log.Info("resuming an interrupted backfill from a new snapshot; per-stream cursors skip what was applied", "slot", s.slot)
	default:
		s.log.Info("first start: creating slot and backfilling from its snapshot", "slot", s.slot)
	}
	if s.rebuild && haveWM && wm.Phase == "live" {
		// Before any slot is dropped or created: a kill between the new
		// slot's creation and the backfill's start would otherwise leave a
		// live watermark on a slot whose consistent point is past events
		// never applied, and the next start would resume from it (found by
		// TestGroupKill9WhileJoining, killed during a resync).
		if err := setPhase(ctx, s.store, s.fenced, "backfilling", 0, 0); err != nil {
			return 0, err
		}
	}
	if s.rebuild && slot.Exists && s.resume == nil {
		if err := replication.DropSlot(ctx, s.srcConn, s.slot); err != nil {
			return 0, atSource(err)
		}
	} else if !s.rebuild || s.resume != nil {
		// A walsender left by a node that died or froze may still hold the
		// slot; end it now rather than wait for its TCP timeout. (srcConn is
		// used by the lag reporter from here on.)
		if err := replication.TerminateSlotHolder(ctx, s.srcConn, s.slot); err != nil {
			return 0, atSource(fmt.Errorf("free slot: %w", err))
		}
	}
	return slot.Confirmed, nil
}

// planGroup plans a session of a version whose watermark is recorded on
// its group's slot (wm.SlotName): the slot its group streams from now
// (FeedSlot), or the shared slot of a group that has shrunk to this
// version alone. ok says the plan is made: stream from the group's slot,
// the ledger starting at the returned position. Otherwise the usual plan
// follows: for a group of one whose slot cannot serve it, a rebuild or a
// resync; for a version that leaves a shared slot, on a slot of its own (a
// copy of the shared one, at or below its watermark, when there is one to
// copy).
func (s *session) planGroup(ctx context.Context, wm cursor.Watermark, own replication.SlotInfo, resync string) (event.LSN, bool, error) {
	gslot := wm.SlotName
	gs := own
	if gslot != s.slot {
		var err error
		if gs, err = replication.InspectSlot(ctx, s.srcConn, gslot); err != nil {
			return 0, false, atSource(err)
		}
	}
	usable := gs.Exists && !gs.Lost() && wm.Phase == "live"
	if usable && resync == "" && gslot == s.cfg.FeedSlot(s.spec) {
		if own.Exists && gslot != s.slot {
			// Left by a join that ended before it dropped it.
			if err := replication.DropSlot(ctx, s.srcConn, s.slot); err != nil {
				return 0, false, atSource(err)
			}
		}
		s.inGroup = true
		s.onGroup.Store(true)
		start := max(wm.LSN, gs.Confirmed)
		s.log.Info("resuming from the group's slot", "slot", gslot, "from", start.String(), "members", s.hub.members)
		return start, true, nil
	}
	if gslot == s.slot {
		return 0, false, nil // a group of one: its slot is its own
	}
	if wm.Phase == "backfilling" && resync == "" && gslot == s.cfg.FeedSlot(s.spec) {
		// The group's shared scan was interrupted: the version backfills
		// again, sharing the group's next scan when its members start
		// together, or on a slot of its own (which its watermark then
		// moves to). Cursors skip what it applied.
		return 0, false, nil
	}
	if !usable || resync != "" {
		// Nothing to copy: the slot-lost path (a resync from a new
		// snapshot, cursors skipping what was applied) follows.
		s.log.Warn("the group's slot cannot serve this version: leaving the group", "slot", gslot, "exists", gs.Exists, "lost", gs.Lost())
		if err := s.moveWatermark(ctx, s.slot); err != nil {
			return 0, false, err
		}
		s.hub.forget(s.spec)
		if resync != "" && gs.Exists {
			// The group's stream failed on the slot's own changes (a
			// resync is decided only then): it cannot serve any member.
			// Dropped, every member resyncs on a slot of its own and the
			// group's slot is created again when they join; kept, they
			// would join it again and fail as before (campaign seed 14).
			if err := replication.DropSlot(ctx, s.srcConn, gslot); err != nil {
				return 0, false, atSource(err)
			}
			s.log.Warn("dropped the group's slot: its changes cannot be decoded; every member resyncs and the slot is created again when they join", "slot", gslot)
		}
		return 0, false, nil
	}
	// Alone in its group now (a group of one streams from the version's
	// own slot): continue on a copy of the shared slot, and drop the shared
	// slot once no version is recorded on it.
	if err := s.copyGroupSlot(ctx, gslot); err != nil {
		return 0, false, err
	}
	var others int
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s.cfg.Engine.Schema, "watermarks"}.Sanitize()+
		" WHERE slot_name = $1", gslot).Scan(&others); err != nil {
		return 0, false, err
	}
	if others == 0 {
		if err := replication.DropSlot(ctx, s.srcConn, gslot); err != nil {
			return 0, false, atSource(err)
		}
		s.log.Info("dropped the group's slot: no version streams from it", "slot", gslot)
	}
	return 0, false, nil
}

// copyGroupSlot gives the version a slot of its own that streams from
// the shared slot gslot's confirmed position (at or below the version's
// watermark, which held it there) and records the watermark on it.
func (s *session) copyGroupSlot(ctx context.Context, gslot string) error {
	if gslot == s.slot {
		return fmt.Errorf("copy the group's slot %s: it is this version's own", gslot)
	}
	if err := replication.DropSlot(ctx, s.srcConn, s.slot); err != nil {
		return atSource(err)
	}
	at, err := replication.CopySlot(ctx, s.srcConn, gslot, s.slot)
	if err != nil {
		return atSource(err)
	}
	if err := s.moveWatermark(ctx, s.slot); err != nil {
		return err
	}
	s.hub.forget(s.spec)
	s.log.Info("streaming from a copy of the group's slot", "slot", s.slot, "group_slot", gslot, "from", at.String())
	return nil
}

// moveWatermark records the version's watermark on slot.
func (s *session) moveWatermark(ctx context.Context, slot string) error {
	return moveWatermark(ctx, s.store, s.fenced, slot)
}

// parallelism is the number of partitions of the version: [engine]
// parallelism, shared by the members of a group (each runs its share,
// rounded up, at least one). Eight projections with four partitions each
// commit 32 streams of small transactions where one commits 4: at 1k
// events/s the group's p99 was 4.8x one projection's with four each, 2.0x
// with the share (bench W7, quiet 2-core machine); partitions' batches
// grow in proportion (partitions), so a catch-up folds as much per batch.
func (s *session) parallelism() int {
	n := s.cfg.Engine.Parallelism
	if s.hub.members > 1 {
		n = (n + s.hub.members - 1) / s.hub.members
	}
	return max(n, 1)
}

// partitions builds the committer and its partitioned workers; committed
// batches are reported to the ledger.
func (s *session) partitions() *apply.Partitions {
	cfg := s.cfg
	committer := apply.NewCommitter(s.pool, apply.Options{
		Projection: s.spec.Name, Version: s.spec.Version, Schema: cfg.Engine.Schema,
		HaltOnError: s.spec.OnError == rules.OnErrorHalt, Park: s.spec.OnError == rules.OnErrorPark,
		MaxAttempts: cfg.Retry.MaxAttempts, Backoff: cfg.Retry.Backoff, MaxBackoff: cfg.Retry.MaxBackoff,
	}, s.prog, s.lease, s.metrics, s.log)
	// A member with fewer partitions than [engine] parallelism takes
	// proportionally larger batches when events queue up (a catch-up),
	// so that a batch still folds as many writes per row as parallelism
	// partitions' batches would; a live trickle still commits at once.
	parts := s.parallelism()
	scale := max(cfg.Engine.Parallelism/parts, 1)
	live := cfg.Engine.BatchSize * scale
	return apply.NewPartitions(committer, apply.PartitionOptions{
		Count: parts, QueueSize: max(cfg.Engine.QueueSize, 2*live),
		BatchSize: func() int {
			if s.backfilling.Load() {
				return cfg.Engine.BackfillBatchSize
			}
			return live
		},
		Linger:    cfg.Engine.BatchTimeout,
		Bytes:     int64(cfg.Engine.BufferMB) << 20,
		Committed: func(batch []apply.Input, _ apply.Result) { s.ledger.committed(batch) },
	})
}

// replicate backfills when the plan says so, then streams from the slot
// until ctx ends or the stream fails.
func (s *session) replicate(ctx context.Context, connp **pgconn.PgConn) error {
	replConn := *connp
	sink := &ledgerSink{ledger: s.ledger, parts: s.parts}
	if s.rebuild {
		s.setState(StateBackfilling)
		err := s.backfill(ctx, connp, sink)
		replConn = *connp
		if err != nil {
			return err
		}
		s.backfilling.Store(false)
	}
	s.setState(StateLive)
	feed := s.cfg.FeedSlot(s.spec)
	if !s.inGroup && s.slot == feed {
		// A group of one: its own slot is the one the group's stream
		// reads.
		s.inGroup = true
		s.onGroup.Store(true)
	}
	opts := replication.StreamOptions{StatusInterval: s.cfg.Engine.StatusInterval, StallTimeout: s.cfg.Engine.StallTimeout, Logger: s.log}
	if s.inGroup {
		m, err := s.hub.join(ctx, s.spec, sink, s.start, "", false)
		if err == nil {
			if err = waitStarted(ctx, m); err == nil {
				s.member = m
				if s.shared {
					s.log.Info("joined the group's stream", "slot", feed, "at", s.start.String(), "after", "the group's scan")
				}
				return m.wait()
			}
		}
		if !errors.Is(err, errBehind) {
			return err
		}
		if feed == s.slot {
			// The hub restarts a stream no other member reads for a
			// member behind it (hub.join): this one is still read by a
			// session of this version that has not let go yet.
			return fmt.Errorf("the group's stream is past this version's watermark and still serves an earlier session: %w", err)
		}
		// The group's stream has passed this version: catch up on a copy
		// of the group's slot, then join.
		if err := s.copyGroupSlot(ctx, feed); err != nil {
			return err
		}
		s.inGroup = false
		s.onGroup.Store(false)
		s.ledger.setSlot(s.slot)
		c, err := replication.ConnectReplication(ctx, s.cfg.Database.URL)
		if err != nil {
			return atSource(err)
		}
		replConn, *connp = c, c
	} else {
		// Offer to join at once: the group's stream takes the version
		// from its position if it can (it starts there when it has not
		// started yet).
		m, err := s.hub.join(ctx, s.spec, sink, s.start, s.slot, false)
		if err == nil {
			if err = waitStarted(ctx, m); err == nil {
				s.member = m
				return s.joined(ctx, replConn, s.start)
			}
		}
		if !errors.Is(err, errBehind) {
			return err
		}
		if replConn == nil {
			c, err := replication.ConnectReplication(ctx, s.cfg.Database.URL)
			if err != nil {
				return atSource(err)
			}
			replConn, *connp = c, c
		}
	}
	return s.streamAndJoin(ctx, replConn, sink, opts)
}

// waitStarted waits until the group's stream serves m or refuses it.
func waitStarted(ctx context.Context, m *member) error {
	select {
	case err := <-m.started:
		return err
	case <-m.done: // the stream failed before it started
		return m.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// joined moves the watermark of a version the group's stream now serves
// (from position at) to the group's slot, drops its own slot, and takes
// its events from the group's stream until the session ends.
func (s *session) joined(ctx context.Context, replConn *pgconn.PgConn, at event.LSN) error {
	gslot := s.cfg.FeedSlot(s.spec)
	if err := s.ledger.switchSlot(ctx, gslot); err != nil {
		return err
	}
	s.onGroup.Store(true)
	s.log.Info("joined the group's stream", "slot", gslot, "at", at.String(), "after", "its own slot")
	if replConn != nil {
		replConn.Close(context.WithoutCancel(ctx))
	}
	if err := replication.DropSlot(ctx, s.srcConn, s.slot); err != nil {
		s.log.Warn("drop the version's own slot after joining its group (the next start drops it)", "slot", s.slot, "err", err)
	}
	return s.member.wait()
}

// streamAndJoin streams the version's own slot until it can join its
// group's stream at a transaction boundary (joinSink), then moves its
// watermark to the group's slot, drops its own slot and takes its events
// from the group's stream.
func (s *session) streamAndJoin(ctx context.Context, replConn *pgconn.PgConn, sink *ledgerSink, opts replication.StreamOptions) error {
	jctx, cancel := context.WithCancel(ctx)
	defer cancel()
	js := &joinSink{ledgerSink: sink, hub: s.hub, ctx: ctx, spec: s.spec, ownSlot: s.slot, cancel: cancel, from: s.start}
	err := replication.Stream(jctx, replConn, s.src, js, opts)
	s.hub.unwait(s.spec)
	if js.m == nil || ctx.Err() != nil {
		if js.m != nil {
			s.member = js.m
		}
		return atSlot(err)
	}
	s.member = js.m
	return s.joined(ctx, replConn, max(js.at, js.from))
}

// backfill creates the slot with an exported snapshot, applies every event
// visible in it, and marks the projection live. Crash-safe at any point: a
// restart finds phase "backfilling" and rebuilds from a new snapshot, and
// per-stream cursors skip what was applied.
//
// No transaction stays open while it reads (see scan). A member of a
// group whose stream is not running shares one scan of the group's slot
// with the members that start with it (hub.shareScan): the events are
// read and decoded once for all of them, and they join the group's stream
// at the slot's consistent point. Otherwise (a version alone, a member
// joining a running group, an adoption) the version scans its own slot;
// *connp is the replication connection the slot is created on, and nil
// after the backfill (the scout's walsender ends with it).
func (s *session) backfill(ctx context.Context, connp **pgconn.PgConn, sink *ledgerSink) error {
	// A version resuming its own slot's backfill goes on there: its slot
	// is not the group's, and a scan of the group's would leave it behind.
	if s.hub.members > 1 && !s.adopt && s.resume == nil {
		if seat := s.hub.shareScan(s.spec, s.prog); seat != nil {
			err := s.sharedBackfill(ctx, seat, sink)
			if !errors.Is(err, errNotShared) {
				return err
			}
			s.log.Info("backfilling from a slot of its own: the group's scan is not shared", "slot", s.slot)
		}
	}
	if *connp == nil {
		c, err := replication.ConnectReplication(ctx, s.cfg.Database.URL)
		if err != nil {
			return atSource(err)
		}
		*connp = c
	}
	var before func(*replication.Snapshot) error
	if s.adopt {
		before = func(snap *replication.Snapshot) error { return s.adoptHeads(ctx, snap) }
	}
	var sc *scan
	var err error
	from := cursor.BackfillPoint{After: math.MinInt64}
	resumed := s.resume != nil
	if pt := s.resume; pt != nil {
		s.resume = nil // once: a failure from here starts a new session, which plans again
		sc, err = resumeScan(ctx, s.cfg, s.src, *connp, s.slot, s.log, *pt)
		from = *pt
	} else {
		sc, err = openScan(ctx, s.cfg, s.src, *connp, s.slot, s.log, before)
	}
	*connp = nil // the scan's now
	if err != nil {
		return err
	}
	defer sc.close(ctx)
	from.LSN, from.UpTo, from.Total = sc.consistent, sc.snap.UpTo, sc.total
	return s.applyScan(ctx, sink, scanned{slot: s.slot, consistent: sc.consistent, total: sc.total, snapTime: sc.snapTime,
		from: from, resumed: resumed, next: sc.next, finish: func(ctx context.Context) error { return sc.finish(ctx, s.srcConn) }})
}

// sharedBackfill applies the group's scan from seat; errNotShared says
// there is none to share (the version scans alone).
func (s *session) sharedBackfill(ctx context.Context, seat *seat, sink *ledgerSink) (err error) {
	defer func() {
		seat.leave()
		if err != nil {
			s.hub.unexpect(s.spec) // it will not join: the stream need not wait
		}
	}()
	var st scanStart
	select {
	case st = <-seat.start:
	case <-ctx.Done():
		return ctx.Err()
	}
	if st.err != nil {
		return st.err
	}
	gslot := s.cfg.FeedSlot(s.spec)
	s.ledger.setSlot(gslot)
	s.onGroup.Store(true)
	err = s.applyScan(ctx, sink, scanned{slot: gslot, consistent: st.consistent, total: st.total, snapTime: st.snapTime,
		from: st.from, resumed: st.resumed, next: seat.next, finish: seat.finish})
	if err != nil {
		return err
	}
	s.inGroup, s.shared = true, true
	return nil
}

// scanned is a backfill's source as the version applies it: its own scan
// or its seat at the group's.
type scanned struct {
	slot       string
	consistent event.LSN
	total      int64
	snapTime   time.Time
	// from is where the scan starts: its backfill point (After
	// math.MinInt64 for a new snapshot; a resumed scan's After and Done).
	from    cursor.BackfillPoint
	resumed bool                                                // an interrupted scan of slot goes on (resumeScan)
	next    func(context.Context) ([]*event.Event, bool, error) // false after the last page
	finish  func(context.Context) error                         // after the last page: the slot is free for the stream
}

// applyScan records the backfill, applies every page of sc, and marks the
// version live at sc's consistent point once every event is accounted for.
func (s *session) applyScan(ctx context.Context, sink *ledgerSink, sc scanned) error {
	if err := startBackfill(ctx, s.store, s.fenced, sc.slot, sc.consistent, sc.total, sc.from); err != nil {
		return err
	}
	if !sc.resumed {
		s.log.Info("backfill started", "slot", sc.slot, "consistent_lsn", sc.consistent.String(), "events", sc.total)
	} else {
		s.log.Info("backfill resumed", "slot", sc.slot, "consistent_lsn", sc.consistent.String(), "events", sc.total,
			"after_position", sc.from.After, "events_done", sc.from.Done)
	}
	started := time.Now()
	lastLog, lastSave := started, started
	done := sc.from.Done
	marks := pageMarks{at: sc.from}
	if err := eachPage(ctx, sc.next, func(evs []*event.Event) error {
		// A snapshot batch is one transaction of the ledger, sealed at 0:
		// it never moves the slot's watermark by itself.
		tok := sink.Begin(0, time.Time{})
		for _, ev := range evs {
			if err := sink.Event(ctx, tok, ev); err != nil {
				return err
			}
		}
		sink.Commit(tok, 0)
		done += int64(len(evs))
		if len(evs) > 0 {
			marks.read(evs[len(evs)-1].Position, done)
		}
		s.metrics.SetBackfill(done, sc.total)
		if time.Since(lastSave) >= backfillSaveEvery {
			lastSave = time.Now()
			if err := saveProgress(ctx, s.store, s.fenced, sc.total, done, marks.accounted(s.ledger.tracker.Position())); err != nil && ctx.Err() == nil {
				s.log.Warn("record the backfill's progress (the next save catches up; a restart meanwhile resumes from an earlier point)", "err", err)
			}
		}
		if time.Since(lastLog) >= 5*time.Second {
			lastLog = time.Now()
			s.logProgress(done, sc.total, started)
		}
		return nil
	}); err != nil {
		return err
	}
	if err := sc.finish(ctx); err != nil {
		return err
	}
	if !sc.snapTime.IsZero() {
		sink.Commit(sink.Begin(0, sc.snapTime), 0)
	}
	if err := s.ledger.settle(ctx); err != nil {
		return err
	}
	if err := setPhase(ctx, s.store, s.fenced, "live", sc.total, done); err != nil {
		return err
	}
	s.ledger.reached(sc.consistent)
	s.start = sc.consistent
	el := time.Since(started)
	s.log.Info("backfill complete", "events", done, "seconds", el.Round(time.Millisecond).Seconds(),
		"events_per_second", int64(float64(done)/max(el.Seconds(), 1e-9)))
	return nil
}

// backfillSaveEvery is how often, at most, a backfill records its
// progress and its point (where it resumes when interrupted): at a page's
// end, when this long has passed since the last save. The save is a fenced
// transaction committed asynchronously — a save lost in a server crash
// leaves an earlier point, which is as valid, only further back — so it
// costs a few round trips and no WAL flush: at ten a second, well under a
// percent of a core per version.
const backfillSaveEvery = 100 * time.Millisecond

// pageMarks keeps, for the pages of a backfill not yet known to be
// accounted for, the position of each one's last event and the events
// read up to it, so that the backfill point saved with the progress is a
// position every event at or below which is accounted for.
type pageMarks struct {
	at    cursor.BackfillPoint // the last page known to be accounted for
	pages []cursor.BackfillPoint
}

// read records a page whose last event is at position, done events read
// up to it.
func (m *pageMarks) read(position, done int64) {
	m.pages = append(m.pages, cursor.BackfillPoint{After: position, Done: done})
}

// accounted returns the backfill point once every page whose last event
// is at or below position is accounted for (the ledger's position: pages
// are read in position order, one transaction of the ledger each).
func (m *pageMarks) accounted(position int64) cursor.BackfillPoint {
	i := 0
	for i < len(m.pages) && m.pages[i].After <= position {
		i++
	}
	if i > 0 {
		m.at.After, m.at.Done = m.pages[i-1].After, m.pages[i-1].Done
		m.pages = m.pages[i:]
	}
	return m.at
}

// adoptHeads seeds the cursors of a first start with start_after_position
// = N: under the slot's snapshot, each stream's last event at or below N
// becomes its cursor, and its events at or below N count as adopted. All
// streams commit in one fenced transaction, so a crash leaves all or none
// (and a restart with none adopts again, from its own snapshot). The
// backfill that follows reads the snapshot as always; the cursors make it
// skip what was adopted.
//
// Events at or below N that commit after the snapshot was taken (positions
// are not commit-ordered) are not in it and no cursor covers them (no later
// event of their stream can have committed before them), so they are
// applied when they stream in.
func (s *session) adoptHeads(ctx context.Context, snap *replication.Snapshot) error {
	n := s.spec.StartAfterPosition
	var events, streams int64
	err := s.fenced(ctx, func(tx pgx.Tx) error {
		events, streams = 0, 0
		return snap.Heads(ctx, n, adoptPage, func(hs []replication.Head) error {
			heads := make([]cursor.Head, len(hs))
			for i, h := range hs {
				heads[i] = cursor.Head(h)
				events += h.Events
			}
			streams += int64(len(hs))
			return s.store.Adopt(ctx, tx, heads)
		})
	})
	if err != nil {
		return fmt.Errorf("adopt up to position %d: %w", n, err)
	}
	s.log.Info("adopted the replaced projector's work", "start_after_position", n, "streams", streams, "events", events)
	return nil
}

// adoptPage is how many stream cursors one statement of the adoption
// writes.
const adoptPage = 5000

// snapshotCommitTime returns the newest commit time among the last
// snapshotCommitScan events (by position) that conn sees, zero when
// track_commit_timestamp is off or the times are gone (rows older than the
// setting, or frozen). conn is the backfill's snapshot connection: the
// query runs in its open snapshot transaction. Positions are assigned at
// insert, not in commit order; the scan covers that reordering.
func snapshotCommitTime(ctx context.Context, conn *pgx.Conn, src config.Source) (time.Time, error) {
	table := event.Table(src.Table).Quoted()
	pos := pgx.Identifier{src.Columns.Position}.Sanitize()
	var ct *time.Time
	err := conn.QueryRow(ctx, `SELECT CASE WHEN current_setting('track_commit_timestamp') = 'on' THEN
  (SELECT max(pg_xact_commit_timestamp(xmin)) FROM (SELECT xmin FROM `+table+` ORDER BY `+pos+` DESC LIMIT $1) AS e) END`,
		snapshotCommitScan).Scan(&ct)
	if err != nil || ct == nil {
		return time.Time{}, err
	}
	return *ct, nil
}

// snapshotCommitScan is how many of the snapshot's newest events
// snapshotCommitTime reads.
const snapshotCommitScan = 1000

func (s *session) logProgress(done, total int64, started time.Time) {
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
	s.log.Info("backfill progress", "done", done, "total", total, "percent", fmt.Sprintf("%.1f", pct),
		"events_per_second", int64(rate), "eta", eta.Round(time.Second).String())
}

// fencedPipeline runs stmts in a transaction that verifies the lease epoch
// first, in one round trip (BEGIN, the check, stmts, COMMIT), retried like
// fenced. The ledger saves the watermark this way up to a few hundred
// times a second, where the five round trips of fenced would cost the
// engine more CPU than the batches that moved it.
func (s *session) fencedPipeline(ctx context.Context, stmts ...statement) error {
	return sqlstate.Retry(ctx, s.retry, s.log, func() error {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		var b pgx.Batch
		b.Queue("begin")
		check, args := s.lease.CheckStatement()
		b.Queue(check, args...)
		for _, st := range stmts {
			b.Queue(st.sql, st.args...)
		}
		b.Queue("commit")
		br := conn.SendBatch(ctx, &b)
		for i := 0; i < len(stmts)+3 && err == nil; i++ {
			if _, err = br.Exec(); err != nil && i == 1 {
				err = s.lease.CheckFailed(err)
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err != nil && conn.Conn().PgConn().TxStatus() != 'I' {
			// A failed statement left the transaction open (aborted):
			// end it, or the pool drops the connection.
			_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback")
		}
		return err
	})
}

// fenced runs fn in a transaction that verifies the lease epoch first.
//
// Transient failures (a killed pooled connection, a server restart) are
// retried like a batch's ([retry] backoff and max_attempts): one broken
// connection must not end the session, which would restart a backfill from
// a new snapshot. fn must be safe to run again.
func (s *session) fenced(ctx context.Context, fn func(pgx.Tx) error) error {
	return sqlstate.Retry(ctx, s.retry, s.log, func() error {
		return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
			if err := s.lease.Check(ctx, tx); err != nil {
				return err
			}
			return fn(tx)
		})
	})
}
