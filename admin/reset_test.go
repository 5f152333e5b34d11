package admin

import (
	"strings"
	"testing"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
)

func TestResetPlanText(t *testing.T) {
	full := resetPlan{name: "balances", version: 1, configured: true, slot: "pgscribe_balances_v1",
		slotExists: true, slotPID: 77, retained: ptr(int64(3 << 20)),
		cursors:   cursor.Totals{Streams: 4, Applied: 10, Skipped: 2, DeadLettered: 1},
		watermark: &cursor.Watermark{Phase: "live", LSN: event.LSN(0x1_0000_00A0)}, dead: 1}
	tests := []struct {
		name        string
		plan        resetPlan
		done, dlOpt bool
		want, not   []string
	}{
		{name: "dry run", plan: full,
			want: []string{"reset would change balances v1:", `drop replication slot "pgscribe_balances_v1" (it retained 3.0 MiB of WAL), terminating its walsender (pid 77)`,
				"delete 4 stream cursors (13 events accounted for: 10 applied, 2 skipped, 1 dead-lettered)",
				"delete the watermark (phase live, lsn 1/A0)", "keep 1 dead letters", "-dead-letters deletes them",
				"read-model tables are never touched", "truncate them"},
			not: []string{"note:"}},
		{name: "done with dead letters", plan: full, done: true, dlOpt: true,
			want: []string{"reset balances v1:", "dropped replication slot", "deleted 4 stream cursors", "deleted the watermark",
				"deleted 1 dead letters", "read-model tables are never touched"},
			not: []string{"keep", "would"}},
		{name: "unconfigured, slot only", plan: resetPlan{name: "old", version: 3, slot: "s", slotExists: true},
			want: []string{"note: old v3 is not in the configuration", `drop replication slot "s"`, "delete 0 stream cursors", "no dead letters"},
			not:  []string{"watermark"}},
		{name: "nothing", plan: resetPlan{name: "p", version: 1, configured: true, slot: "s", dead: 2},
			want: []string{"p v1 has no slot, cursors or watermark: nothing to reset", "it has 2 dead letters"},
			not:  []string{"drop", "read-model"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.plan.text(tt.done, tt.dlOpt)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("lacks %q:\n%s", w, got)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(got, n) {
					t.Errorf("has %q:\n%s", n, got)
				}
			}
		})
	}
}

func TestResetPlanEmpty(t *testing.T) {
	dead := resetPlan{dead: 3}
	if !dead.empty(false) || dead.empty(true) {
		t.Errorf("dead letters alone: empty(false)=%v empty(true)=%v, want true, false", dead.empty(false), dead.empty(true))
	}
	for name, p := range map[string]resetPlan{
		"slot":      {slotExists: true},
		"cursors":   {cursors: cursor.Totals{Streams: 1}},
		"watermark": {watermark: &cursor.Watermark{}},
	} {
		if p.empty(false) {
			t.Errorf("%s: empty", name)
		}
	}
}
