package admin

import (
	"testing"

	"github.com/pgscribe/pgscribe/rules"
)

func TestProblemString(t *testing.T) {
	tests := []struct {
		p    Problem
		want string
	}{
		{Problem{Scope: `balances v1 rule "move"`, Object: `table "balances" column "balance"`, Msg: "type text cannot take inc"},
			`balances v1 rule "move": table "balances" column "balance": type text cannot take inc`},
		{Problem{Scope: "source", Msg: `wal_level is "replica"`}, `source: wal_level is "replica"`},
	}
	for _, tt := range tests {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("got  %s\nwant %s", got, tt.want)
		}
	}
}

// TestRuleNameMatchesCompile keeps ruleName in step with the names
// rules.Compile gives (visible through Program.Targets).
func TestRuleNameMatchesCompile(t *testing.T) {
	spec := rules.Spec{Name: "p", Version: 1, Rules: []rules.RuleSpec{
		{Name: "named", On: "A", Op: "delete", Table: "t", Key: map[string]string{"id": "id"}},
		{On: "B", Op: "delete", Table: "t", Key: map[string]string{"id": "id"}},
		{On: []any{"C", "D"}, Op: "delete", Table: "t", Key: map[string]string{"id": "id"}},
		{Op: "delete", Table: "t", Key: map[string]string{"id": "id"}},
	}}
	prog, err := rules.Compile(spec)
	if err != nil {
		t.Fatal(err)
	}
	targets := prog.Targets()
	if len(targets) != len(spec.Rules) {
		t.Fatalf("got %d targets", len(targets))
	}
	for i, rs := range spec.Rules {
		if got, want := ruleName(i, rs), targets[i].Rule; got != want {
			t.Errorf("rule %d: ruleName = %q, Compile names it %q", i, got, want)
		}
	}
}
