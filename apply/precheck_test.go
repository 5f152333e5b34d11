package apply

import (
	"strings"
	"testing"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

func TestPrecheckTooLong(t *testing.T) {
	lim := lengths{"name": {n: 4, typ: "character varying(4)"}, "code": {n: 2, typ: "character(2)"}}
	cases := []struct {
		what string
		in   event.Intent
		want string // "" = fits
	}{
		{"fits", event.Intent{Op: event.OpInsert, Set: []event.Column{col("name", "abcd")}}, ""},
		{"runes, not bytes", event.Intent{Op: event.OpInsert, Set: []event.Column{col("name", "äöüß")}}, ""},
		{"too long", event.Intent{Op: event.OpInsert, Set: []event.Column{col("name", "abcde")}}, "character varying(4)"},
		{"trailing spaces are cut, not refused", event.Intent{Op: event.OpInsert, Set: []event.Column{col("name", "abcd   ")}}, ""},
		{"a number rendered as text", event.Intent{Op: event.OpUpsert, Key: []event.Column{col("code", int64(123))}}, "character(2)"},
		{"unbounded column", event.Intent{Op: event.OpInsert, Set: []event.Column{col("other", "abcdefgh")}}, ""},
		{"NULL", event.Intent{Op: event.OpInsert, Set: []event.Column{col("name", nil)}}, ""},
		{"update set", event.Intent{Op: event.OpUpdate, Set: []event.Column{col("name", "abcde")}}, "character varying(4)"},
		{"update key is only compared", event.Intent{Op: event.OpUpdate, Key: []event.Column{col("name", "abcde")}}, ""},
	}
	for _, c := range cases {
		c.in.Rule, c.in.Table = "r", "t"
		err := tooLong(&c.in, lim)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v, want no error", c.what, err)
		case c.want != "" && err == nil:
			t.Errorf("%s: no error, want one for %s", c.what, c.want)
		case c.want != "":
			if sqlstate.Code(err) != "22001" || sqlstate.Describe(err) != "22001 (string_data_right_truncation)" {
				t.Errorf("%s: SQLSTATE %q, want 22001", c.what, sqlstate.Code(err))
			}
			if want := "rule r: write t: ERROR: value too long for type " + c.want + " (SQLSTATE 22001)"; err.Error() != want {
				t.Errorf("%s: %q, want %q", c.what, err.Error(), want)
			}
		}
	}
}

func TestWalkCircuit(t *testing.T) {
	c := &Committer{opts: Options{CircuitThreshold: 3}}
	fail := func(state string) planned { return planned{out: outDead, sqlstate: state} }
	ok := planned{out: outApply}
	rule := planned{out: outDead} // a rule dead letter: no SQLSTATE
	var circ circuit
	if err := c.walkCircuit([]planned{fail("22001"), fail("22001"), ok, fail("22001"), rule, fail("22001")}, &circ); err != nil {
		t.Fatalf("an applied event in between closes the circuit: %v", err)
	}
	if circ.state != "22001" || circ.count != 2 {
		t.Fatalf("circuit = %+v, want 22001 ×2 carried to the next batch", circ)
	}
	if err := c.walkCircuit([]planned{fail("23505"), fail("22001")}, &circ); err != nil {
		t.Fatalf("another SQLSTATE restarts the count: %v", err)
	}
	err := c.walkCircuit([]planned{fail("22001"), fail("22001")}, &circ)
	if err == nil || !strings.Contains(err.Error(), "circuit open: 3 consecutive") {
		t.Fatalf("third consecutive failure: %v, want the circuit to open", err)
	}
}
