package cursor

import (
	"slices"
	"strings"
	"testing"
)

func TestCursorMerge(t *testing.T) {
	tests := []struct {
		name string
		in   []Advance
		want []Advance
	}{
		{"empty", nil, []Advance{}},
		{"distinct streams keep order",
			[]Advance{{StreamID: "b", StreamPosition: 1, Position: 9, Applied: 1}, {StreamID: "a", StreamPosition: 3, Position: 4, Skipped: 1}},
			[]Advance{{StreamID: "b", StreamPosition: 1, Position: 9, Applied: 1}, {StreamID: "a", StreamPosition: 3, Position: 4, Skipped: 1}}},
		{"same stream: counts add, highest position wins",
			[]Advance{
				{StreamID: "a", StreamPosition: 2, Position: 20, Applied: 2},
				{StreamID: "b", StreamPosition: 1, Position: 5, DeadLettered: 1},
				{StreamID: "a", StreamPosition: 4, Position: 41, Skipped: 1, DeadLettered: 1},
				{StreamID: "a", StreamPosition: 3, Position: 30, Applied: 1},
			},
			[]Advance{
				{StreamID: "a", StreamPosition: 4, Position: 41, Applied: 3, Skipped: 1, DeadLettered: 1},
				{StreamID: "b", StreamPosition: 1, Position: 5, DeadLettered: 1},
			}},
		{"parked: counts add, the first park stays",
			[]Advance{
				{StreamID: "a", StreamPosition: 2, Position: 2, DeadLettered: 1, Parks: true, ParkedSince: 2},
				{StreamID: "a", StreamPosition: 3, Position: 3, Parked: 1, Parks: true, ParkedSince: 3},
				{StreamID: "a", StreamPosition: 4, Position: 4, Parked: 1},
			},
			[]Advance{{StreamID: "a", StreamPosition: 4, Position: 4, DeadLettered: 1, Parked: 2, Parks: true, ParkedSince: 2}}},
		{"parked at position 0 (a stream from 0): the park stays",
			[]Advance{
				{StreamID: "a", StreamPosition: 0, Position: 1, DeadLettered: 1, Parks: true, ParkedSince: 0},
				{StreamID: "a", StreamPosition: 1, Position: 2, Parked: 1, Parks: true, ParkedSince: 1},
			},
			[]Advance{{StreamID: "a", StreamPosition: 1, Position: 2, DeadLettered: 1, Parked: 1, Parks: true, ParkedSince: 0}}},
		{"tie: later entry wins",
			[]Advance{{StreamID: "a", StreamPosition: 2, Position: 1}, {StreamID: "a", StreamPosition: 2, Position: 7}},
			[]Advance{{StreamID: "a", StreamPosition: 2, Position: 7}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := merge(tt.in); !slices.Equal(got, tt.want) {
				t.Errorf("merge() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestCursorCheckPhase(t *testing.T) {
	tests := map[string]struct {
		phase            string
		emptyOK, wantErr bool
	}{
		"backfilling":   {PhaseBackfilling, false, false},
		"live":          {PhaseLive, false, false},
		"empty allowed": {"", true, false},
		"empty refused": {"", false, true},
		"typo":          {"Live", true, true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			if err := checkPhase(tt.phase, tt.emptyOK); (err != nil) != tt.wantErr {
				t.Errorf("checkPhase(%q, %v) error = %v, wantErr %v", tt.phase, tt.emptyOK, err, tt.wantErr)
			}
		})
	}
}

func TestCursorStoreQuotesSchema(t *testing.T) {
	s := New(`Pg "Scribe`, "p", 1)
	for _, sql := range []string{s.loadSQL, s.advanceSQL, s.loadWatermarkSQL, s.saveWatermarkSQL,
		s.setPhaseSQL, s.totalsSQL, s.hasSQL, s.resetSQL, s.loadPointSQL, s.savePointSQL} {
		if !strings.Contains(sql, `"Pg ""Scribe".`) {
			t.Errorf("schema not quoted in %q", sql)
		}
	}
}
