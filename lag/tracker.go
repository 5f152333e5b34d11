// Package lag tracks the contiguous watermark of a projection (the source
// position up to which every event is durably accounted for), measures how
// far behind the projection is, and exposes both as Prometheus metrics and
// health endpoints.
package lag

import (
	"context"
	"sync"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

// Tracker records source transactions in commit order and which of their
// events are still in flight. The watermark is the end LSN of the longest
// prefix of transactions that are complete (sealed by their commit message)
// and fully applied: everything at or below it is durably accounted for, so
// it is the only position the replication slot may be confirmed to.
//
// Tracker is safe for concurrent use: the replication reader registers
// transactions and events while partition workers report completions.
type Tracker struct {
	mu        sync.Mutex
	txns      map[uint64]*txn
	order     []uint64 // tokens in commit order; order[head:] are pending
	head      int
	next      uint64
	watermark event.LSN
	wmTime    time.Time
	wmPos     int64
	idle      chan struct{} // closed when nothing is pending; replaced when work arrives
	// gen counts the transactions with events the watermark has passed,
	// so that a reader can tell an advance over applied events from one
	// to an idle WAL end.
	gen uint64
	// hints are WAL ends the server reported (AdvanceAfter), each valid
	// once every transaction registered before it is done: hints[0] is
	// the oldest pending one, hints[1] the newest (later ones replace it).
	hints [2]hint
	moved func() // called (without mu) when the watermark moved; may be nil
}

type hint struct {
	lsn      event.LSN
	boundary uint64 // every token below it must be done
}

type txn struct {
	endLSN     event.LSN
	commitTime time.Time
	maxPos     int64 // highest event position registered
	pending    int
	events     bool // had an event
	sealed     bool
}

// NewTracker returns a tracker whose watermark starts at start (the slot's
// confirmed position, or 0).
func NewTracker(start event.LSN) *Tracker {
	t := &Tracker{txns: make(map[uint64]*txn), next: 1, watermark: start, idle: make(chan struct{})}
	close(t.idle)
	return t
}

// Begin registers a source transaction (in commit order) and returns its
// token. commitTime is the source commit timestamp (zero for backfill).
func (t *Tracker) Begin(commitTime time.Time) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok := t.next
	t.next++
	t.txns[tok] = &txn{commitTime: commitTime}
	t.order = append(t.order, tok)
	t.busy()
	return tok
}

// busy marks the tracker as having pending work. Caller holds mu.
func (t *Tracker) busy() {
	select {
	case <-t.idle:
		t.idle = make(chan struct{})
	default:
	}
}

// Add counts one more in-flight event of the transaction, at position
// pos of the events table.
func (t *Tracker) Add(tok uint64, pos int64) {
	t.mu.Lock()
	if x := t.txns[tok]; x != nil {
		x.pending++
		x.events = true
		x.maxPos = max(x.maxPos, pos)
	}
	t.mu.Unlock()
}

// OnMove sets fn to be called, outside the tracker's lock, each time the
// watermark moves (from the goroutine that moved it; fn must not block).
// Set it before any use.
func (t *Tracker) OnMove(fn func()) { t.moved = fn }

// Seal marks the transaction complete: all its events were registered and
// endLSN is where the slot may be confirmed to once they are applied.
func (t *Tracker) Seal(tok uint64, endLSN event.LSN) {
	t.mu.Lock()
	if x := t.txns[tok]; x != nil {
		x.sealed = true
		x.endLSN = endLSN
	}
	moved := t.advance()
	t.mu.Unlock()
	t.notify(moved)
}

// Done reports n events of the transaction as durably accounted for.
func (t *Tracker) Done(tok uint64, n int) {
	t.mu.Lock()
	if x := t.txns[tok]; x != nil {
		x.pending -= n
	}
	moved := t.advance()
	t.mu.Unlock()
	t.notify(moved)
}

func (t *Tracker) notify(moved bool) {
	if moved && t.moved != nil {
		t.moved()
	}
}

// advance moves the watermark over the complete prefix, then over the
// hints that became valid, and reports whether it moved. Caller holds mu.
func (t *Tracker) advance() (moved bool) {
	before := t.watermark
	for t.head < len(t.order) {
		tok := t.order[t.head]
		x := t.txns[tok]
		if !x.sealed || x.pending > 0 {
			break
		}
		if x.endLSN > t.watermark {
			t.watermark = x.endLSN
		}
		if !x.commitTime.IsZero() {
			t.wmTime = x.commitTime
		}
		t.wmPos = max(t.wmPos, x.maxPos)
		if x.events {
			t.gen++
		}
		delete(t.txns, tok)
		t.head++
	}
	for t.hints[0].lsn != 0 && (t.head == len(t.order) || t.order[t.head] >= t.hints[0].boundary) {
		t.watermark = max(t.watermark, t.hints[0].lsn)
		t.hints[0], t.hints[1] = t.hints[1], hint{}
	}
	if t.head > 1024 && t.head*2 > len(t.order) {
		t.order = append(t.order[:0:0], t.order[t.head:]...)
		t.head = 0
	}
	if t.head == len(t.order) {
		select {
		case <-t.idle:
		default:
			close(t.idle)
		}
	}
	return t.watermark != before
}

// Watermark returns the contiguous watermark, the commit time of the last
// transaction below it, and whether nothing at all is in flight.
func (t *Tracker) Watermark() (lsn event.LSN, commitTime time.Time, idle bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark, t.wmTime, t.head == len(t.order)
}

// Progress returns the contiguous watermark and how many transactions
// with events it has passed: a reader that sees the watermark move with
// the count unchanged knows it moved only to an idle WAL end.
func (t *Tracker) Progress() (lsn event.LSN, txns uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.watermark, t.gen
}

// Position returns the highest events position among the events of the
// transactions below the watermark that this tracker saw (0 before any).
// Positions are assigned when rows are inserted, not in commit order, so a
// lower position can still be above the watermark: this says how far the
// projection has got, not that every lower position is accounted for.
func (t *Tracker) Position() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.wmPos
}

// Oldest returns the commit time of the oldest transaction not yet fully
// applied, and whether there is one. Backfill transactions (zero commit
// time) are skipped.
func (t *Tracker) Oldest() (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, tok := range t.order[t.head:] {
		if x := t.txns[tok]; x != nil && !x.commitTime.IsZero() {
			return x.commitTime, true
		}
	}
	return time.Time{}, false
}

// Pending returns the number of transactions not yet fully applied.
func (t *Tracker) Pending() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.order) - t.head
}

// WaitIdle blocks until nothing is in flight or ctx ends.
func (t *Tracker) WaitIdle(ctx context.Context) error {
	for {
		t.mu.Lock()
		ch := t.idle
		t.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
			t.mu.Lock()
			done := t.head == len(t.order)
			t.mu.Unlock()
			if done {
				return nil
			}
		}
	}
}

// Advance raises the watermark to lsn when nothing is in flight (idle
// confirmation from the server's WAL end). It reports whether it did.
func (t *Tracker) Advance(lsn event.LSN) bool {
	t.mu.Lock()
	if t.head != len(t.order) || lsn <= t.watermark {
		t.mu.Unlock()
		return false
	}
	t.watermark = lsn
	t.mu.Unlock()
	t.notify(true)
	return true
}

// AdvanceAfter raises the watermark to lsn as soon as every transaction
// registered so far is done: at once when nothing is in flight, else when
// the last of them is. lsn is a WAL end the server reported (a keepalive)
// after sending every transaction registered so far, so nothing below it
// is missing once those are applied. Unlike Advance, a keepalive that
// arrives while the last batch is still committing is not lost: under a
// steady load the watermark still reaches the server's WAL end.
func (t *Tracker) AdvanceAfter(lsn event.LSN) {
	t.mu.Lock()
	if lsn <= t.watermark || lsn <= t.hints[0].lsn || lsn <= t.hints[1].lsn {
		t.mu.Unlock()
		return
	}
	h := hint{lsn: lsn, boundary: t.next}
	if t.hints[0].lsn == 0 {
		t.hints[0] = h
	} else {
		t.hints[1] = h
	}
	moved := t.advance()
	t.mu.Unlock()
	t.notify(moved)
}
