package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/lag"
	"github.com/pgscribe/pgscribe/replication"
)

// ledger is the one place that decides what is durable: it registers
// every source transaction and event the session takes in, hears which
// batches committed, and from that alone answers what the slot may be
// confirmed to (the contiguous watermark of its lag.Tracker), records it in
// the watermarks table and confirms the slot at shutdown. Nothing else in
// the engine confirms or saves a watermark.
//
// Safe for concurrent use: the reader registers work while partition
// workers report commits and the lag reporter saves.
type ledger struct {
	tracker *lag.Tracker
	store   *cursor.Store
	slot    string
	log     *slog.Logger
	// fenced runs the statements in one fenced transaction.
	fenced func(ctx context.Context, stmts ...statement) error
	// saveVia, when set, runs publish's saves instead of fenced: a group's
	// members share one (saver), which also paces them (publishGap).
	saveVia func(ctx context.Context, w cursor.Watermark) error

	moved chan struct{} // the watermark moved or a measurement came (capacity 1)
	mu    sync.Mutex
	slotN string       // the slot the watermark is recorded on, when it moved (switchSlot)
	meas  *lag.Reading // the last measurement not yet saved
	at    time.Time    // when meas was taken
}

// newLedger returns the ledger of a session whose watermark starts at
// start (the slot's confirmed position).
func newLedger(start event.LSN, store *cursor.Store, slot string, log *slog.Logger,
	fenced func(ctx context.Context, stmts ...statement) error) *ledger {
	l := &ledger{tracker: lag.NewTracker(start), store: store, slot: slot, log: log, fenced: fenced,
		moved: make(chan struct{}, 1)}
	l.tracker.OnMove(l.wake)
	return l
}

// wake tells publish that there may be something to save. Never blocks:
// wakes that come while publish is busy fold into one.
func (l *ledger) wake() {
	select {
	case l.moved <- struct{}{}:
	default:
	}
}

// measured hands the lag reporter's measurement to publish, which saves it
// with the watermark (the progress view reads both from the row).
func (l *ledger) measured(r lag.Reading, at time.Time) {
	l.mu.Lock()
	l.meas, l.at = &r, at
	l.mu.Unlock()
	l.wake()
}

// publishGap is the shortest time between two watermark saves. The
// watermark is saved by publish alone, so partitions never contend for
// its row; this bounds that one writer to 200 small transactions a second
// (one round trip each, fenced, committed asynchronously) under any load,
// and is about the most a wait_for_lsn waits past the moment the watermark
// moved. Measured (bench -w4-wait, 2-core machine): 2 ms cost the engine
// about 50 µs of CPU per event at 1k events/s, a save every 2.5 ms.
const publishGap = 5 * time.Millisecond

// publish is the one writer of the watermark while the session runs (a
// group member's saves go through the group's saver; leaving a group
// changes only the row's slot_name, session.moveWatermark).
// It saves the watermark soon after it moves (at most every publishGap),
// and with each lag measurement (every lag_interval, idle or not, as the
// heartbeat status and the progress view read). It does nothing while
// backfilling: the backfill records its own progress.
//
// An advance with no new transaction of events (the watermark rose to an
// idle WAL end from a keepalive) is saved once, then left for the next
// heartbeat: every save writes WAL, which the server reports in its next
// keepalive, and saving that again would make an idle engine write forever.
// The one save is what a wait for pg_current_wal_lsn(), taken right after
// an append, needs: that LSN is at most the WAL end the server reports
// after sending the append and the batch that applied it.
func (l *ledger) publish(ctx context.Context, backfilling func() bool) {
	var saved event.LSN
	var savedTxns uint64
	idleSaved := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.moved:
		}
		if backfilling() {
			continue
		}
		lsn, txns := l.tracker.Progress()
		l.mu.Lock()
		m, at := l.meas, l.at
		l.meas = nil
		l.mu.Unlock()
		switch {
		case m != nil: // a heartbeat: always saved
		case lsn <= saved:
			continue
		case txns == savedTxns && idleSaved:
			continue
		}
		w, ok := l.save(ctx, m, at)
		if !ok {
			continue
		}
		idleSaved = m == nil && txns == savedTxns
		saved, savedTxns = w, txns
		if l.saveVia != nil {
			continue // the shared saver paces
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(publishGap):
		}
	}
}

// begin registers a source transaction in commit order (zero commitTime
// for a backfill batch) and returns its token.
func (l *ledger) begin(commitTime time.Time) uint64 { return l.tracker.Begin(commitTime) }

// take registers one event of the transaction as in flight.
func (l *ledger) take(tok uint64, ev *event.Event) { l.tracker.Add(tok, ev.Position) }

// seal marks the transaction complete at its end LSN (0 for backfill).
func (l *ledger) seal(tok uint64, end event.LSN) { l.tracker.Seal(tok, end) }

// committed accounts for a committed batch (or a dead-lettered one: its
// events are durably accounted for either way).
func (l *ledger) committed(batch []apply.Input) {
	// Tokens repeat in runs (events of one transaction): report runs.
	for i := 0; i < len(batch); {
		j := i + 1
		for j < len(batch) && batch[j].Token == batch[i].Token {
			j++
		}
		l.tracker.Done(batch[i].Token, j-i)
		i = j
	}
}

// settle waits until every event taken in is accounted for (or ctx ends).
func (l *ledger) settle(ctx context.Context) error { return l.tracker.WaitIdle(ctx) }

// reached raises the watermark to lsn once nothing is in flight: the end
// of a backfill (its snapshot's consistent point), everything below which
// is now applied.
func (l *ledger) reached(lsn event.LSN) { l.tracker.Advance(lsn) }

// confirmable is the position the stream may confirm to the server.
func (l *ledger) confirmable() event.LSN { lsn, _, _ := l.tracker.Watermark(); return lsn }

// save records the watermark in the watermarks table, fenced by the lease,
// with the measurement m (taken at at) when it is not nil. It returns the
// watermark saved and whether it saved one. Errors are logged: the next
// save (or the slot) catches up.
func (l *ledger) save(ctx context.Context, m *lag.Reading, at time.Time) (event.LSN, bool) {
	// Position first: both only grow, so the position read before the
	// watermark belongs to transactions at or below it.
	pos := l.tracker.Position()
	lsn, ct, _ := l.tracker.Watermark()
	if lsn == 0 {
		return 0, false
	}
	// Phase is left as stored: only backfill's SetPhase moves it, after
	// every snapshot event committed.
	w := cursor.Watermark{SlotName: l.slotName(), LSN: lsn, Position: pos, CommitTime: ct}
	if m != nil {
		w.MeasuredAt, w.LagSeconds, w.Backlog = at, m.LagSeconds, m.Backlog
		if !m.BacklogKnown {
			w.Backlog = -1
		}
	}
	// Asynchronous commit: the watermark only ever claims batches that
	// committed (synchronously) before it was computed, so losing the last
	// few saves in a server crash loses no guarantee, and the saves do not
	// each wait for a WAL flush. The stored LSN never moves backwards
	// (SaveWatermark keeps the greater).
	var err error
	if l.saveVia != nil {
		err = l.saveVia(ctx, w)
	} else {
		var sql string
		var args []any
		if sql, args, err = l.store.SaveWatermarkStatement(w); err == nil {
			err = l.fenced(ctx, statement{sql: "SET LOCAL synchronous_commit = off"}, statement{sql: sql, args: args})
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			l.log.Warn("save watermark", "err", err)
		}
		return 0, false
	}
	return lsn, true
}

// setSlot records the watermark on slot from now on.
func (l *ledger) setSlot(slot string) {
	l.mu.Lock()
	l.slotN = slot
	l.mu.Unlock()
}

func (l *ledger) slotName() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.slotN != "" {
		return l.slotN
	}
	return l.slot
}

// switchSlot records the watermark on slot from now on, and saves it
// there at once, committed synchronously: a version that joined its
// group's stream is on the group's slot before its own slot is dropped.
func (l *ledger) switchSlot(ctx context.Context, slot string) error {
	l.setSlot(slot)
	pos := l.tracker.Position()
	lsn, ct, _ := l.tracker.Watermark()
	sql, args, err := l.store.SaveWatermarkStatement(cursor.Watermark{SlotName: slot, LSN: lsn, Position: pos, CommitTime: ct})
	if err != nil {
		return err
	}
	msql, margs := l.store.MoveWatermarkStatement(slot)
	return l.fenced(ctx, statement{sql: msql, args: margs}, statement{sql: sql, args: args})
}

// confirm confirms the slot to the watermark at shutdown, after the
// workers finished their in-flight batches, and then records the same
// watermark: the table never claims more than the slot was told.
func (l *ledger) confirm(ctx context.Context, replConn *pgconn.PgConn) {
	if err := replication.Confirm(ctx, replConn, l.confirmable()); err == nil {
		l.save(ctx, nil, time.Time{})
	}
}

// The writes of a session outside its ledger's life, kept here so that
// this file (with saver.go, the group's saves) is the only one that
// writes a watermark row or confirms a slot (TestDurabilityHasOneOwner).

// txRunner runs fn in one fenced transaction (session.fenced).
type txRunner func(ctx context.Context, fn func(pgx.Tx) error) error

// moveWatermark records the version's watermark on slot: the version
// leaves its group's slot for one of its own.
func moveWatermark(ctx context.Context, store *cursor.Store, fenced txRunner, slot string) error {
	return fenced(ctx, func(tx pgx.Tx) error { return store.MoveWatermark(ctx, tx, slot) })
}

// startBackfill records a backfill from slot's snapshot at consistent, of
// total events, starting at its backfill point from: phase backfilling
// until setPhase says live.
func startBackfill(ctx context.Context, store *cursor.Store, fenced txRunner, slot string, consistent event.LSN, total int64,
	from cursor.BackfillPoint) error {
	return fenced(ctx, func(tx pgx.Tx) error {
		// A resync moves a stored watermark to the new slot.
		if err := store.MoveWatermark(ctx, tx, slot); err != nil {
			return err
		}
		if err := store.SetPhase(ctx, tx, "backfilling", total, from.Done); err != nil {
			return err
		}
		if err := store.SaveWatermark(ctx, tx, cursor.Watermark{SlotName: slot, LSN: consistent, Phase: "backfilling", BackfillTotal: total}); err != nil {
			return err
		}
		return store.SaveBackfillPoint(ctx, tx, from)
	})
}

// saveProgress records the backfill's progress and its point (where it
// resumes when interrupted) in one transaction, committed asynchronously
// (backfillSaveEvery).
func saveProgress(ctx context.Context, store *cursor.Store, fenced txRunner, total, done int64, at cursor.BackfillPoint) error {
	return fenced(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
			return err
		}
		if err := store.SetPhase(ctx, tx, "backfilling", total, done); err != nil {
			return err
		}
		return store.SaveBackfillPoint(ctx, tx, at)
	})
}

// setPhase records the phase and the backfill's progress.
func setPhase(ctx context.Context, store *cursor.Store, fenced txRunner, phase string, total, done int64) error {
	return fenced(ctx, func(tx pgx.Tx) error { return store.SetPhase(ctx, tx, phase, total, done) })
}

// confirmSlot confirms a group's slot to lsn when its stream ends (hub).
func confirmSlot(ctx context.Context, conn *pgconn.PgConn, lsn event.LSN) error {
	return replication.Confirm(ctx, conn, lsn)
}

// statement is one statement of a fenced pipeline.
type statement struct {
	sql  string
	args []any
}

// ledgerSink adapts the session to replication.Sink: what the stream
// reads goes through the ledger into the partitions.
type ledgerSink struct {
	ledger *ledger
	parts  *apply.Partitions
}

func (s *ledgerSink) Begin(_ event.LSN, t time.Time) uint64 { return s.ledger.begin(t) }
func (s *ledgerSink) Event(ctx context.Context, tok uint64, ev *event.Event) error {
	s.ledger.take(tok, ev)
	if err := s.parts.Dispatch(ctx, apply.Input{Event: ev, Token: tok}); err != nil {
		s.ledger.tracker.Done(tok, 1) // not taken: it will be offered again
		return err
	}
	return nil
}
func (s *ledgerSink) Commit(tok uint64, end event.LSN) { s.ledger.seal(tok, end) }
func (s *ledgerSink) Confirmable() event.LSN           { return s.ledger.confirmable() }
func (s *ledgerSink) AdvanceIdle(walEnd event.LSN)     { s.ledger.tracker.AdvanceAfter(walEnd) }
