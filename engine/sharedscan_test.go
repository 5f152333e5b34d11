package engine

import (
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
