package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/apply"
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
