package engine

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// recSink records what a member's ledger would see.
type recSink struct {
	mu      sync.Mutex
	txns    []event.LSN // commit LSN of each transaction begun
	events  []int64     // positions taken
	ends    []event.LSN
	idle    []event.LSN
	confirm event.LSN
	block   chan struct{} // when set, Event waits for it (a slow member)
}

func (r *recSink) Begin(c event.LSN, _ time.Time) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.txns = append(r.txns, c)
	return uint64(len(r.txns))
}

func (r *recSink) Event(ctx context.Context, _ uint64, ev *event.Event) error {
	if r.block != nil {
		select {
		case <-r.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, ev.Position)
	return nil
}

func (r *recSink) Commit(_ uint64, end event.LSN) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ends = append(r.ends, end)
	r.confirm = end
}

func (r *recSink) Confirmable() event.LSN {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.confirm
}

func (r *recSink) AdvanceIdle(w event.LSN) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.idle = append(r.idle, w)
}

func (r *recSink) snapshot() (txns []event.LSN, events []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.txns), slices.Clone(r.events)
}

func testHub(members int) *hub {
	return newHub(groupConfig{name: "g", slot: "s"}, members, slog.New(slog.DiscardHandler))
}

// streaming marks the hub's stream as started at start, as hub.stream
// does once the slot is open.
func (h *hub) startedAt(start event.LSN) {
	h.mu.Lock()
	h.streaming, h.startLSN, h.sent = true, start, start
	h.mu.Unlock()
	h.refuse(start, false)
}

// txn feeds one transaction of events (positions) committing at c and
// ending at c+1 through the hub's sink.
func txn(t *testing.T, h *hub, c event.LSN, positions ...int64) {
	t.Helper()
	s := (*hubSink)(h)
	s.Begin(c, time.Time{})
	for _, p := range positions {
		if err := s.Event(context.Background(), 0, &event.Event{Position: p}); err != nil {
			t.Fatal(err)
		}
	}
	s.Commit(0, c+1)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func spec(name string) rules.Spec { return rules.Spec{Name: name, Version: 1} }

// A member gets exactly the transactions committing at or after its
// position, each once, in order; a member that joins at a boundary gets
// only what follows.
func TestHubDeliversFromEachMembersPosition(t *testing.T) {
	h := testHub(2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := &recSink{}, &recSink{}
	if _, err := h.join(ctx, spec("a"), a, 100, "", false); err != nil {
		t.Fatal(err)
	}
	if _, err := h.join(ctx, spec("b"), b, 300, "", false); err != nil {
		t.Fatal(err)
	}
	h.startedAt(100)
	txn(t, h, 100, 1, 2)
	txn(t, h, 200, 3)
	txn(t, h, 300, 4, 5)
	// c joins from its own slot at a boundary: its own stream delivered
	// everything below 400.
	c := &recSink{}
	if _, err := h.join(ctx, spec("c"), c, 400, "pgscribe_c_v1", true); err != nil {
		t.Fatalf("join at a boundary past every begun transaction: %v", err)
	}
	txn(t, h, 400, 6)

	wantTx := map[string][]event.LSN{"a": {100, 200, 300, 400}, "b": {300, 400}, "c": {400}}
	wantEv := map[string][]int64{"a": {1, 2, 3, 4, 5, 6}, "b": {4, 5, 6}, "c": {6}}
	for name, s := range map[string]*recSink{"a": a, "b": b, "c": c} {
		eventually(t, name+"'s last event", func() bool { _, ev := s.snapshot(); return len(ev) == len(wantEv[name]) })
		tx, ev := s.snapshot()
		if !slices.Equal(tx, wantTx[name]) || !slices.Equal(ev, wantEv[name]) {
			t.Errorf("%s got transactions %v events %v, want %v %v", name, tx, ev, wantTx[name], wantEv[name])
		}
	}
}

// A join from a slot of its own is refused while the stream has begun a
// transaction at or after the member's position (it would miss or repeat
// it), and before the stream runs at all.
func TestHubRefusesAJoinThatWouldMissOrRepeat(t *testing.T) {
	h := testHub(1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := h.join(ctx, spec("x"), &recSink{}, 500, "own", true); err != errBehind {
		t.Fatalf("boundary join before the stream runs: %v, want errBehind", err)
	}
	h.startedAt(600)
	if _, err := h.join(ctx, spec("x"), &recSink{}, 500, "own", true); err != errBehind {
		t.Fatalf("join below the stream's start: %v, want errBehind", err)
	}
	txn(t, h, 700, 1)
	if _, err := h.join(ctx, spec("x"), &recSink{}, 700, "own", true); err != errBehind {
		t.Fatalf("join at a begun transaction's commit: %v, want errBehind", err)
	}
	if _, err := h.join(ctx, spec("x"), &recSink{}, 701, "own", true); err != nil {
		t.Fatalf("join past every begun transaction: %v", err)
	}
}

// Provisional members below where the stream starts are refused (from a
// slot of their own) or told the slot cannot serve them (on the group's).
func TestHubStartSettlesProvisionalMembers(t *testing.T) {
	h := testHub(3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	low, lowGroup, high := &recSink{}, &recSink{}, &recSink{}
	mLow, _ := h.join(ctx, spec("low"), low, 100, "own_low", false)
	mLowGroup, _ := h.join(ctx, spec("lowgroup"), lowGroup, 100, "", false)
	mHigh, _ := h.join(ctx, spec("high"), high, 300, "own_high", false)
	h.startedAt(200)
	if err := <-mLow.started; err != errBehind {
		t.Errorf("own-slot member below the start: %v, want errBehind", err)
	}
	if err := <-mLowGroup.started; err == nil || err == errBehind {
		t.Errorf("group member below the start: %v, want the slot-lost error", err)
	}
	if err := <-mHigh.started; err != nil {
		t.Errorf("member above the start: %v, want served", err)
	}
}

// The slot is confirmed to the lowest of the attached members and the
// recorded watermarks of those not attached; a member that leaves the
// group no longer holds it.
func TestHubConfirmsTheLowestWatermark(t *testing.T) {
	h := testHub(2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := &recSink{confirm: 500}
	if _, err := h.join(ctx, spec("a"), a, 500, "", false); err != nil {
		t.Fatal(err)
	}
	h.startedAt(400)
	h.hold(spec("paused"), 450)
	if got := h.confirmable(); got != 450 {
		t.Fatalf("confirmable %s, want the paused member's 450", got)
	}
	h.forget(spec("paused"))
	if got := h.confirmable(); got != 500 {
		t.Fatalf("confirmable %s after the paused member left, want 500", got)
	}
}

// A slow member makes the stream wait (bounded queue), never drops or
// repeats: an Event cut short by the stream's deadline is offered again
// only to the members that had not taken it.
func TestHubSlowMemberBackpressureWithoutRepeats(t *testing.T) {
	h := testHub(2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fast, slow := &recSink{}, &recSink{block: make(chan struct{})}
	h.join(ctx, spec("fast"), fast, 0, "", false)
	h.join(ctx, spec("slow"), slow, 0, "", false)
	h.startedAt(0)
	s := (*hubSink)(h)
	s.Begin(10, time.Time{})
	n := memberQueue + 10
	released := false
	for p := 1; p <= n; p++ {
		ev := &event.Event{Position: int64(p)}
		for {
			// While the queues have room a send must never be refused; the
			// deadline is long there, since a deadline that has passed by the
			// time Event selects (a descheduled test on a loaded machine)
			// races the send. Short once the slow member's queue may be full.
			wait := 10 * time.Second
			if p >= memberQueue {
				wait = 5 * time.Millisecond
			}
			dctx, dcancel := context.WithTimeout(context.Background(), wait)
			err := s.Event(dctx, 0, ev)
			dcancel()
			if err == nil {
				break
			}
			if p < memberQueue {
				t.Fatalf("event %d refused with the queue not full: %v", p, err)
			}
			if !released {
				close(slow.block) // the slow member catches up
				released = true
			}
		}
	}
	if !released {
		t.Fatal("the slow member's queue never filled: no Event was cut short and offered again")
	}
	s.Commit(0, 11)
	for name, r := range map[string]*recSink{"fast": fast, "slow": slow} {
		eventually(t, name+" to take every event", func() bool { _, ev := r.snapshot(); return len(ev) == n })
		_, ev := r.snapshot()
		for i, p := range ev {
			if p != int64(i+1) {
				t.Fatalf("%s: event %d is position %d: repeated or out of order", name, i, p)
			}
		}
	}
}

// A member whose own batches are still in flight below what the slot may
// already be confirmed to is not taken: a crash would resume it from the
// slot's confirmed position and lose them.
func TestHubRefusesAJoinWithWorkBelowTheConfirmedPosition(t *testing.T) {
	h := testHub(2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := h.join(ctx, spec("a"), &recSink{confirm: 800}, 600, "", false); err != nil {
		t.Fatal(err)
	}
	h.startedAt(600)
	if got := (*hubSink)(h).Confirmable(); got != 800 {
		t.Fatalf("confirmable %s, want 800", got)
	}
	if _, err := h.join(ctx, spec("b"), &recSink{confirm: 700}, 801, "own", true); err != errBehind {
		t.Fatalf("join with work in flight below the confirmed 800: %v, want errBehind", err)
	}
	if _, err := h.join(ctx, spec("b"), &recSink{confirm: 800}, 801, "own", true); err != nil {
		t.Fatalf("join with everything below 800 durable: %v", err)
	}
}

// A member whose queue stays full for slow_member_timeout is detached
// with errSlowMember: the others take every event without waiting for it
// past the timeout, the slow one's watermark holds the slot back, and the
// stream never waits for it to join again.
func TestHubDetachesAMemberWhoseQueueStaysFull(t *testing.T) {
	h := testHub(2)
	h.cfg.slowAfter = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fast, slow := &recSink{}, &recSink{block: make(chan struct{}), confirm: 5}
	defer close(slow.block)
	h.join(ctx, spec("fast"), fast, 0, "", false)
	ms, _ := h.join(ctx, spec("slow"), slow, 0, "", false)
	h.startedAt(0)
	s := (*hubSink)(h)
	s.Begin(10, time.Time{})
	n := memberQueue + 100
	started := time.Now()
	for p := 1; p <= n; p++ {
		if err := s.Event(ctx, 0, &event.Event{Position: int64(p)}); err != nil {
			t.Fatalf("event %d: %v", p, err)
		}
	}
	s.Commit(0, 11)
	if d := time.Since(started); d > 5*time.Second {
		t.Errorf("the stream waited %s for the slow member, want about slow_member_timeout (200ms)", d)
	}
	select {
	case <-ms.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the slow member was not detached")
	}
	if !errors.Is(ms.err, errSlowMember) {
		t.Errorf("the slow member was detached with %v, want errSlowMember", ms.err)
	}
	eventually(t, "fast to take every event and commit", func() bool {
		_, ev := fast.snapshot()
		return len(ev) == n && fast.Confirmable() == 11
	})
	if got := s.Confirmable(); got != 5 {
		t.Errorf("confirmable %s after the detach, want the slow member's watermark 5", got)
	}
	// Asking to join again (from a slot of its own) never holds the stream.
	if _, err := h.join(ctx, spec("slow"), &recSink{}, 11, "own", true); err == nil {
		t.Fatal("join at the stream's position while the stream has passed it")
	}
	h.mu.Lock()
	h.waiting[memberKey(spec("slow"))] = time.Now().Add(-time.Minute)
	h.mu.Unlock()
	held := make(chan struct{})
	go func() { h.holdForJoiners(ctx); close(held) }()
	select {
	case <-held:
	case <-time.After(2 * time.Second):
		t.Fatal("the stream waits for a member detached as slow to join")
	}
}

// A catch-up (transactions committed longer than slow_member_timeout ago)
// holds nobody back either: a member whose queue stays full while
// another's is low is not detached until the stream is live again.
func TestHubDetachesNobodyInACatchUp(t *testing.T) {
	h := testHub(2)
	h.cfg.slowAfter = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fast, slow := &recSink{}, &recSink{block: make(chan struct{})}
	h.join(ctx, spec("fast"), fast, 0, "", false)
	ms, _ := h.join(ctx, spec("slow"), slow, 0, "", false)
	h.startedAt(0)
	s := (*hubSink)(h)
	s.Begin(10, time.Now().Add(-time.Minute)) // committed a minute ago
	fed := make(chan error, 1)
	go func() {
		for p := 1; p <= memberQueue+100; p++ {
			if err := s.Event(ctx, 0, &event.Event{Position: int64(p)}); err != nil {
				fed <- err
				return
			}
		}
		fed <- nil
	}()
	select {
	case <-ms.done:
		t.Fatalf("detached in a catch-up: %v", ms.err)
	case <-time.After(time.Second): // ten windows of slow_member_timeout
	}
	close(slow.block)
	if err := <-fed; err != nil {
		t.Fatal(err)
	}
	select {
	case <-ms.done:
		t.Fatalf("detached in a catch-up: %v", ms.err)
	default:
	}
}

// When every member's queue is full (a catch-up the whole group is behind
// in) nobody holds the others back: the stream waits, nobody is detached.
func TestHubDetachesNobodyWhenAllQueuesAreFull(t *testing.T) {
	h := testHub(2)
	h.cfg.slowAfter = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a, b := &recSink{block: make(chan struct{})}, &recSink{block: make(chan struct{})}
	ma, _ := h.join(ctx, spec("a"), a, 0, "", false)
	mb, _ := h.join(ctx, spec("b"), b, 0, "", false)
	h.startedAt(0)
	s := (*hubSink)(h)
	s.Begin(10, time.Time{})
	var refused bool
	for p := 1; p <= memberQueue+10 && !refused; p++ {
		dctx, dcancel := context.WithTimeout(ctx, time.Second)
		refused = s.Event(dctx, 0, &event.Event{Position: int64(p)}) != nil
		dcancel()
	}
	if !refused {
		t.Fatal("the queues never filled")
	}
	for name, m := range map[string]*member{"a": ma, "b": mb} {
		select {
		case <-m.done:
			t.Errorf("%s was detached (%v) though every queue was full", name, m.err)
		default:
		}
	}
	close(a.block)
	close(b.block)
}

// A member detached as slow joins again only after its cooldown, which
// doubles with each detach.
func TestHubSlowMemberRejoinsAfterItsCooldown(t *testing.T) {
	h := testHub(2)
	h.cfg.slowAfter = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	h.join(ctx, spec("fast"), &recSink{}, 0, "", false)
	slow, _ := h.join(ctx, spec("slow"), &recSink{}, 0, "", false)
	h.startedAt(0)
	h.detachSlow(slow)
	if _, err := h.join(ctx, spec("slow"), &recSink{}, 1, "own", true); !errors.Is(err, errBehind) {
		t.Fatalf("a member detached as slow joined within its cooldown: %v", err)
	}
	eventually(t, "the slow member to join after its cooldown", func() bool {
		m, err := h.join(ctx, spec("slow"), &recSink{}, 1, "own", true)
		if err == nil {
			slow = m
		}
		return err == nil
	})
	h.detachSlow(slow)
	h.mu.Lock()
	cool := time.Until(h.slow[memberKey(spec("slow"))].until)
	h.mu.Unlock()
	if cool < 150*time.Millisecond {
		t.Errorf("second cooldown %s, want about twice slow_member_timeout (200ms)", cool)
	}
}

// A commit's age is read on the server's clock, which stamped it: a node
// whose clock is off by seconds neither takes a live stream for a
// catch-up (no member would ever be detached) nor the reverse.
func TestHubLiveReadsTheServersClock(t *testing.T) {
	h := testHub(2)
	h.cfg.slowAfter = 5 * time.Second // live: committed less than 1 s ago
	s := (*hubSink)(h)
	now := time.Now()
	begin := hubMsg{kind: msgBegin}
	for _, tt := range []struct {
		name   string
		ahead  time.Duration // this machine's clock less the server's
		age    time.Duration // of the commit, on the server's clock
		isLive bool
	}{
		{"clocks agree, just committed", 0, 100 * time.Millisecond, true},
		{"clocks agree, a catch-up", 0, 3 * time.Second, false},
		{"this clock 2 s ahead, just committed", 2 * time.Second, 100 * time.Millisecond, true},
		{"this clock 2 s behind, a catch-up", -2 * time.Second, 3 * time.Second, false},
	} {
		serverNow := now.Add(-tt.ahead)
		s.ServerClock(serverNow)
		h.txAt = serverNow.Add(-tt.age)
		if got := h.live(begin, time.Now()); got != tt.isLive {
			t.Errorf("%s: live = %v, want %v", tt.name, got, tt.isLive)
		}
	}
}
