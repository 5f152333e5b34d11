package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// A member alone at the group's scan (the others did not come within the
// gather window) is told to backfill on a slot of its own, before the
// scan touches the server; while the group's stream runs, nobody is
// seated.
func TestSharedScanNeedsTwoMembers(t *testing.T) {
	h := testHub(2)
	st := h.shareScan(spec("a"), nil)
	if st == nil {
		t.Fatal("no seat at a group whose stream is not running")
	}
	select {
	case s := <-st.start:
		if !errors.Is(s.err, errNotShared) {
			t.Fatalf("a lone member's scan: %v, want errNotShared", s.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lone member waited past the gather window")
	}
	h.scans.Wait()
	if h.scanning() != nil {
		t.Error("the ended scan is still the hub's")
	}
	h.startedAt(0)
	if h.shareScan(spec("b"), nil) != nil {
		t.Error("a seat at the scan while the group's stream runs")
	}
}

// The scan decodes each event once, as far as every member's rules read:
// the union of their keys, which each member's Eval then finds decoded.
func TestSharedScanDecodesForEveryMember(t *testing.T) {
	prog := func(name, field string) *rules.Program {
		p, err := rules.Compile(rules.Spec{Name: name, Version: 1, Rules: []rules.RuleSpec{
			{Name: "r", On: "A", Op: "upsert", Table: "t", Key: map[string]string{"id": "stream_id"}, Set: map[string]string{"v": "data." + field}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	d := decoder{seats: []*seat{{prog: prog("p", "a")}, {prog: prog("q", "b")}}, wants: map[string][2]event.Want{}}
	ev := &event.Event{Type: "A", StreamID: "s", RawData: []byte(`{"a": 1, "b": 2, "c": 3}`)}
	other := &event.Event{Type: "B", StreamID: "s", RawData: []byte(`{"a": 1}`)}
	bad := &event.Event{Type: "A", StreamID: "s", RawData: []byte(`{"a": `)}
	d.decode([]*event.Event{ev, other, bad})
	if _, ok := ev.Data["a"]; !ok {
		t.Errorf("data %v: a, which p reads, not decoded", ev.Data)
	}
	if _, ok := ev.Data["b"]; !ok {
		t.Errorf("data %v: b, which q reads, not decoded", ev.Data)
	}
	if _, ok := ev.Data["c"]; ok {
		t.Errorf("data %v: c, which no rule reads, decoded", ev.Data)
	}
	if other.Data != nil {
		t.Errorf("an event no member has a rule for was decoded: %v", other.Data)
	}
	if bad.Data != nil {
		t.Error("a document that does not decode has data: each member must fail on it as alone")
	}
}

// A member that stops taking the scan's pages while another waits for
// them is dropped from the scan once it held that one on a page for
// slow_member_timeout: the scan goes on for the others, and the dropped
// member's next page is errSlowSeat (its session backfills alone). A
// member that is merely slower than the others, taking a page now and
// then, is not dropped, and neither is one that holds nobody back.
func TestSharedScanDropsASlowMember(t *testing.T) {
	h := testHub(2)
	h.cfg.slowAfter = 400 * time.Millisecond
	newSeat := func(key string) *seat {
		return &seat{key: key, pages: make(chan page, 1), gone: make(chan struct{}), dropped: make(chan struct{}), start: make(chan scanStart, 1)}
	}
	fast, stuck := newSeat("fast"), newSeat("stuck")
	seats := []*seat{fast, stuck}
	taken := make(chan int, 100)
	go func() { // fast takes every page at once
		for n := 0; ; n++ {
			if _, more, err := fast.next(context.Background()); err != nil || !more {
				return
			}
			taken <- n
		}
	}()
	pg := page{evs: []*event.Event{{Type: "A"}}}
	began := time.Now()
	handed := make(chan error, 1)
	go func() {
		for i := 0; i < 5; i++ { // stuck takes none: the second page waits for it
			if err := h.handOut(context.Background(), seats, pg); err != nil {
				handed <- err
				return
			}
		}
		handed <- nil
	}()
	select {
	case err := <-handed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the scan still waits for the member that takes no page")
	}
	if el := time.Since(began); el < h.cfg.slowAfter || el > 5*time.Second {
		t.Errorf("five pages handed out in %s: the stuck member must hold the scan on one page for slow_member_timeout (%s), then be dropped", el, h.cfg.slowAfter)
	}
	select {
	case <-stuck.dropped:
	default:
		t.Fatal("the stuck member was not dropped")
	}
	for i := 0; i < 5; i++ {
		select {
		case <-taken:
		case <-time.After(5 * time.Second):
			t.Fatalf("the fast member took %d of 5 pages", i)
		}
	}
	<-stuck.pages // the page it had been handed before it stopped
	if _, _, err := stuck.next(context.Background()); !errors.Is(err, errSlowSeat) {
		t.Errorf("the dropped member's next page: %v, want errSlowSeat", err)
	}
	select {
	case <-fast.dropped:
		t.Error("the fast member was dropped")
	default:
	}

	// Both slow alike: neither waits for the scan while it waits for the
	// other, so nobody holds anybody back.
	a, b := newSeat("a"), newSeat("b")
	for i := 0; i < 3; i++ {
		done := make(chan error, 1)
		go func() { done <- h.handOut(context.Background(), []*seat{a, b}, pg) }()
		if i > 0 {
			time.Sleep(h.cfg.slowAfter) // the slow members take a page per window
			<-a.pages
			<-b.pages
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// One slower than the other, which waits for it: it takes a page
	// every half timeout, and holds the other back most of the time, but
	// never on one page for a whole timeout.
	quick, slower := newSeat("quick"), newSeat("slower")
	go func() {
		for {
			if _, more, err := quick.next(context.Background()); err != nil || !more {
				return
			}
		}
	}()
	done := make(chan error, 1)
	go func() {
		for i := 0; i < 6; i++ {
			if err := h.handOut(context.Background(), []*seat{quick, slower}, pg); err != nil {
				done <- err
				return
			}
		}
		done <- h.handOut(context.Background(), []*seat{quick, slower}, page{})
	}()
	for i := 0; i < 7; i++ {
		time.Sleep(h.cfg.slowAfter / 2) // its work on a page
		<-slower.pages
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for _, st := range []*seat{a, b, quick, slower} {
		select {
		case <-st.dropped:
			t.Errorf("member %s dropped, though it held nobody back on one page for slow_member_timeout", st.key)
		default:
		}
	}
}
