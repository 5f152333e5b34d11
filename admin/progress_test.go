package admin

import (
	"bytes"
	"testing"

	"github.com/pgscribe/pgscribe/engine"
)

func TestProgressBar(t *testing.T) {
	bar := func(percent float64, width int, want string) {
		t.Helper()
		if got := progressBar(percent, width); got != want {
			t.Errorf("progressBar(%v, %d) = %q, want %q", percent, width, got, want)
		}
	}
	bar(0, 10, "[----------]")
	bar(50, 10, "[#####-----]")
	bar(100, 4, "[####]")
	bar(140, 4, "[####]") // clamped above
	bar(-3, 4, "[----]")  // clamped below
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
