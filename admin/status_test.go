package admin

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/engine"
)

func TestDeriveState(t *testing.T) {
	tests := []struct {
		name                    string
		locked, haveWM, streams bool
		phase                   string
		want                    engine.State
	}{
		{name: "nobody holds the lock", haveWM: true, phase: "live", streams: true, want: engine.StateStopped},
		{name: "never run", want: engine.StateStopped},
		{name: "locked, no watermark yet", locked: true, want: engine.StateBackfilling},
		{name: "locked, backfilling", locked: true, haveWM: true, phase: "backfilling", want: engine.StateBackfilling},
		{name: "locked, live, streaming", locked: true, haveWM: true, phase: "live", streams: true, want: engine.StateLive},
		{name: "locked, live, slot idle", locked: true, haveWM: true, phase: "live", want: engine.StateStarting},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := deriveState(tt.locked, tt.haveWM, tt.phase, tt.streams); got != tt.want {
				t.Errorf("deriveState = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestLagSeconds(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		name    string
		state   engine.State
		backlog int64
		commit  time.Time
		want    *float64
	}{
		{name: "caught up", state: engine.StateLive, commit: now.Add(-time.Hour), want: ptr(0.0)},
		{name: "caught up without commit time", state: engine.StateStopped, want: ptr(0.0)},
		{name: "behind", state: engine.StateLive, backlog: 3, commit: now.Add(-90 * time.Second), want: ptr(90.0)},
		{name: "behind and stopped", state: engine.StateStopped, backlog: 3, commit: now.Add(-time.Minute), want: ptr(60.0)},
		{name: "behind, commit time unknown", state: engine.StateLive, backlog: 3},
		{name: "backfilling", state: engine.StateBackfilling, backlog: 10, commit: now.Add(-time.Minute)},
		{name: "clock skew never negative", state: engine.StateLive, backlog: 1, commit: now.Add(time.Second), want: ptr(0.0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := lagSeconds(tt.state, tt.backlog > 0, tt.commit, now)
			switch {
			case got == nil && tt.want == nil:
			case got == nil || tt.want == nil || *got != *tt.want:
				t.Errorf("lagSeconds = %v, want %v", deref(got), deref(tt.want))
			}
		})
	}
}

func TestPendingNow(t *testing.T) {
	tests := []struct {
		name                                  string
		backlog, watermark, countedHead, head int64
		want                                  bool
	}{
		{name: "counted caught up, nothing since", watermark: 100, countedHead: 100, head: 100},
		{name: "counted caught up, events since", watermark: 100, countedHead: 100, head: 105, want: true},
		{name: "counted caught up, events since applied", watermark: 105, countedHead: 100, head: 105},
		{name: "counted behind, still behind", backlog: 7, watermark: 90, countedHead: 100, head: 100, want: true},
		{name: "counted behind, caught up since", backlog: 7, watermark: 100, countedHead: 100, head: 100},
		{name: "counted behind, never saw an event since backfill", backlog: 7, countedHead: 100, head: 100, want: true},
		{name: "empty table", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pendingNow(tt.backlog, tt.watermark, tt.countedHead, tt.head); got != tt.want {
				t.Errorf("pendingNow = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBackfillProgress(t *testing.T) {
	start := time.Date(2025, 1, 2, 3, 0, 0, 0, time.UTC)
	tests := []struct {
		name                  string
		total, done           int64
		started, updated, now time.Time
		wantPct               float64
		wantETA               *float64
	}{
		{name: "no total yet", updated: start, now: start},
		{name: "a quarter in 10s, just stored", total: 400, done: 100, started: start,
			updated: start.Add(10 * time.Second), now: start.Add(10 * time.Second), wantPct: 25, wantETA: ptr(30.0)},
		{name: "ETA shrinks after the store", total: 400, done: 100, started: start,
			updated: start.Add(10 * time.Second), now: start.Add(15 * time.Second), wantPct: 25, wantETA: ptr(25.0)},
		{name: "ETA never negative", total: 400, done: 100, started: start,
			updated: start.Add(10 * time.Second), now: start.Add(time.Hour), wantPct: 25, wantETA: ptr(0.0)},
		{name: "start unknown", total: 400, done: 100, updated: start, now: start, wantPct: 25},
		{name: "counts from an earlier run", total: 400, done: 100, started: start.Add(time.Minute),
			updated: start, now: start.Add(time.Minute), wantPct: 25},
		{name: "done above total", total: 10, done: 12, started: start,
			updated: start.Add(2 * time.Second), now: start.Add(2 * time.Second), wantPct: 100, wantETA: ptr(0.0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := backfillProgress(tt.total, tt.done, tt.started, tt.updated, tt.now)
			if b.Total != tt.total || b.Done != tt.done || b.Percent != tt.wantPct {
				t.Errorf("got %d/%d %.1f%%, want %d/%d %.1f%%", b.Done, b.Total, b.Percent, tt.done, tt.total, tt.wantPct)
			}
			switch {
			case b.ETASeconds == nil && tt.wantETA == nil:
			case b.ETASeconds == nil || tt.wantETA == nil || *b.ETASeconds != *tt.wantETA:
				t.Errorf("ETA = %v, want %v", deref(b.ETASeconds), deref(tt.wantETA))
			}
		})
	}
}

func TestParseSlotName(t *testing.T) {
	type parsed struct {
		name string
		v    int64
		ok   bool
	}
	slots := map[string]parsed{
		"pgscribe_balances_v1":     {"balances", 1, true},
		"pgscribe_my_v2_thing_v12": {"my_v2_thing", 12, true},
		// Not ours: each parses to the zero result.
		"pgscribe_balances_v0":  {},
		"pgscribe_balances_v01": {},
		"pgscribe_balances_vx":  {},
		"pgscribe_balances":     {},
		"pgscribe__v1":          {},
		"other_balances_v1":     {},
		"pgscribex_balances_v1": {},
	}
	for slot, want := range slots {
		var got parsed
		got.name, got.v, got.ok = parseSlotName("pgscribe", slot)
		if got != want {
			t.Errorf("parseSlotName(%q) = %+v, want %+v", slot, got, want)
		}
	}
}

func TestFormatBytesAndSeconds(t *testing.T) {
	bytesCases := map[int64]string{0: "0 B", 1023: "1023 B", 1024: "1.0 KiB", 1536: "1.5 KiB", 5 << 20: "5.0 MiB", 3 << 30: "3.0 GiB"}
	for in, want := range bytesCases {
		if got := formatBytes(in); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", in, got, want)
		}
	}
	secCases := map[float64]string{0: "0s", 1.25: "1.3s", 75: "1m15s", 7380: "2h3m"}
	for in, want := range secCases {
		if got := formatSeconds(in); got != want {
			t.Errorf("formatSeconds(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestStatusReportOutput(t *testing.T) {
	commit := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	rep := &StatusReport{CheckedAt: commit.Add(time.Minute), SourceWAL: "0/3000000", Events: 10,
		Projections: []ProjectionStatus{
			{Projection: "balances", Version: 1, State: engine.StateLive, Node: "n1", LockPID: 42,
				Slot:       SlotStatus{Name: "pgscribe_balances_v1", Exists: true, ActivePID: 43},
				Watermark:  &WatermarkStatus{Phase: "live", LSN: "0/2000000", Position: 10, CommitTime: &commit},
				LagSeconds: ptr(0.0), LagBytes: ptr(int64(2048)), WALRetainedBytes: ptr(int64(1 << 20)), DeadLetters: 2},
			{Projection: "audit", Version: 2, State: engine.StateBackfilling, Slot: SlotStatus{Name: "pgscribe_audit_v2"},
				BacklogEvents: 6, Backfill: &BackfillStatus{Total: 10, Done: 4, Percent: 40, ETASeconds: ptr(12.0)},
				Notes: []string{"a note"}},
		},
		Unconfigured:        []UnconfiguredSlot{{Slot: "pgscribe_balances_v7", Projection: "balances", Version: 7, WALRetainedBytes: ptr(int64(4096))}},
		UnconfiguredMembers: []UnconfiguredMember{{Projection: "stats", Version: 3, Slot: "pgscribe_group_default", LSN: "0/1800000"}}}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"balances v1", "live", "n1", "0/2000000", "2.0 KiB", "1.0 MiB",
		"audit v2", "backfilling", "40.0% (4/10) eta 12s", "audit v2: a note", "events: 10",
		`slot "pgscribe_balances_v7" of balances v7, which is not configured, retains 4.0 KiB of WAL: pgscribe reset -projection balances -version 7 drops it`,
		`stats v3, which is not configured, is recorded on group slot "pgscribe_group_default" at 0/1800000 and holds its WAL back there: pgscribe retire -projection stats -version 3 (or reset) releases it`} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text output lacks %q:\n%s", want, text.String())
		}
	}

	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back struct {
		Projections []map[string]any `json:"projections"`
	}
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON output does not parse: %v\n%s", err, js.String())
	}
	if len(back.Projections) != 2 {
		t.Fatalf("got %d projections in JSON", len(back.Projections))
	}
	a := back.Projections[1]
	if a["state"] != "backfilling" || a["watermark"] != nil || a["lag_seconds"] != nil {
		t.Errorf("backfilling projection in JSON: %v", a)
	}
	if bf, _ := a["backfill"].(map[string]any); bf["percent"] != 40.0 || bf["eta_seconds"] != 12.0 {
		t.Errorf("backfill in JSON: %v", a["backfill"])
	}
}

func ptr[T any](v T) *T { return &v }

func deref(p *float64) any {
	if p == nil {
		return nil
	}
	return *p
}
