package engine

import (
	"context"
	"log/slog"
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
	// fenced runs fn in a transaction that verifies the lease first.
	fenced func(ctx context.Context, fn func(pgx.Tx) error) error
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

// save records the watermark in the watermarks table, fenced by the lease.
// Errors are logged: the next save (or the slot) catches up.
func (l *ledger) save(ctx context.Context) {
	// Position first: both only grow, so the position read before the
	// watermark belongs to transactions at or below it.
	pos := l.tracker.Position()
	lsn, ct, _ := l.tracker.Watermark()
	if lsn == 0 {
		return
	}
	err := l.fenced(ctx, func(tx pgx.Tx) error {
		// Phase is left as stored: only backfill's SetPhase moves it, after
		// every snapshot event committed.
		return l.store.SaveWatermark(ctx, tx, cursor.Watermark{SlotName: l.slot, LSN: lsn, Position: pos, CommitTime: ct})
	})
	if err != nil && ctx.Err() == nil {
		l.log.Warn("save watermark", "err", err)
	}
}

// confirm confirms the slot to the watermark at shutdown, after the
// workers finished their in-flight batches, and then records the same
// watermark: the table never claims more than the slot was told.
func (l *ledger) confirm(ctx context.Context, replConn *pgconn.PgConn) {
	if err := replication.Confirm(ctx, replConn, l.confirmable()); err == nil {
		l.save(ctx)
	}
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
func (s *ledgerSink) AdvanceIdle(walEnd event.LSN)     { s.ledger.reached(walEnd) }
