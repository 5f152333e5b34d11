package rules

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/expr-lang/expr/file"

	"github.com/pgscribe/pgscribe/event"
)

// balances is an example projection, close to config.toml.example's
// balances (its fail rule checks withdrawals only).
func balances() Spec {
	return Spec{
		Name:    "balances",
		Version: 1,
		OnError: "dead_letter",
		Rules: []RuleSpec{
			{
				Name: "open", On: "AccountOpened", When: "data.initial >= 0",
				Op: "upsert", Table: "balances",
				Key: map[string]string{"account_id": "data.account_id"},
				Set: map[string]string{"owner": "data.owner", "balance": "data.initial"},
			},
			{
				On: []any{"Deposited", "Withdrawn"}, Op: "update", Table: "balances",
				Key: map[string]string{"account_id": "data.account_id"},
				Inc: map[string]string{"balance": "type == 'Deposited' ? data.amount : -data.amount"},
			},
			{
				On: "Withdrawn", When: "data.amount <= 0", Op: "fail",
				Message: "'non-positive withdrawal: ' + string(data.amount)",
			},
		},
	}
}

// compileErrors returns the *CompileErrors joined in err.
func compileErrors(t *testing.T, err error) []*CompileError {
	t.Helper()
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else if err != nil {
		errs = []error{err}
	}
	var ces []*CompileError
	for _, e := range errs {
		var ce *CompileError
		if !errors.As(e, &ce) {
			t.Fatalf("error %v (%T) is not a *CompileError", e, e)
		}
		ces = append(ces, ce)
	}
	return ces
}

func mustCompile(t testing.TB, spec Spec) *Program {
	t.Helper()
	p, err := Compile(spec)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return p
}

func TestCompileErrors(t *testing.T) {
	// one builds a single-rule spec.
	one := func(r RuleSpec) Spec { return Spec{Name: "p", Version: 2, Rules: []RuleSpec{r}} }
	upsert := func(mod func(*RuleSpec)) Spec {
		r := RuleSpec{Name: "r", Op: "upsert", Table: "t",
			Key: map[string]string{"id": "data.id"}, Set: map[string]string{"v": "data.v"}}
		mod(&r)
		return one(r)
	}
	tests := []struct {
		name string
		spec Spec
		want []CompileError // Projection/Version/Rule/Field/Line/Column compared; Err by errors.Is when set
	}{
		{
			name: "unknown name names column",
			spec: upsert(func(r *RuleSpec) { r.Set = map[string]string{"balance": "data.x + foo"} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "set.balance", Expr: "data.x + foo", Line: 1, Column: 10}},
		},
		{
			name: "syntax error in key",
			spec: upsert(func(r *RuleSpec) { r.Key = map[string]string{"id": "data.id +"} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "key.id", Expr: "data.id +", Line: 1, Column: 9}},
		},
		{
			name: "second line of an expression",
			spec: upsert(func(r *RuleSpec) { r.Set = map[string]string{"v": "data.a +\n  bar"} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "set.v", Expr: "data.a +\n  bar", Line: 2, Column: 3}},
		},
		{
			name: "now is disabled",
			spec: upsert(func(r *RuleSpec) { r.Set = map[string]string{"v": "now()"} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "set.v", Expr: "now()", Line: 1, Column: 1}},
		},
		{
			name: "when statically not boolean",
			spec: upsert(func(r *RuleSpec) { r.When = "1 + 2" }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "when", Expr: "1 + 2", Line: 1, Column: 1, Err: ErrWrongType}},
		},
		{
			name: "inc statically a string",
			spec: upsert(func(r *RuleSpec) { r.Inc = map[string]string{"n": "'a'"} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "inc.n", Expr: "'a'", Line: 1, Column: 1, Err: ErrWrongType}},
		},
		{
			name: "set statically a function",
			spec: upsert(func(r *RuleSpec) { r.Set = map[string]string{"v": "occurred_at.Add"} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "set.v", Expr: "occurred_at.Add", Line: 1, Column: 1, Err: ErrWrongType}},
		},
		{
			name: "message statically not a string",
			spec: one(RuleSpec{Name: "f", Op: "fail", Message: "data.amount > 0"}),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "f", Field: "message", Expr: "data.amount > 0", Line: 1, Column: 1, Err: ErrWrongType}},
		},
		{
			name: "args error is numbered like its placeholder",
			spec: one(RuleSpec{Name: "s", Op: "sql", SQL: "select $1, $2", Args: []string{"id", "nope"}}),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "s", Field: "args[2]", Expr: "nope", Line: 1, Column: 1}},
		},
		{
			name: "unknown op",
			spec: upsert(func(r *RuleSpec) { r.Op = "merge" }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "op"}},
		},
		{
			name: "missing table and key",
			spec: one(RuleSpec{Name: "r", Op: "update", Set: map[string]string{"v": "1"}}),
			want: []CompileError{
				{Projection: "p", Version: 2, Rule: "r", Field: "table"},
				{Projection: "p", Version: 2, Rule: "r", Field: "key"},
			},
		},
		{
			name: "fail without message",
			spec: one(RuleSpec{Name: "f", Op: "fail"}),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "f", Field: "message"}},
		},
		{
			name: "insert without any column",
			spec: one(RuleSpec{Name: "r", Op: "insert", Table: "t"}),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "key"}},
		},
		{
			name: "if_missing on insert",
			spec: one(RuleSpec{Name: "r", Op: "insert", Table: "t", Key: map[string]string{"id": "id"}, IfMissing: "ignore"}),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "if_missing"}},
		},
		{
			name: "if_missing unknown",
			spec: one(RuleSpec{Name: "r", Op: "delete", Table: "t", Key: map[string]string{"id": "id"}, IfMissing: "halt"}),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "if_missing"}},
		},
		{
			name: "update without set or inc",
			spec: one(RuleSpec{Name: "r", Op: "update", Table: "t", Key: map[string]string{"id": "id"}}),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "set"}},
		},
		{
			name: "delete with set",
			spec: upsert(func(r *RuleSpec) { r.Op = "delete" }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "set"}},
		},
		{
			name: "sql without sql, with table",
			spec: one(RuleSpec{Name: "s", Op: "sql", Table: "t"}),
			want: []CompileError{
				{Projection: "p", Version: 2, Rule: "s", Field: "table"},
				{Projection: "p", Version: 2, Rule: "s", Field: "sql"},
			},
		},
		{
			name: "args and message on a data rule",
			spec: upsert(func(r *RuleSpec) { r.Args = []string{"id"}; r.Message = "'x'" }),
			want: []CompileError{
				{Projection: "p", Version: 2, Rule: "r", Field: "args"},
				{Projection: "p", Version: 2, Rule: "r", Field: "message"},
			},
		},
		{
			name: "column in both key and set",
			spec: upsert(func(r *RuleSpec) { r.Set = map[string]string{"id": "data.id"} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "set.id"}},
		},
		{
			name: "on of the wrong type",
			spec: upsert(func(r *RuleSpec) { r.On = int64(3) }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "on"}},
		},
		{
			name: "on list with a non-string",
			spec: upsert(func(r *RuleSpec) { r.On = []any{"A", 1} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "on"}},
		},
		{
			name: "empty on list",
			spec: upsert(func(r *RuleSpec) { r.On = []any{} }),
			want: []CompileError{{Projection: "p", Version: 2, Rule: "r", Field: "on"}},
		},
		{
			name: "duplicate rule names, one defaulted",
			spec: Spec{Name: "p", Version: 2, Rules: []RuleSpec{
				{On: "A", Op: "fail", Message: "'a'"},
				{Name: "A#1", On: "B", Op: "fail", Message: "'b'"},
			}},
			want: []CompileError{{Projection: "p", Version: 2, Rule: "A#1", Field: "name"}},
		},
		{
			name: "projection-level errors",
			spec: Spec{Version: -1, OnError: "ignore"},
			want: []CompileError{
				{Field: "name", Version: -1},
				{Field: "version", Version: -1},
				{Field: "on_error", Version: -1},
				{Field: "rule", Version: -1},
			},
		},
		{
			name: "every error of the spec is reported",
			spec: Spec{Name: "balances", Version: 1, Rules: []RuleSpec{
				{Name: "open", On: "AccountOpened", Op: "insert", Table: "balances",
					Set: map[string]string{"balance": "data.initial + foo", "owner": "owner"}},
				{On: "Closed", When: "'yes'", Op: "delete", Table: "balances", Key: map[string]string{"id": "data.id"}},
			}},
			want: []CompileError{
				{Projection: "balances", Version: 1, Rule: "open", Field: "set.balance", Expr: "data.initial + foo", Line: 1, Column: 16},
				{Projection: "balances", Version: 1, Rule: "open", Field: "set.owner", Expr: "owner", Line: 1, Column: 1},
				{Projection: "balances", Version: 1, Rule: "Closed#2", Field: "when", Expr: "'yes'", Line: 1, Column: 1, Err: ErrWrongType},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := Compile(tt.spec)
			if err == nil {
				t.Fatalf("Compile succeeded, want %d errors", len(tt.want))
			}
			if p != nil {
				t.Errorf("Compile returned a program with an error")
			}
			got := compileErrors(t, err)
			if len(got) != len(tt.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(got), len(tt.want), err)
			}
			for i, w := range tt.want {
				g := *got[i]
				if w.Err != nil && !errors.Is(g.Err, w.Err) {
					t.Errorf("error %d: cause %v, want %v", i, g.Err, w.Err)
				}
				if g.Err == nil {
					t.Errorf("error %d: no cause", i)
				}
				g.Err, w.Err = nil, nil
				if g != w {
					t.Errorf("error %d:\n got %+v\nwant %+v", i, g, w)
				}
			}
		})
	}
}

func TestCompileErrorCarriesExprError(t *testing.T) {
	_, err := Compile(Spec{Name: "balances", Version: 1, Rules: []RuleSpec{{
		Name: "open", Op: "insert", Table: "balances", Set: map[string]string{"balance": "1 +  foo"},
	}}})
	var fe *file.Error
	if !errors.As(err, &fe) {
		t.Fatalf("error %v does not wrap *file.Error", err)
	}
	// The message is for people; check it names everything once.
	msg := err.Error()
	for _, want := range []string{`projection "balances" v1`, `rule "open"`, "set.balance", "column 6", "unknown name foo", `"1 +  foo"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}

func TestCompileValid(t *testing.T) {
	tests := []struct {
		name        string
		spec        Spec
		wantOnError string
		wantTargets []Target
	}{
		{
			name:        "design example, default names",
			spec:        balances(),
			wantOnError: OnErrorDeadLetter,
			wantTargets: []Target{
				{Rule: "open", Op: event.OpUpsert, Table: "balances", KeyColumns: []string{"account_id"}, SetColumns: []string{"balance", "owner"}},
				{Rule: "Deposited#2", Op: event.OpUpdate, Table: "balances", KeyColumns: []string{"account_id"}, IncColumns: []string{"balance"}},
			},
		},
		{
			name: "on absent, []string on, halt, sql and fail rules have no target",
			spec: Spec{Name: "p", Version: 3, OnError: "halt", Rules: []RuleSpec{
				{Op: "insert", Table: "audit", Set: map[string]string{"id": "id", "at": "occurred_at", "b": "data"}},
				{On: []string{"X", "Y"}, Op: "delete", Table: "s.t", Key: map[string]string{"id": "data.id"}},
				{On: "Z", Op: "sql", SQL: "select $1", Args: []string{"id"}},
				{On: "Z", When: "data.bad ?? false", Op: "fail", Message: "'bad'"},
			}},
			wantOnError: OnErrorHalt,
			wantTargets: []Target{
				{Rule: "*#1", Op: event.OpInsert, Table: "audit", SetColumns: []string{"at", "b", "id"}},
				{Rule: "X#2", Op: event.OpDelete, Table: "s.t", KeyColumns: []string{"id"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, tt.spec)
			if p.Name() != tt.spec.Name || p.Version() != tt.spec.Version {
				t.Errorf("identity %s v%d, want %s v%d", p.Name(), p.Version(), tt.spec.Name, tt.spec.Version)
			}
			if p.OnError() != tt.wantOnError {
				t.Errorf("OnError %q, want %q", p.OnError(), tt.wantOnError)
			}
			if got := p.Targets(); !reflect.DeepEqual(got, tt.wantTargets) {
				t.Errorf("Targets:\n got %+v\nwant %+v", got, tt.wantTargets)
			}
		})
	}
}

// TestKeyOnlyWrites: insert and upsert with only a key compile, and their
// intents carry only the key; if_missing = "dead_letter" reaches the intent.
func TestKeyOnlyWrites(t *testing.T) {
	p := mustCompile(t, Spec{Name: "p", Version: 1, Rules: []RuleSpec{
		{Name: "ins", Op: "insert", Table: "members", Key: map[string]string{"id": "stream_id"}},
		{Name: "ups", Op: "upsert", Table: "members", Key: map[string]string{"id": "stream_id"}},
		{Name: "del", Op: "delete", Table: "members", Key: map[string]string{"id": "stream_id"}, IfMissing: IfMissingDeadLetter},
	}})
	ins, err := p.Eval(&event.Event{ID: "e", StreamID: "s1", Type: "T"})
	if err != nil {
		t.Fatal(err)
	}
	if len(ins) != 3 {
		t.Fatalf("got %d intents, want 3", len(ins))
	}
	for i, in := range ins {
		if len(in.Key) != 1 || in.Key[0].Value != "s1" || in.Set != nil || in.Inc != nil {
			t.Errorf("intent %d = %+v, want key id = s1 only", i, in)
		}
		if in.DeadLetterIfMissing != (in.Rule == "del") {
			t.Errorf("intent %d: DeadLetterIfMissing = %v", i, in.DeadLetterIfMissing)
		}
	}
}

// TestEveryOpHasAKind: every op of the table is evaluated by one of the
// three kinds Eval knows, and the op list is what config offers.
func TestEveryOpHasAKind(t *testing.T) {
	for _, op := range event.Ops {
		switch op.Kind {
		case event.KindRow, event.KindStatement, event.KindReject:
		default:
			t.Errorf("op %q: kind %d is not evaluated", op.Op, op.Kind)
		}
		if op.Kind == event.KindRow && op.Table != event.Required {
			t.Errorf("op %q writes rows but does not require a table", op.Op)
		}
		if s, ok := op.Op.Spec(); !ok || s != op {
			t.Errorf("op %q: Spec() = %+v, %v", op.Op, s, ok)
		}
	}
}
