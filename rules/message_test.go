package rules

import (
	"errors"
	"testing"
)

func TestEvalErrorMessage(t *testing.T) {
	p := mustCompile(t, Spec{Name: "b", Version: 1, Rules: []RuleSpec{
		{Name: "reject", On: "W", When: "data.amount <= 0", Op: "fail", Message: "'non-positive: ' + string(data.amount)"},
		{Name: "move", On: "W", Op: "update", Table: "t", Key: map[string]string{"k": "data.k"}, Inc: map[string]string{"n": "data.amount"}},
	}})
	tests := []struct {
		name string
		data map[string]any
		want string
	}{
		{name: "fail rule message as written", data: map[string]any{"k": "a", "amount": int64(0)}, want: "non-positive: 0"},
		{name: "evaluation error names the field", data: map[string]any{"amount": int64(5)}, want: "key.k: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.Eval(ev("W", tt.data))
			var ee *EvalError
			if !errors.As(err, &ee) {
				t.Fatalf("err = %v, want *EvalError", err)
			}
			got := ee.Message()
			if len(got) < len(tt.want) || got[:len(tt.want)] != tt.want {
				t.Fatalf("Message() = %q, want prefix %q", got, tt.want)
			}
		})
	}
}
