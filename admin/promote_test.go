package admin

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/engine"
	"github.com/pgscribe/pgscribe/rules"
)

func TestPromoteProblems(t *testing.T) {
	lag := func(s float64) *float64 { return &s }
	tests := []struct {
		name string
		ps   ProjectionStatus
		want []string // substrings, one per problem
	}{
		{"live and caught up", ProjectionStatus{State: engine.StateLive, LagSeconds: lag(0.5)}, nil},
		{"lags", ProjectionStatus{State: engine.StateLive, LagSeconds: lag(11)}, []string{"lag 11s is above 10s"}},
		{"backfilling", ProjectionStatus{State: engine.StateBackfilling}, []string{"backfilling, not live", "lag is unknown"}},
		{"halted", ProjectionStatus{State: engine.StateHalted, HaltReason: "42P01", LagSeconds: lag(0)}, []string{"halted (42P01)"}},
		{"stopped", ProjectionStatus{State: engine.StateStopped, LagSeconds: lag(0)}, []string{"stopped, not live"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := promoteProblems(tt.ps, 10*time.Second)
			if len(got) != len(tt.want) {
				t.Fatalf("problems = %q, want %d", got, len(tt.want))
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %q does not say %q", got[i], w)
				}
			}
		})
	}
}

func TestServedTables(t *testing.T) {
	spec := rules.Spec{Schema: "b_v2", Rules: []rules.RuleSpec{
		{Table: "balances"}, {Table: "activity"}, {Table: "balances"}, {Table: "audit.log"}, {Op: "sql"},
	}}
	served, outside := servedTables(spec)
	if !slices.Equal(served, []string{"activity", "balances"}) || !slices.Equal(outside, []string{"audit.log"}) {
		t.Errorf("served %v, outside %v", served, outside)
	}
}

func TestStatusTextShowsServed(t *testing.T) {
	r := &StatusReport{
		Projections: []ProjectionStatus{
			{Projection: "balances", Version: 1, State: engine.StateLive},
			{Projection: "balances", Version: 2, State: engine.StateLive, Served: true},
		},
		Served: []Served{{Projection: "balances", Version: 2, ServeSchema: "public", PromotedAt: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}},
	}
	var b bytes.Buffer
	if err := r.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"balances v2 (served)", "served: balances v2 in schema public (promoted 2026-01-02T03:04:05Z)"} {
		if !strings.Contains(out, want) {
			t.Errorf("status text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "balances v1 (served)") {
		t.Errorf("v1 shown as served:\n%s", out)
	}
}
