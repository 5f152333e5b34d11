package engine

import (
	"math"
	"testing"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/replication"
)

// The backfill point moves over a page only once the ledger has passed the
// page's last event, and keeps what it had otherwise: a point past an
// unaccounted event would skip it on resume.
func TestPageMarksAccounted(t *testing.T) {
	start := cursor.BackfillPoint{LSN: 7, UpTo: 100, After: math.MinInt64, Total: 60}
	m := pageMarks{at: start}
	if got := m.accounted(0); got != start {
		t.Fatalf("before any page: %+v, want %+v", got, start)
	}
	m.read(10, 10) // positions 1..10
	m.read(30, 25) // a page whose events committed after the snapshot were left out
	m.read(50, 40)
	for _, tt := range []struct {
		ledger      int64 // the ledger's position (accounted prefix)
		after, done int64
	}{
		{0, math.MinInt64, 0},
		{9, math.MinInt64, 0}, // the first page is not whole
		{10, 10, 10},
		{29, 10, 10},
		{30, 30, 25},
		{50, 50, 40},
		{60, 50, 40}, // past every page read: stays at the last page's end
	} {
		got := m.accounted(tt.ledger)
		if got.After != tt.after || got.Done != tt.done || got.LSN != 7 || got.UpTo != 100 || got.Total != 60 {
			t.Errorf("ledger at %d: point %+v, want after %d, done %d of the same snapshot", tt.ledger, got, tt.after, tt.done)
		}
	}
	m.read(70, 55)
	if got := m.accounted(69); got.After != 50 {
		t.Errorf("a later page not yet accounted for moved the point to %d", got.After)
	}
}

// The group's scan resumes only when every member it seats recorded a
// point of the same snapshot at the slot's confirmed position, from the
// lowest of them.
func TestResumePoint(t *testing.T) {
	slot := replication.SlotInfo{Exists: true, Confirmed: event.LSN(500)}
	pt := func(after, done int64) *cursor.BackfillPoint {
		return &cursor.BackfillPoint{LSN: 500, UpTo: 900, After: after, Done: done, Total: 800}
	}
	seats := []*seat{{key: "a/1"}, {key: "b/1"}}
	rec := map[string]recordedWM{
		"a/1": {phase: "backfilling", point: pt(300, 250)},
		"b/1": {phase: "backfilling", point: pt(200, 180)},
	}
	from, ok := resumePoint(rec, seats, slot)
	if !ok || from.After != 200 || from.Done != 180 || from.LSN != 500 || from.UpTo != 900 || from.Total != 800 {
		t.Fatalf("resumePoint = %+v, %v; want the lower point (after 200, done 180) of the snapshot", from, ok)
	}
	for name, c := range map[string]struct {
		rec  map[string]recordedWM
		slot replication.SlotInfo
	}{
		"a member without a point":          {map[string]recordedWM{"a/1": rec["a/1"], "b/1": {phase: "backfilling"}}, slot},
		"a member not recorded":             {map[string]recordedWM{"a/1": rec["a/1"]}, slot},
		"the slot confirmed past the point": {rec, replication.SlotInfo{Exists: true, Confirmed: 600}},
		"the slot gone":                     {rec, replication.SlotInfo{}},
		"another snapshot": {map[string]recordedWM{"a/1": rec["a/1"],
			"b/1": {phase: "backfilling", point: &cursor.BackfillPoint{LSN: 500, UpTo: 950, After: 10, Total: 810}}}, slot},
	} {
		if from, ok := resumePoint(c.rec, seats, c.slot); ok {
			t.Errorf("%s: resumes from %+v, want a new snapshot", name, from)
		}
	}
}
