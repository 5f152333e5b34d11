package rules

import (
	"errors"
	"maps"
	"math"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/expr-lang/expr/file"

	"github.com/pgscribe/pgscribe/event"
)

var occurred = time.Date(2024, 3, 15, 10, 30, 0, 0, time.UTC)

// ev builds an event of the given type and data.
func ev(typ string, data map[string]any) *event.Event {
	return &event.Event{
		Position: 42, ID: "0190e1c2-aaaa-bbbb-cccc-000000000001", StreamID: "acc-1", StreamPosition: 7,
		Type: typ, Data: data, Metadata: map[string]any{"tenant": "t1", "user": map[string]any{"id": int64(9)}},
		OccurredAt: occurred,
	}
}

// single is a one-rule projection.
func single(r RuleSpec) Spec {
	if r.Name == "" {
		r.Name = "r"
	}
	return Spec{Name: "p", Version: 1, Rules: []RuleSpec{r}}
}

// setRule is an insert of one column "v" with expression src.
func setRule(src string) Spec {
	return single(RuleSpec{Op: "insert", Table: "t", Set: map[string]string{"v": src}})
}

// singleErr is the EvalError of single's rule failing at field.
func singleErr(field string) EvalError {
	return EvalError{Projection: "p", Version: 1, Rule: "r", Field: field}
}

func setIntent(v any) []event.Intent {
	return []event.Intent{{Rule: "r", Op: event.OpInsert, Table: "t", Set: []event.Column{{Name: "v", Value: v}}}}
}

func TestEval(t *testing.T) {
	const (
		big53  = int64(1)<<53 + 1 // not representable in float64
		maxI64 = int64(math.MaxInt64)
	)
	acct := map[string]any{"account_id": "a1", "owner": "ann", "initial": int64(100)}
	tests := []struct {
		name    string
		spec    Spec
		event   *event.Event
		want    []event.Intent
		wantErr bool
	}{
		{
			name:  "design: open upserts with key and sorted set",
			spec:  balances(),
			event: ev("AccountOpened", acct),
			want: []event.Intent{{Rule: "open", Op: event.OpUpsert, Table: "balances",
				Key: []event.Column{{Name: "account_id", Value: "a1"}},
				Set: []event.Column{{Name: "balance", Value: int64(100)}, {Name: "owner", Value: "ann"}}}},
		},
		{
			name:  "design: when false skips",
			spec:  balances(),
			event: ev("AccountOpened", map[string]any{"account_id": "a1", "owner": "ann", "initial": int64(-1)}),
		},
		{
			name:  "design: deposit increments",
			spec:  balances(),
			event: ev("Deposited", map[string]any{"account_id": "a1", "amount": int64(5)}),
			want: []event.Intent{{Rule: "Deposited#2", Op: event.OpUpdate, Table: "balances",
				Key: []event.Column{{Name: "account_id", Value: "a1"}},
				Inc: []event.Column{{Name: "balance", Value: int64(5)}}}},
		},
		{
			name:  "design: withdrawal negates exactly near 2^63",
			spec:  balances(),
			event: ev("Withdrawn", map[string]any{"account_id": "a1", "amount": maxI64}),
			want: []event.Intent{{Rule: "Deposited#2", Op: event.OpUpdate, Table: "balances",
				Key: []event.Column{{Name: "account_id", Value: "a1"}},
				Inc: []event.Column{{Name: "balance", Value: -maxI64}}}},
		},
		{
			name:  "design: deposit exact above 2^53",
			spec:  balances(),
			event: ev("Deposited", map[string]any{"account_id": "a1", "amount": big53}),
			want: []event.Intent{{Rule: "Deposited#2", Op: event.OpUpdate, Table: "balances",
				Key: []event.Column{{Name: "account_id", Value: "a1"}},
				Inc: []event.Column{{Name: "balance", Value: big53}}}},
		},
		{
			name:    "design: fail rule after an intent rejects all",
			spec:    balances(),
			event:   ev("Withdrawn", map[string]any{"account_id": "a1", "amount": int64(0)}),
			wantErr: true,
		},
		{
			name:  "no rule for the type",
			spec:  balances(),
			event: ev("Renamed", acct),
		},
		{
			name:  "on absent matches every type",
			spec:  setRule("type"),
			event: ev("Anything", nil),
			want:  setIntent("Anything"),
		},
		{
			name:  "on list matches its second type",
			spec:  single(RuleSpec{On: []any{"A", "B"}, Op: "insert", Table: "t", Set: map[string]string{"v": "type"}}),
			event: ev("B", nil),
			want:  setIntent("B"),
		},
		{
			name:  "on list does not match others",
			spec:  single(RuleSpec{On: []string{"A", "B"}, Op: "insert", Table: "t", Set: map[string]string{"v": "type"}}),
			event: ev("C", nil),
		},
		{
			name:  "delete",
			spec:  single(RuleSpec{On: "Closed", Op: "delete", Table: "t", Key: map[string]string{"id": "data.id", "a": "stream_id"}}),
			event: ev("Closed", map[string]any{"id": int64(3)}),
			want: []event.Intent{{Rule: "r", Op: event.OpDelete, Table: "t",
				Key: []event.Column{{Name: "a", Value: "acc-1"}, {Name: "id", Value: int64(3)}}}},
		},
		{
			name: "sql with args",
			spec: single(RuleSpec{Op: "sql", SQL: "select $1, $2, $3",
				Args: []string{"id", "stream_position + 1", "data.x"}}),
			event: ev("E", map[string]any{"x": 1.5}),
			want: []event.Intent{{Rule: "r", Op: event.OpSQL, SQL: "select $1, $2, $3",
				Args: []any{"0190e1c2-aaaa-bbbb-cccc-000000000001", int64(8), 1.5}}},
		},
		{
			name: "upsert with set and inc",
			spec: single(RuleSpec{Op: "upsert", Table: "t", Key: map[string]string{"k": "stream_id"},
				Set: map[string]string{"last": "position"}, Inc: map[string]string{"n": "1", "f": "data.f"}}),
			event: ev("E", map[string]any{"f": 0.25}),
			want: []event.Intent{{Rule: "r", Op: event.OpUpsert, Table: "t",
				Key: []event.Column{{Name: "k", Value: "acc-1"}},
				Set: []event.Column{{Name: "last", Value: int64(42)}},
				Inc: []event.Column{{Name: "f", Value: 0.25}, {Name: "n", Value: int64(1)}}}},
		},
		{
			name: "several rules in rule order",
			spec: Spec{Name: "p", Version: 1, Rules: []RuleSpec{
				{Name: "a", Op: "sql", SQL: "a"},
				{Name: "skip", When: "false", Op: "sql", SQL: "s"},
				{Name: "other", On: "F", Op: "sql", SQL: "o"},
				{Name: "b", On: "E", Op: "sql", SQL: "b"},
				{Name: "c", Op: "sql", SQL: "c"},
			}},
			event: ev("E", nil),
			want:  []event.Intent{{Rule: "a", Op: event.OpSQL, SQL: "a"}, {Rule: "b", Op: event.OpSQL, SQL: "b"}, {Rule: "c", Op: event.OpSQL, SQL: "c"}},
		},
		{
			name:  "int64 plus one exact above 2^53",
			spec:  setRule("data.n + 1"),
			event: ev("E", map[string]any{"n": big53}),
			want:  setIntent(big53 + 1),
		},
		{
			name:  "int64 max passes through",
			spec:  setRule("data.n"),
			event: ev("E", map[string]any{"n": maxI64}),
			want:  setIntent(maxI64),
		},
		{
			name:  "int64 max minus one",
			spec:  setRule("data.n - 1"),
			event: ev("E", map[string]any{"n": maxI64}),
			want:  setIntent(maxI64 - 1),
		},
		{
			name:  "int64 negated",
			spec:  setRule("-data.n"),
			event: ev("E", map[string]any{"n": big53}),
			want:  setIntent(-big53),
		},
		{
			name:  "literal int becomes int64",
			spec:  setRule("2 * 3"),
			event: ev("E", nil),
			want:  setIntent(int64(6)),
		},
		{
			name:  "float stays float64",
			spec:  setRule("data.n * 1.5"),
			event: ev("E", map[string]any{"n": int64(2)}),
			want:  setIntent(3.0),
		},
		{
			name:  "metadata access",
			spec:  setRule("metadata.tenant + '/' + string(metadata.user.id)"),
			event: ev("E", nil),
			want:  setIntent("t1/9"),
		},
		{
			name:  "occurred_at methods",
			spec:  setRule("occurred_at.Year()"),
			event: ev("E", nil),
			want:  setIntent(int64(2024)),
		},
		{
			name:  "occurred_at compared with date()",
			spec:  single(RuleSpec{When: "occurred_at >= date('2024-01-01')", Op: "insert", Table: "t", Set: map[string]string{"v": "occurred_at"}}),
			event: ev("E", nil),
			want:  setIntent(occurred),
		},
		{
			name:  "occurred_at before date() skips",
			spec:  single(RuleSpec{When: "occurred_at < date('2024-01-01')", Op: "insert", Table: "t", Set: map[string]string{"v": "occurred_at"}}),
			event: ev("E", nil),
		},
		{
			name:  "object result stays a map",
			spec:  setRule("data"),
			event: ev("E", map[string]any{"a": int64(1)}),
			want:  setIntent(map[string]any{"a": int64(1)}),
		},
		{
			name:  "typed slice result becomes []any",
			spec:  setRule("split('a,b', ',')"),
			event: ev("E", nil),
			want:  setIntent([]any{"a", "b"}),
		},
		{
			name:  "explicit default for a missing field",
			spec:  setRule("data.note ?? ''"),
			event: ev("E", nil),
			want:  setIntent(""),
		},
		{
			name:  "when with a defaulted missing flag",
			spec:  single(RuleSpec{When: "data.vip ?? false", Op: "insert", Table: "t", Set: map[string]string{"v": "1"}}),
			event: ev("E", nil),
		},
		{
			name:    "missing set field",
			spec:    setRule("data.nope"),
			event:   ev("E", nil),
			wantErr: true,
		},
		{
			name:    "runtime type error",
			spec:    setRule("data.s + 1"),
			event:   ev("E", map[string]any{"s": "x"}),
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustCompile(t, tt.spec)
			got, err := p.Eval(tt.event)
			if (err != nil) != tt.wantErr {
				t.Fatalf("Eval error = %v, wantErr %v", err, tt.wantErr)
			}
			if err != nil {
				var ee *EvalError
				if !errors.As(err, &ee) {
					t.Fatalf("error %v (%T) is not an *EvalError", err, err)
				}
			}
			// RuleIndex is checked apart: it is the rule's place, which
			// the table's wants leave out.
			for i := range got {
				if r := tt.spec.Rules[got[i].RuleIndex]; RuleName(got[i].RuleIndex, r) != got[i].Rule {
					t.Errorf("intent %d: RuleIndex %d is not rule %q", i, got[i].RuleIndex, got[i].Rule)
				}
				got[i].RuleIndex = 0
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("intents:\n got %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

func TestEvalErrors(t *testing.T) {
	tests := map[string]struct {
		spec      Spec
		event     *event.Event
		want      EvalError // compared without Err
		wantCause error     // errors.Is; nil: any cause
		wantExpr  bool      // the cause is an expr *file.Error
		wantMsg   string    // for fail rules: the evaluated message
	}{
		"fail rule carries its message": {
			spec:    balances(),
			event:   ev("Withdrawn", map[string]any{"account_id": "a1", "amount": int64(-5)}),
			want:    EvalError{Projection: "balances", Version: 1, Rule: "Withdrawn#3", Fail: true},
			wantMsg: "non-positive withdrawal: -5",
		},
		"fail message of unknown type is formatted": {
			spec:    single(RuleSpec{Name: "stop", Op: "fail", Message: "data.reason"}),
			event:   ev("E", map[string]any{"reason": int64(12)}),
			want:    EvalError{Projection: "p", Version: 1, Rule: "stop", Fail: true},
			wantMsg: "12",
		},
		"missing field in set": {
			spec:      balances(),
			event:     ev("AccountOpened", map[string]any{"account_id": "a1", "initial": int64(1)}),
			want:      EvalError{Projection: "balances", Version: 1, Rule: "open", Field: "set.owner"},
			wantCause: ErrNilValue,
		},
		"nil key": {
			spec:      balances(),
			event:     ev("Deposited", map[string]any{"amount": int64(1)}),
			want:      EvalError{Projection: "balances", Version: 1, Rule: "Deposited#2", Field: "key.account_id"},
			wantCause: ErrNilValue,
		},
		"inc not a number": {
			spec:      single(RuleSpec{Op: "update", Table: "t", Key: map[string]string{"id": "id"}, Inc: map[string]string{"n": "data.n"}}),
			event:     ev("E", map[string]any{"n": "12"}),
			want:      singleErr("inc.n"),
			wantCause: ErrWrongType,
		},
		"inc nil": {
			spec:      single(RuleSpec{Op: "update", Table: "t", Key: map[string]string{"id": "id"}, Inc: map[string]string{"n": "data.n"}}),
			event:     ev("E", nil),
			want:      singleErr("inc.n"),
			wantCause: ErrNilValue,
		},
		"nil sql arg": {
			spec:      single(RuleSpec{Op: "sql", SQL: "select $1, $2", Args: []string{"id", "data.x"}}),
			event:     ev("E", nil),
			want:      singleErr("args[2]"),
			wantCause: ErrNilValue,
		},
		"when not boolean at run time": {
			spec:      single(RuleSpec{When: "data.flag", Op: "sql", SQL: "x"}),
			event:     ev("E", map[string]any{"flag": "yes"}),
			want:      singleErr("when"),
			wantCause: ErrWrongType,
		},
		"when on a missing flag": {
			spec:      single(RuleSpec{When: "data.flag", Op: "sql", SQL: "x"}),
			event:     ev("E", nil),
			want:      singleErr("when"),
			wantCause: ErrNilValue,
		},
		"when comparing a missing field": {
			spec:     balances(),
			event:    ev("AccountOpened", map[string]any{"account_id": "a1", "owner": "ann"}),
			want:     EvalError{Projection: "balances", Version: 1, Rule: "open", Field: "when"},
			wantExpr: true,
		},
		"fetch from a missing object": {
			spec:     setRule("data.a.b"),
			event:    ev("E", nil),
			want:     singleErr("set.v"),
			wantExpr: true,
		},
		"message fails to evaluate": {
			spec:     single(RuleSpec{Op: "fail", Message: "'x' + data.a.b"}),
			event:    ev("E", nil),
			want:     singleErr("message"),
			wantExpr: true,
		},
		"all or none: second rule errors": {
			spec: Spec{Name: "p", Version: 1, Rules: []RuleSpec{
				{Name: "ok", Op: "insert", Table: "t", Set: map[string]string{"v": "1"}},
				{Name: "bad", Op: "insert", Table: "u", Set: map[string]string{"v": "data.missing"}},
			}},
			event:     ev("E", nil),
			want:      EvalError{Projection: "p", Version: 1, Rule: "bad", Field: "set.v"},
			wantCause: ErrNilValue,
		},
		"unsupported result type": {
			spec:      setRule("id != '' ? occurred_at.Add : 1"),
			event:     ev("E", nil),
			want:      singleErr("set.v"),
			wantCause: ErrWrongType,
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			p := mustCompile(t, tt.spec)
			e := tt.event
			intents, err := p.Eval(e)
			if err == nil {
				t.Fatalf("Eval succeeded with %v, want an error", intents)
			}
			if intents != nil {
				t.Errorf("Eval returned intents with an error: %v", intents)
			}
			var ee *EvalError
			if !errors.As(err, &ee) {
				t.Fatalf("error %v (%T) is not an *EvalError", err, err)
			}
			want := tt.want
			want.EventID, want.Position = e.ID, e.Position
			got := *ee
			got.Err = nil
			if got != want {
				t.Errorf("error:\n got %+v\nwant %+v", got, want)
			}
			if ee.Kind() != "rule:"+want.Rule {
				t.Errorf("Kind %q, want %q", ee.Kind(), "rule:"+want.Rule)
			}
			if tt.wantCause != nil && !errors.Is(err, tt.wantCause) {
				t.Errorf("cause %v, want %v", ee.Err, tt.wantCause)
			}
			var fe *file.Error
			if tt.wantExpr && !errors.As(err, &fe) {
				t.Errorf("cause %v (%T) is not an expr error", ee.Err, ee.Err)
			}
			if tt.wantMsg != "" && ee.Err.Error() != tt.wantMsg {
				t.Errorf("message %q, want %q", ee.Err.Error(), tt.wantMsg)
			}
		})
	}
}

// TestNormalizeIntegers: every Go integer type an expression can yield
// becomes an int64, and a uint above math.MaxInt64 is a wrong type.
func TestNormalizeIntegers(t *testing.T) {
	for _, v := range []any{int(-7), int8(-7), int16(-7), int32(-7), int64(-7)} {
		if got, err := normalize(v); err != nil || got != int64(-7) {
			t.Errorf("normalize(%T) = %#v, %v; want int64(-7)", v, got, err)
		}
	}
	for _, v := range []any{uint(7), uint8(7), uint16(7), uint32(7), uint64(7)} {
		if got, err := normalize(v); err != nil || got != int64(7) {
			t.Errorf("normalize(%T) = %#v, %v; want int64(7)", v, got, err)
		}
	}
	for _, v := range []any{uint(math.MaxInt64 + 1), uint64(math.MaxUint64)} {
		if got, err := normalize(v); !errors.Is(err, ErrWrongType) {
			t.Errorf("normalize(%T %v) = %#v, %v; want ErrWrongType", v, v, got, err)
		}
	}
}

// TestEvalConcurrent runs one Program from several goroutines; run with
// -race.
func TestEvalConcurrent(t *testing.T) {
	p := mustCompile(t, balances())
	const workers, perWorker = 8, 500
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWorker {
				amount := int64(w*perWorker + i + 1)
				e := ev("Deposited", map[string]any{"account_id": "a", "amount": amount})
				if i%2 == 1 {
					e = ev("Withdrawn", map[string]any{"account_id": "a", "amount": amount})
					amount = -amount
				}
				got, err := p.Eval(e)
				if err != nil {
					errs <- err
					return
				}
				if len(got) != 1 || got[0].Inc[0].Value != amount {
					errs <- errors.New("wrong intent under concurrency")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestEvalDoesNotAliasIntents checks that intents of successive events do
// not share column storage.
func TestEvalDoesNotAliasIntents(t *testing.T) {
	p := mustCompile(t, balances())
	a, err := p.Eval(ev("Deposited", map[string]any{"account_id": "a", "amount": int64(1)}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Eval(ev("Deposited", map[string]any{"account_id": "b", "amount": int64(2)})); err != nil {
		t.Fatal(err)
	}
	if a[0].Key[0].Value != "a" || a[0].Inc[0].Value != int64(1) {
		t.Errorf("first intent changed: %+v", a[0])
	}
}

// TestEvalDecodesWhatRulesRead: an event's JSON documents are decoded only
// as far as the rules of its type read them, so a document nobody reads
// costs nothing and cannot dead-letter the event; one that is read and is
// not JSON dead-letters it as a decode error.
func TestEvalDecodesWhatRulesRead(t *testing.T) {
	raw := func(typ, data, meta string) *event.Event {
		return &event.Event{ID: "e1", StreamID: "s", StreamPosition: 1, Type: typ,
			RawData: []byte(data), RawMetadata: []byte(meta), OccurredAt: occurred}
	}
	p := mustCompile(t, Spec{Name: "p", Version: 1, Rules: []RuleSpec{
		{Name: "by_data", On: "D", Op: "insert", Table: "t", Set: map[string]string{"v": "data.x"}},
		{Name: "by_meta", On: "M", Op: "insert", Table: "t", Set: map[string]string{"v": "stream_id"},
			When: `metadata.tenant == "t1"`},
		{Name: "by_env", On: "E", Op: "insert", Table: "t", Set: map[string]string{"v": `$env["type"]`}},
		{Name: "by_sql", On: "S", Op: "sql", SQL: "SELECT $1", Args: []string{"metadata.user"}},
		{Name: "plain", On: "P", Op: "insert", Table: "t", Set: map[string]string{"v": "stream_position"}},
		{Name: "whole", On: "W", Op: "insert", Table: "t", Set: map[string]string{"v": "len(data)"}},
		{Name: "constant keys", On: "C", Op: "insert", Table: "t", Set: map[string]string{"v": `data["x" + "y"] ?? data?.x.deep`}},
		{Name: "computed key", On: "K", Op: "insert", Table: "t", Set: map[string]string{"v": `data[type] ?? data["x" + "y"] ?? data.x.deep`}},
	}})
	tests := []struct {
		name               string
		event              *event.Event
		wantData, wantMeta bool
		wantDecodeErr      bool
		wantIntents        int
		wantDataKeys       []string // the keys Data holds, when set
	}{
		{name: "data only, bad metadata unread", event: raw("D", `{"x":1,"y":{"z":2}}`, `{not json`), wantData: true, wantIntents: 1,
			wantDataKeys: []string{"x"}},
		{name: "data whole", event: raw("W", `{"x":1,"y":2}`, `{}`), wantData: true, wantIntents: 1, wantDataKeys: []string{"x", "y"}},
		{name: "data by a computed key", event: raw("K", `{"x":{"deep":1},"xy":2,"z":3}`, `{}`), wantData: true, wantIntents: 1,
			wantDataKeys: []string{"x", "xy", "z"}},
		{name: "data by constant keys", event: raw("C", `{"x":{"deep":1},"xy":2,"z":3}`, `{}`), wantData: true, wantIntents: 1,
			wantDataKeys: []string{"x", "xy"}},
		{name: "metadata in when", event: raw("M", `{not json`, `{"tenant":"t1"}`), wantMeta: true, wantIntents: 1},
		{name: "$env reads both", event: raw("E", `{"x":1}`, `{}`), wantData: true, wantMeta: true, wantIntents: 1},
		{name: "sql args", event: raw("S", `{not json`, `{"user":"u"}`), wantMeta: true, wantIntents: 1},
		{name: "neither", event: raw("P", `{not json`, `{not json`), wantIntents: 1},
		{name: "no rule for the type", event: raw("Other", `{not json`, `{not json`)},
		{name: "read and not JSON", event: raw("D", `{not json`, `{}`), wantDecodeErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			intents, err := p.Eval(tt.event)
			var de *event.DecodeError
			if tt.wantDecodeErr {
				if !errors.As(err, &de) || de.Kind() != "decode" {
					t.Fatalf("Eval() = %v, want a decode error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Eval(): %v", err)
			}
			if len(intents) != tt.wantIntents {
				t.Errorf("%d intents, want %d", len(intents), tt.wantIntents)
			}
			if got := tt.event.Data != nil; got != tt.wantData {
				t.Errorf("data decoded %v, want %v", got, tt.wantData)
			}
			if tt.wantDataKeys != nil {
				got := slices.Sorted(maps.Keys(tt.event.Data))
				if !slices.Equal(got, tt.wantDataKeys) {
					t.Errorf("data decoded with keys %v, want %v", got, tt.wantDataKeys)
				}
			}
			if got := tt.event.Metadata != nil; got != tt.wantMeta {
				t.Errorf("metadata decoded %v, want %v", got, tt.wantMeta)
			}
		})
	}
}
