package admin

import (
	"strings"
	"testing"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

func TestScratchEval(t *testing.T) {
	prog, err := rules.Compile(rules.Spec{Name: "p", Version: 1, Rules: []rules.RuleSpec{
		{Name: "a", On: "A", Op: "upsert", Table: "app.t", Key: map[string]string{"id": "data.id"}, Set: map[string]string{"v": "1"}},
		{Name: "b", On: "A", Op: "insert", Table: "u", Set: map[string]string{"id": "data.id"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got := projectionTables(prog); strings.Join(got, ",") != "app.t,u" {
		t.Fatalf("tables %v", got)
	}
	var seen []event.Intent
	e := &scratchEval{prog: prog, tables: map[string]string{"app.t": "s.app__t", "u": "s.u"},
		seen: func(_ *event.Event, in []event.Intent) { seen = in }}
	ev := &event.Event{Type: "A", StreamID: "x", RawData: []byte(`{"id": 7}`)}
	out, err := e.Eval(ev)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Table != "s.app__t" || out[1].Table != "s.u" {
		t.Errorf("intents %+v", out)
	}
	if len(seen) != 2 || seen[0].Table != "app.t" {
		t.Errorf("seen gets the intents as the rules wrote them: %+v", seen)
	}
	// A table without a scratch copy is never written.
	e.tables = map[string]string{"u": "s.u"}
	if _, err := e.Eval(&event.Event{Type: "A", RawData: []byte(`{"id": 7}`)}); err == nil || !strings.Contains(err.Error(), "app.t has no scratch copy") {
		t.Errorf("want an error for a table without copy, got %v", err)
	}
	if scratchTableName("app.t") != "app__t" {
		t.Error(scratchTableName("app.t"))
	}
}

func TestCheckSQLRules(t *testing.T) {
	ok := rules.Spec{Name: "p", Version: 1, Rules: []rules.RuleSpec{{Name: "s", Op: "sql", SQL: "INSERT INTO audit VALUES ($1)"}}}
	if err := checkSQLRules(ok); err != nil {
		t.Error(err)
	}
	bad := rules.Spec{Name: "p", Version: 1, Rules: []rules.RuleSpec{{Name: "s", Op: "sql", SQL: "INSERT INTO app.audit VALUES ($1)"}}}
	if err := checkSQLRules(bad); err == nil || !strings.Contains(err.Error(), `rule "s"`) {
		t.Errorf("want a refusal naming the rule, got %v", err)
	}
}
