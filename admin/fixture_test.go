package admin

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

const goodFixture = `projection = "balances"

[[event]]
type   = "AccountOpened"
stream = "a"
data   = { account_id = "a", initial = 5 }

  [[event.intent]]
  op    = "upsert"
  table = "balances"
  key   = { account_id = "a" }
  set   = { balance = 5 }

[[event]]
name        = "second"
type        = "Withdrawn"
stream      = "a"
occurred_at = 2025-03-01T10:00:00Z
dead_letter = { rule = "non_positive", message_contains = "non-positive" }

[[event]]
type     = "Other"
stream   = "b"
position = 42
skip     = true

[[table]]
name = "balances"
rows = [ { account_id = "a", balance = 5 } ]
`

func TestParseFixture(t *testing.T) {
	f, err := parseFixture("f.toml", goodFixture)
	if err != nil {
		t.Fatal(err)
	}
	if f.Projection != "balances" || f.Version != 0 || len(f.Events) != 3 || len(f.Tables) != 1 {
		t.Fatalf("parsed %+v", f)
	}
	e0, e1, e2 := f.Events[0], f.Events[1], f.Events[2]
	if e0.Label != "event[0]" || e0.Line != 3 || e0.Event.StreamPosition != 1 || e0.Event.Position != 1 ||
		e0.Event.ID != "00000000-0000-4000-8000-000000000001" || string(e0.Event.RawData) != `{"account_id":"a","initial":5}` ||
		!e0.Event.OccurredAt.Equal(fixtureStart) || len(e0.Intents) != 1 {
		t.Errorf("event 0: %+v %+v", e0, e0.Event)
	}
	if e0.Intents[0].Op != event.OpUpsert || e0.Intents[0].Set[0].Name != "balance" || e0.Intents[0].Set[0].Value != int64(5) {
		t.Errorf("intent: %+v", e0.Intents[0])
	}
	if e1.Label != "second" || e1.Event.StreamPosition != 2 || e1.Event.OccurredAt != time.Date(2025, 3, 1, 10, 0, 0, 0, time.UTC) ||
		e1.DeadLetter == nil || e1.DeadLetter.Kind != "rule:non_positive" || e1.DeadLetter.Contains != "non-positive" {
		t.Errorf("event 1: %+v %+v", e1, e1.DeadLetter)
	}
	if !e2.Skip || e2.Event.Position != 42 || e2.Event.StreamPosition != 1 {
		t.Errorf("event 2: %+v", e2)
	}
	if tb := f.Tables[0]; tb.Name != "balances" || tb.Line != 27 || strings.Join(tb.Columns, ",") != "account_id,balance" {
		t.Errorf("table: %+v", tb)
	}
}

func TestParseFixtureErrors(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"syntax", "projection = \n", []string{"f.toml:1: "}},
		{"no projection, no events", "version = 0\n", []string{
			"f.toml: projection: is required", "f.toml:1: version: must be at least 1"}},
		{"no events", "projection = \"p\"\n", []string{"f.toml: event: a fixture needs at least one [[event]]"}},
		{"unknown and missing keys", "projection = \"p\"\n[[event]]\ntype = \"T\"\n\n[[event]]\nstream = \"s\"\ntype = \"T\"\n  [[event.intent]]\n  opp = \"x\"\n", []string{
			"f.toml:2: event[0].stream: is required",
			"f.toml:8: event[1].intent[0].op: is required",
			"f.toml:9: event[1].intent[0].opp: unknown key"}},
		{"two expectations", "projection = \"p\"\n[[event]]\ntype = \"T\"\nstream = \"s\"\nskip = true\ndead_letter = { rule = \"r\" }\n", []string{
			"f.toml:2: event[0]: give one of skip, intent and dead_letter"}},
		{"dead letter without kind", "projection = \"p\"\n[[event]]\ntype = \"T\"\nstream = \"s\"\ndead_letter = { message = \"m\" }\n", []string{
			"f.toml:5: event[0].dead_letter.rule: is required"}},
		{"rows differ", "projection = \"p\"\n[[event]]\ntype = \"T\"\nstream = \"s\"\n[[table]]\nname = \"t\"\nrows = [\n { a = 1 },\n { b = 2 },\n]\n", []string{
			"f.toml:9: table[0].rows[1]: names columns [b], rows[0] names [a]"}},
		{"wrong types", "projection = 1\n[[event]]\ntype = \"T\"\nstream = \"s\"\ndata = 3\nposition = \"x\"\n", []string{
			"f.toml:1: projection: must be a string", "f.toml:5: event[0].data: must be a table", "f.toml:6: event[0].position: must be an integer"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseFixture("f.toml", tt.src)
			var fe *FixtureError
			if !errors.As(err, &fe) {
				t.Fatalf("want a *FixtureError, got %v", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("want %q in:\n%v", w, err)
				}
			}
		})
	}
}

func TestValuesEqual(t *testing.T) {
	ts := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name      string
		want, got any
		eq        bool
	}{
		{"int int", int64(5), int64(5), true},
		{"int float", int64(5), 5.0, true},
		{"int other", int64(5), int64(6), false},
		{"int string", int64(5), "5", false},
		{"string", "a", "a", true},
		{"bool", true, true, true},
		{"bool other", true, false, false},
		{"time time", ts, ts.In(time.FixedZone("x", 3600)), true},
		{"string time", "2024-01-01T01:00:00+01:00", ts, true},
		{"time string", ts, "2024-01-01T00:00:00Z", true},
		{"doc", map[string]any{"a": []any{int64(1), "x"}}, map[string]any{"a": []any{1.0, "x"}}, true},
		{"doc other", map[string]any{"a": []any{int64(1)}}, map[string]any{"a": []any{int64(2)}}, false},
	}
	for _, tt := range tests {
		if got := valuesEqual(tt.want, tt.got); got != tt.eq {
			t.Errorf("%s: valuesEqual(%v, %v) = %v", tt.name, tt.want, tt.got, got)
		}
	}
}

func TestCompareOutcome(t *testing.T) {
	upsert := event.Intent{Rule: "open", Op: event.OpUpsert, Table: "balances",
		Key: []event.Column{{Name: "account_id", Value: "a"}}, Set: []event.Column{{Name: "balance", Value: int64(5)}}}
	want := FixtureEvent{Checked: true, Intents: []event.Intent{{Op: event.OpUpsert, Table: "balances",
		Key: []event.Column{{Name: "account_id", Value: "a"}}, Set: []event.Column{{Name: "balance", Value: int64(6)}, {Name: "owner", Value: "x"}}}}}
	tests := []struct {
		name string
		fe   FixtureEvent
		got  outcome
		want []string
	}{
		{"equal", FixtureEvent{Checked: true, Intents: []event.Intent{upsert}}, outcome{intents: []event.Intent{upsert}}, nil},
		{"columns", want, outcome{intents: []event.Intent{upsert}}, []string{
			"intent 1 (rule open): set.balance: want 6, got 5", "intent 1 (rule open): set.owner: want \"x\", got no such column"}},
		{"missing intent", FixtureEvent{Checked: true, Intents: []event.Intent{upsert, upsert}}, outcome{intents: []event.Intent{upsert}}, []string{
			"intent 2: missing: upsert balances key { account_id = \"a\" } set { balance = 5 }"}},
		{"unexpected intent", FixtureEvent{Checked: true, Intents: []event.Intent{upsert}}, outcome{intents: []event.Intent{upsert, upsert}}, []string{
			"intent 2 (rule open): unexpected: upsert balances"}},
		{"dead, want intents", want, outcome{dead: true, kind: "rule:open", message: "boom"}, []string{
			"want 1 intents", "got  dead letter rule:open: boom"}},
		{"want dead", FixtureEvent{Checked: true, DeadLetter: &ExpectedDeadLetter{Kind: "rule:fail"}}, outcome{intents: []event.Intent{upsert}}, []string{
			"want dead letter rule:fail", "got  1 intents: [rule open] upsert balances"}},
		{"dead kind and message", FixtureEvent{Checked: true, DeadLetter: &ExpectedDeadLetter{Kind: "rule:fail", Message: "m", Contains: "zz"}},
			outcome{dead: true, kind: "rule:other", message: "n"}, []string{
				"dead letter kind: want rule:fail, got rule:other", `want "m"`, `want it to contain "zz"`}},
		{"want skip", FixtureEvent{Checked: true, Skip: true}, outcome{intents: []event.Intent{upsert}}, []string{"want skipped (no rule matches)"}},
		{"skip", FixtureEvent{Checked: true, Skip: true}, outcome{}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := compareOutcome(tt.fe, tt.got)
			if (d == "") != (tt.want == nil) {
				t.Fatalf("diff %q", d)
			}
			for _, w := range tt.want {
				if !strings.Contains(d, w) {
					t.Errorf("want %q in:\n%s", w, d)
				}
			}
		})
	}
}

func TestWritersOrderDependence(t *testing.T) {
	w := newWriters(map[string][]string{"t": {"id"}})
	ev := func(stream string) *event.Event { return &event.Event{StreamID: stream} }
	inc := event.Intent{Op: event.OpUpdate, Table: "t", Key: []event.Column{{Name: "id", Value: "inc-only"}}, Inc: []event.Column{{Name: "n", Value: int64(1)}}}
	set := event.Intent{Op: event.OpUpsert, Table: "t", Key: []event.Column{{Name: "id", Value: "set"}}, Set: []event.Column{{Name: "v", Value: "x"}}}
	one := event.Intent{Op: event.OpUpsert, Table: "t", Key: []event.Column{{Name: "id", Value: "one"}}, Set: []event.Column{{Name: "v", Value: "x"}}}
	ins := event.Intent{Op: event.OpInsert, Table: "t", Set: []event.Column{{Name: "id", Value: "ins"}}}
	w.see(ev("s1"), []event.Intent{inc, set, one, ins})
	w.see(ev("s2"), []event.Intent{inc, set, ins})
	w.see(ev("s1"), []event.Intent{one}) // a retried batch: same stream again
	got := map[string]bool{}
	for _, wr := range w.rows["t"] {
		got[wr.keyValue[0].(string)] = wr.multi && wr.nonComm
	}
	want := map[string]bool{"inc-only": false, "set": true, "one": false, "ins": true}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("row %s: order-dependent %v, want %v", k, got[k], v)
		}
	}
	if len(w.untracked) != 0 {
		t.Fatal(w.untracked)
	}
	w.see(ev("s3"), []event.Intent{{Rule: "r", Op: event.OpUpdate, Table: "t", Set: []event.Column{{Name: "v", Value: "y"}}}, inc})
	if w.untracked["t"] != "r" {
		t.Error("an intent without the key column must make the table untracked")
	}
	if wr := w.rows["t"][`["inc-only"]`]; wr == nil || !wr.multi {
		t.Error("the intents after an untracked one are still recorded")
	}
}

func TestFormatValueNumbers(t *testing.T) {
	for in, want := range map[float64]string{1058739: "1058739", -3: "-3", 2.5: "2.5", 1e21: "1000000000000000000000"} {
		if got := formatValue(in); got != want {
			t.Errorf("formatValue(%v) = %q, want %q", in, got, want)
		}
	}
}
