package lag

import (
	"math"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func TestWALClockTimeAt(t *testing.T) {
	var c WALClock
	if _, _, ok := c.TimeAt(10); ok {
		t.Fatal("empty clock answered")
	}
	c.Observe(1000, at(0))
	c.Observe(2000, at(10))
	c.Observe(2000, at(11)) // no WAL: ignored
	c.Observe(4000, at(20))
	c.Observe(5000, at(20)) // time did not move: ignored
	tests := []struct {
		name      string
		lsn       event.LSN
		want      time.Time
		exact, ok bool
	}{
		{name: "before the first sample", lsn: 500, want: at(0), ok: true},
		{name: "on a sample", lsn: 1000, want: at(0), exact: true, ok: true},
		{name: "interpolated", lsn: 1500, want: at(5), exact: true, ok: true},
		{name: "second segment", lsn: 3000, want: at(15), exact: true, ok: true},
		{name: "at the newest sample", lsn: 4000},
		{name: "beyond the newest sample", lsn: 9000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, exact, ok := c.TimeAt(tt.lsn)
			if ok != tt.ok || exact != tt.exact || !got.Equal(tt.want) {
				t.Fatalf("TimeAt(%d) = %v exact=%v ok=%v, want %v exact=%v ok=%v", tt.lsn, got, exact, ok, tt.want, tt.exact, tt.ok)
			}
		})
	}
	// A server whose WAL is behind (restored, another timeline) restarts
	// the history.
	c.Observe(100, at(30))
	if c.Len() != 1 {
		t.Fatalf("after a WAL rewind: %d samples, want 1", c.Len())
	}
}

func TestWALClockThinsButKeepsItsStart(t *testing.T) {
	var c WALClock
	for i := range 10 * walClockSize {
		c.Observe(event.LSN(1000*(i+1)), at(float64(i)))
	}
	if c.Len() > walClockSize {
		t.Fatalf("%d samples, want at most %d", c.Len(), walClockSize)
	}
	if since, _ := c.Since(); !since.Equal(at(0)) {
		t.Fatalf("clock starts at %v, want %v", since, at(0))
	}
	// Recent history stays at full resolution.
	last := 10*walClockSize - 1
	if got, exact, ok := c.TimeAt(event.LSN(1000 * last)); !ok || !exact || !got.Equal(at(float64(last-1))) {
		t.Fatalf("recent sample: %v %v %v", got, exact, ok)
	}
	// Old history is coarser but still interpolates between its samples.
	if got, _, ok := c.TimeAt(5500); !ok || got.Before(at(4)) || got.After(at(8)) {
		t.Fatalf("old lsn: %v %v", got, ok)
	}
}

// TestTailCounter plays a table where a transaction holds a low position
// while later ones commit: the floor must not pass it until it ends.
func TestTailCounter(t *testing.T) {
	var c tailCounter
	step := func(s tailSample, floor, cand int64, want int64) {
		t.Helper()
		f, k := c.query(s.at)
		if f != floor || k != cand {
			t.Fatalf("query = (%d, %d), want (%d, %d)", f, k, floor, cand)
		}
		s.floor, s.cand = f, k
		if got := c.total(s); got != want {
			t.Fatalf("total = %d, want %d", got, want)
		}
	}
	// Rows 1, 2, 3 and 5 committed; xid 10 holds position 4.
	step(tailSample{above: 4, maxPos: 5, xmin: 10, xmax: 12, at: at(0)}, math.MinInt64, math.MinInt64, 4)
	// The candidate (5) is armed with this snapshot's xmax.
	step(tailSample{above: 4, maxPos: 5, xmin: 10, xmax: 12, at: at(5)}, math.MinInt64, math.MinInt64, 4)
	// xid 10 still runs: no promotion.
	step(tailSample{above: 4, upToCand: 4, maxPos: 5, xmin: 10, xmax: 12, at: at(10)}, math.MinInt64, 5, 4)
	if _, ok := c.floorFor(at(100)); ok {
		t.Fatal("floor promoted while a transaction held a position below it")
	}
	// xid 10 commits position 4; row 6 arrives. Rows up to 5 are final.
	step(tailSample{above: 6, upToCand: 5, maxPos: 6, xmin: 13, xmax: 13, at: at(15)}, math.MinInt64, 5, 6)
	// Only the tail above 5 is counted now.
	step(tailSample{above: 1, maxPos: 6, xmin: 13, xmax: 14, at: at(20)}, 5, 5, 6)
	step(tailSample{above: 2, upToCand: 1, maxPos: 7, xmin: 14, xmax: 15, at: at(25)}, 5, 6, 7)
	if f, ok := c.floorFor(at(15)); !ok || f != 5 {
		t.Fatalf("floorFor(promotion time) = %d %v, want 5", f, ok)
	}
	if f, ok := c.floorFor(at(30)); !ok || f != 6 {
		t.Fatalf("floorFor(later) = %d %v, want 6", f, ok)
	}
	if _, ok := c.floorFor(at(14)); ok {
		t.Fatal("floor older than any promotion")
	}
	// An hour on, the whole table is counted again.
	f, _ := c.query(at(25 + recountEvery.Seconds()))
	if f != math.MinInt64 {
		t.Fatalf("recount: floor %d, want none", f)
	}
}

func TestCompute(t *testing.T) {
	clock := func() *WALClock {
		var c WALClock
		c.Observe(0x1000, at(0))
		c.Observe(0x2000, at(10))
		c.Observe(0x3000, at(20))
		return &c
	}
	now := at(30)
	db := func(mod func(*DBView)) DBView {
		d := DBView{Valid: true, WAL: 0x3000, SlotExists: true, Confirmed: 0x2800, Restart: 0x2000,
			Events: 100, Accounted: 100, Counted: true, StoredLSN: 0x2800, StoredTime: at(25), StoredPhase: "live"}
		if mod != nil {
			mod(&d)
		}
		return d
	}
	tests := []struct {
		name  string
		db    DBView
		local *Local
		want  Reading
	}{
		{
			name:  "idle and caught up",
			db:    db(nil),
			local: &Local{Watermark: 0x3000, WatermarkTime: at(25), Idle: true},
			want: Reading{LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, BacklogKnown: true,
				Watermark: 0x3000, WatermarkTime: at(25)},
		},
		{
			name:  "received, not applied",
			db:    db(func(d *DBView) { d.Events = 103 }),
			local: &Local{Watermark: 0x2800, WatermarkTime: at(20), Oldest: at(27.5)},
			want: Reading{LagSeconds: 2.5, LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 3,
				BacklogKnown: true, Watermark: 0x2800, WatermarkTime: at(20)},
		},
		{
			name: "not received, commit timestamp read",
			db: db(func(d *DBView) {
				d.Events, d.StoredLSN, d.OldestUnaccounted, d.OldestRead = 150, 0x1800, at(21), true
			}),
			local: &Local{Watermark: 0x1800, WatermarkTime: at(4), Idle: true},
			want: Reading{LagSeconds: 9, LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 50,
				BacklogKnown: true, Watermark: 0x1800, WatermarkTime: at(4)},
		},
		{
			name: "read no commit after the watermark: applied since the count",
			db: db(func(d *DBView) {
				d.Events, d.StoredLSN, d.OldestRead = 150, 0x1800, true
			}),
			local: &Local{Watermark: 0x1800, WatermarkTime: at(4), Idle: true},
			want: Reading{LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 50,
				BacklogKnown: true, Watermark: 0x1800, WatermarkTime: at(4)},
		},
		{
			name:  "not received, WAL clock",
			db:    db(func(d *DBView) { d.Events, d.StoredLSN = 150, 0 }),
			local: &Local{Watermark: 0x1800, WatermarkTime: at(4), Idle: true},
			want: Reading{LagSeconds: 25, LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 50,
				BacklogKnown: true, Watermark: 0x1800, WatermarkTime: at(4)},
		},
		{
			name: "standby reads the stored watermark",
			db: db(func(d *DBView) {
				d.Events, d.StoredLSN, d.LastCommit = 120, 0x2000, at(24)
			}),
			want: Reading{LagSeconds: 20, LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 20,
				BacklogKnown: true, Watermark: 0x2000, WatermarkTime: at(25), LastCommit: at(24)},
		},
		{
			name: "standby, caught up",
			db:   db(func(d *DBView) { d.LastCommit = at(24) }),
			want: Reading{LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, BacklogKnown: true,
				Watermark: 0x2800, WatermarkTime: at(25), LastCommit: at(24)},
		},
		{
			name: "backfill: at least since the consistent point",
			db: db(func(d *DBView) {
				d.Events, d.Accounted, d.StoredLSN, d.StoredTime, d.StoredPhase = 1000, 10, 0x1800, time.Time{}, "backfilling"
			}),
			local: &Local{Backfilling: true},
			want: Reading{LagSeconds: 25, LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 990,
				BacklogKnown: true, Watermark: 0x1800},
		},
		{
			name: "backfill seen from a standby that started later",
			db: db(func(d *DBView) {
				d.Events, d.Accounted, d.StoredLSN, d.StoredPhase = 1000, 10, 0x800, "backfilling"
			}),
			want: Reading{LagSeconds: 30, LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 990,
				BacklogKnown: true, Watermark: 0x800, WatermarkTime: at(25)},
		},
		{
			name:  "no slot",
			db:    db(func(d *DBView) { d.SlotExists = false }),
			local: &Local{Watermark: 0x3000, Idle: true},
			want:  Reading{SlotKnown: true, BacklogKnown: true, Watermark: 0x3000, WatermarkTime: at(25)},
		},
		{
			name:  "slot confirmed past the sampled WAL",
			db:    db(func(d *DBView) { d.Confirmed, d.Restart = 0x3100, 0x3100 }),
			local: &Local{Watermark: 0x3100, Idle: true},
			want:  Reading{SlotKnown: true, BacklogKnown: true, Watermark: 0x3100, WatermarkTime: at(25)},
		},
		{
			name:  "probe failed: the node's own state only",
			db:    DBView{},
			local: &Local{Watermark: 0x2800, Oldest: at(28)},
			want:  Reading{LagSeconds: 2, Watermark: 0x2800},
		},
		{
			name:  "server clock ahead of ours",
			db:    db(func(d *DBView) { d.Events, d.Skew = 101, 10*time.Second }),
			local: &Local{Watermark: 0x2800, Oldest: at(35)},
			want: Reading{LagSeconds: 5, LagBytes: 0x800, RetainedBytes: 0x1000, SlotKnown: true, Backlog: 1,
				BacklogKnown: true, Watermark: 0x2800, WatermarkTime: at(25)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := compute(now, tt.db, tt.local, clock())
			if math.Abs(got.LagSeconds-tt.want.LagSeconds) < 1e-6 {
				got.LagSeconds = tt.want.LagSeconds
			}
			if got != tt.want {
				t.Fatalf("compute:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
