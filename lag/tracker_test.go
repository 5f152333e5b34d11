package lag

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

func TestTrackerContiguous(t *testing.T) {
	tr := NewTracker(100)
	a := tr.Begin(time.Unix(1, 0))
	tr.Add(a, 12)
	tr.Add(a, 11)
	tr.Seal(a, 200)
	b := tr.Begin(time.Unix(2, 0))
	tr.Add(b, 10) // a lower position committed later
	tr.Seal(b, 300)

	// b finishes first: the watermark must not pass a.
	tr.Done(b, 1)
	if wm, _, idle := tr.Watermark(); wm != 100 || idle || tr.Position() != 0 {
		t.Fatalf("watermark = %v idle=%v position %d, want 100 busy 0", wm, idle, tr.Position())
	}
	if ts, ok := tr.Oldest(); !ok || !ts.Equal(time.Unix(1, 0)) {
		t.Fatalf("oldest = %v %v", ts, ok)
	}
	tr.Done(a, 1)
	if wm, _, _ := tr.Watermark(); wm != 100 {
		t.Fatalf("half of a done: watermark = %v", wm)
	}
	tr.Done(a, 1)
	wm, ct, idle := tr.Watermark()
	if wm != 300 || !idle || !ct.Equal(time.Unix(2, 0)) {
		t.Fatalf("watermark = %v %v idle=%v, want 300", wm, ct, idle)
	}
	if p := tr.Position(); p != 12 {
		t.Fatalf("position = %d, want 12 (the highest below the watermark)", p)
	}
	if _, ok := tr.Oldest(); ok {
		t.Fatal("oldest reported while caught up")
	}
}

func TestTrackerUnsealedBlocks(t *testing.T) {
	tr := NewTracker(0)
	a := tr.Begin(time.Now())
	tr.Add(a, 0)
	tr.Done(a, 1) // all events applied but the commit message not yet read
	if wm, _, idle := tr.Watermark(); wm != 0 || idle {
		t.Fatalf("unsealed txn advanced the watermark to %v (idle=%v)", wm, idle)
	}
	tr.Seal(a, 50)
	if wm, _, _ := tr.Watermark(); wm != 50 {
		t.Fatalf("watermark = %v, want 50", wm)
	}
}

func TestTrackerIdleAdvance(t *testing.T) {
	tr := NewTracker(10)
	if !tr.Advance(20) {
		t.Fatal("idle advance refused")
	}
	a := tr.Begin(time.Now())
	tr.Add(a, 0)
	if tr.Advance(30) {
		t.Fatal("advanced past an in-flight transaction")
	}
	if tr.Advance(15) {
		t.Fatal("moved backwards")
	}
	tr.Seal(a, 25)
	tr.Done(a, 1)
	if wm, _, _ := tr.Watermark(); wm != 25 {
		t.Fatalf("watermark = %v", wm)
	}
}

func TestTrackerWaitIdleConcurrent(t *testing.T) {
	tr := NewTracker(0)
	const n = 200
	toks := make([]uint64, n)
	for i := range toks {
		toks[i] = tr.Begin(time.Time{})
		tr.Add(toks[i], 0)
		tr.Seal(toks[i], event.LSN(i+1))
	}
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				tr.Done(toks[i], 1)
			}
		}(w)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tr.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if wm, _, idle := tr.Watermark(); wm != n || !idle {
		t.Fatalf("watermark = %v idle=%v", wm, idle)
	}
}

func TestTrackerAdvanceAfter(t *testing.T) {
	tr := NewTracker(10)
	moves := 0
	tr.OnMove(func() { moves++ })

	tr.AdvanceAfter(20) // nothing in flight: at once
	if wm, n := tr.Progress(); wm != 20 || n != 0 || moves != 1 {
		t.Fatalf("idle hint: watermark %v, %d txns, %d moves; want 20, 0, 1", wm, n, moves)
	}

	a := tr.Begin(time.Now())
	tr.Add(a, 1)
	tr.Seal(a, 30)
	tr.AdvanceAfter(40) // the server sent a, then reported 40: valid once a is done
	b := tr.Begin(time.Now())
	tr.Add(b, 2)
	tr.Seal(b, 50)
	tr.AdvanceAfter(60) // valid once b is done
	tr.AdvanceAfter(35) // older than a pending hint: ignored
	if wm, _ := tr.Progress(); wm != 20 {
		t.Fatalf("watermark %v passed in-flight transactions", wm)
	}
	tr.Done(b, 1) // b before a: still blocked by a
	if wm, _ := tr.Progress(); wm != 20 {
		t.Fatalf("watermark %v passed a", wm)
	}
	tr.Done(a, 1)
	if wm, n := tr.Progress(); wm != 60 || n != 2 {
		t.Fatalf("watermark %v after %d txns, want 60 after 2", wm, n)
	}

	// A hint while c is in flight applies when c is done, even though a
	// later transaction d is still in flight: d was registered after it.
	c := tr.Begin(time.Now())
	tr.Add(c, 3)
	tr.Seal(c, 70)
	tr.AdvanceAfter(80)
	d := tr.Begin(time.Now())
	tr.Add(d, 4)
	tr.Done(c, 1)
	if wm, _ := tr.Progress(); wm != 80 {
		t.Fatalf("watermark %v, want 80 (c done, hint after c)", wm)
	}
	tr.Seal(d, 90)
	tr.Done(d, 1)
	if wm, n := tr.Progress(); wm != 90 || n != 4 {
		t.Fatalf("watermark %v after %d txns, want 90 after 4", wm, n)
	}
}
