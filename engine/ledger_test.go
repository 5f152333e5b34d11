package engine

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/lag"
)

// The ledger confirms a source transaction only once every one of its
// events committed, whatever order the partitions finish in.
func TestLedgerConfirmsCommittedPrefix(t *testing.T) {
	l := &ledger{tracker: lag.NewTracker(10)}
	in := func(tok uint64, pos int64) apply.Input {
		return apply.Input{Event: &event.Event{Position: pos}, Token: tok}
	}
	t1 := l.begin(testTime)
	a, b := in(t1, 1), in(t1, 2)
	l.take(t1, a.Event)
	l.take(t1, b.Event)
	l.seal(t1, 100)
	t2 := l.begin(testTime)
	c := in(t2, 3)
	l.take(t2, c.Event)
	l.seal(t2, 200)

	steps := []struct {
		batch []apply.Input
		want  event.LSN
	}{
		{batch: []apply.Input{c}, want: 10}, // the later transaction first: nothing moves
		{batch: []apply.Input{a}, want: 10}, // half of the first
		{batch: []apply.Input{b}, want: 200},
	}
	for i, st := range steps {
		l.committed(st.batch)
		if got := l.confirmable(); got != st.want {
			t.Fatalf("step %d: confirmable = %s, want %s", i, got, st.want)
		}
	}
	if err := l.settle(context.Background()); err != nil {
		t.Fatal(err)
	}
	l.reached(300)
	if got := l.confirmable(); got != 300 {
		t.Errorf("idle, reached 300: confirmable = %s", got)
	}
}

var testTime = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// publish saves the watermark soon after it moves over applied events,
// saves a move to an idle WAL end once (not its own WAL in a loop), and
// saves every measurement.
func TestLedgerPublish(t *testing.T) {
	saves := make(chan struct{}, 100)
	fenced := func(context.Context, ...statement) error {
		saves <- struct{}{}
		return nil
	}
	l := newLedger(10, cursor.New("pgscribe", "p", 1), "slot", slog.New(slog.DiscardHandler), fenced)
	var backfilling atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.publish(ctx, backfilling.Load) }()
	defer func() { cancel(); <-done }()

	expect := func(what string, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			select {
			case <-saves:
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: save %d of %d did not come", what, i+1, n)
			}
		}
		select {
		case <-saves:
			t.Fatalf("%s: more than %d saves", what, n)
		case <-time.After(50 * time.Millisecond):
		}
	}
	apply1 := func(end event.LSN) {
		tok := l.begin(testTime)
		ev := &event.Event{Position: 1}
		l.take(tok, ev)
		l.seal(tok, end)
		l.committed([]apply.Input{{Event: ev, Token: tok}})
	}

	apply1(100)
	expect("applied events", 1)
	l.tracker.AdvanceAfter(150) // the WAL of that save and its batch
	expect("first idle advance", 1)
	l.tracker.AdvanceAfter(200) // the WAL of the idle save: not again
	expect("second idle advance", 0)
	l.measured(lag.Reading{}, time.Now())
	expect("measurement", 1)
	apply1(300)
	expect("applied events again", 1)

	backfilling.Store(true)
	apply1(400)
	expect("backfilling", 0)
}
