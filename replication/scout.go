package replication

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/event"
)

// A Scout lets a backfill read the events table in short transactions
// instead of one transaction open on the slot's snapshot throughout (which
// holds back vacuum on the whole cluster for as long as the backfill
// runs). A page read later than the snapshot sees the snapshot's events
// and the events of transactions committed since the slot's consistent
// point: exactly the transactions the slot streams. The scout streams the
// slot from that point while the backfill reads, without confirming
// anything, and records the positions those transactions inserted (up
// to the snapshot's highest position: a page never reads above it). A
// page read when the WAL stood at L, once the scout has passed L, is the
// snapshot's events of that page plus those positions: removing them
// leaves the snapshot's, with no gap and no duplicate, whatever the order
// in which the writers' transactions committed. No transaction id is
// compared (a tuple's xmin is 32 bits, and a frozen one keeps its old
// value).
type Scout struct {
	consistent event.LSN
	upTo       int64

	mu       sync.Mutex
	moved    chan struct{} // closed and replaced when reached moves or the stream ends
	reached  event.LSN     // every transaction that committed below it was delivered
	inserted map[int64]struct{}
	over     bool  // the stream ended
	err      error // why the stream ended

	cancel context.CancelFunc
	ended  chan struct{}
}

// StartScout streams the slot from its consistent point on conn (a
// replication connection that runs nothing else until Stop) and records
// the positions at most upTo that the streamed transactions insert.
func StartScout(ctx context.Context, conn *pgconn.PgConn, src Source, consistent event.LSN, upTo int64, o StreamOptions) *Scout {
	ctx, cancel := context.WithCancel(ctx)
	s := &Scout{consistent: consistent, upTo: upTo, moved: make(chan struct{}), reached: consistent,
		inserted: map[int64]struct{}{}, cancel: cancel, ended: make(chan struct{})}
	if o.StatusInterval <= 0 || o.StatusInterval > scoutStatusInterval {
		// Each status asks the server for a keepalive, which says how far
		// the stream has read: a page waits for that at most this long
		// when no write comes along.
		o.StatusInterval = scoutStatusInterval
	}
	go func() {
		err := Stream(ctx, conn, src, s, o)
		s.mu.Lock()
		s.over, s.err = true, err
		close(s.moved)
		s.mu.Unlock()
		close(s.ended)
	}()
	return s
}

// scoutStatusInterval bounds the scout's standby status interval: each
// asks the server for a keepalive, which says how far the stream has
// read. A page waits for the scout to pass its WAL position: the server
// sends a keepalive by itself once it has read past what the scout last
// acknowledged, and the page's position is flushed (Snapshot.Next), so
// this is a fallback. Measured (W9, 256 KB events): every 10 ms made the
// backfill 3× slower (the cause was not established); waiting for the
// server to flush the position by itself, rather than flushing it,
// doubled its time.
const scoutStatusInterval = 100 * time.Millisecond

// ErrScoutStopped is Wait's error after Stop.
var ErrScoutStopped = errors.New("scout stopped")

// Wait waits until every transaction that committed before lsn has been
// streamed, or fails with why the scout's stream ended.
func (s *Scout) Wait(ctx context.Context, lsn event.LSN) error {
	for {
		s.mu.Lock()
		reached, moved, ended, err := s.reached, s.moved, s.over, s.err
		s.mu.Unlock()
		if reached >= lsn {
			return nil
		}
		if ended {
			if err == nil || errors.Is(err, context.Canceled) {
				return ErrScoutStopped
			}
			return err
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Streamed says whether a transaction committed after the consistent
// point inserted position (at most upTo). Ask after Wait.
func (s *Scout) Streamed(position int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.inserted[position]
	return ok
}

// Stop ends the stream and waits for it. It returns the stream's error
// when the stream had failed by itself.
func (s *Scout) Stop() error {
	s.cancel()
	<-s.ended
	if s.err == nil || errors.Is(s.err, context.Canceled) {
		return nil
	}
	return s.err
}

// advance moves reached to lsn when it is higher and wakes the waiters.
func (s *Scout) advance(lsn event.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lsn <= s.reached {
		return
	}
	s.reached = lsn
	close(s.moved)
	s.moved = make(chan struct{})
}

// The scout is the Sink of its stream.

func (s *Scout) Begin(event.LSN, time.Time) uint64 { return 0 }

func (s *Scout) Event(_ context.Context, _ uint64, ev *event.Event) error {
	if ev.Position <= s.upTo {
		s.mu.Lock()
		s.inserted[ev.Position] = struct{}{}
		s.mu.Unlock()
	}
	return nil
}

// Commit: the transactions stream in commit order, so every one that
// committed before end has been delivered.
func (s *Scout) Commit(_ uint64, end event.LSN) { s.advance(end) }

// Confirmable keeps the slot at its consistent point: the engine's own
// stream reads it again from there after the backfill.
func (s *Scout) Confirmable() event.LSN { return s.consistent }

// AdvanceIdle: a keepalive between transactions says the server has sent
// everything before walEnd.
func (s *Scout) AdvanceIdle(walEnd event.LSN) { s.advance(walEnd) }
