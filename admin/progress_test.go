package admin

import (
	"bytes"
	"testing"

	"github.com/pgscribe/pgscribe/engine"
)

func TestProgressBar(t *testing.T) {
	tests := []struct {
		name    string
		percent float64
		width   int
		want    string
	}{
		{name: "empty", percent: 0, width: 10, want: "[----------]"},
		{name: "half", percent: 50, width: 10, want: "[#####-----]"},
		{name: "full", percent: 100, width: 4, want: "[####]"},
		{name: "clamped above", percent: 140, width: 4, want: "[####]"},
		{name: "clamped below", percent: -3, width: 4, want: "[----]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := progressBar(tt.percent, tt.width); got != tt.want {
				t.Fatalf("progressBar(%v, %d) = %q, want %q", tt.percent, tt.width, got, tt.want)
			}
		})
	}
}

func TestWriteProgressOnlyBackfilling(t *testing.T) {
	eta := 12.0
	r := &StatusReport{Projections: []ProjectionStatus{
		{Projection: "balances", Version: 1, State: engine.StateBackfilling, Backfill: &BackfillStatus{Total: 200, Done: 50, Percent: 25, ETASeconds: &eta}},
		{Projection: "activity", Version: 1, State: engine.StateLive, Backfill: &BackfillStatus{Total: 200, Done: 200, Percent: 100}},
	}}
	var b bytes.Buffer
	if err := r.WriteProgress(&b, 8); err != nil {
		t.Fatal(err)
	}
	if want := "balances v1 [##------] 25.0% (50/200) eta 12s\n"; b.String() != want {
		t.Fatalf("got %q, want %q", b.String(), want)
	}
}
