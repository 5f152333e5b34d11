package rules

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/pgscribe/pgscribe/event"
)

// Values of the projection's on_error and of a rule's if_missing. The
// config package validates against these and event.Ops; Compile checks
// again with the same functions, for specs built in code.
const (
	OnErrorDeadLetter = "dead_letter"
	OnErrorHalt       = "halt"
	OnErrorPark       = "park" // a dead letter holds its stream's later events until retried or skipped

	IfMissingIgnore     = "ignore"
	IfMissingDeadLetter = "dead_letter"
)

// OnErrorValues and IfMissingValues list the allowed values, default first.
var (
	OnErrorValues   = []string{OnErrorDeadLetter, OnErrorHalt, OnErrorPark}
	IfMissingValues = []string{IfMissingIgnore, IfMissingDeadLetter}
)

// RuleName is the name of the i-th (0-based) rule after defaulting: its
// name, else "<first type of on, or *>#<1-based index>".
func RuleName(i int, rs RuleSpec) string {
	if rs.Name != "" {
		return rs.Name
	}
	first := "*"
	switch on := rs.On.(type) {
	case string:
		if on != "" {
			first = on
		}
	case []string:
		if len(on) > 0 {
			first = on[0]
		}
	case []any:
		if len(on) > 0 {
			if s, ok := on[0].(string); ok {
				first = s
			}
		}
	}
	return first + "#" + strconv.Itoa(i+1)
}

// FieldProblem is a rule field that its op does not allow, or requires
// and lacks. Field is the rule's key ("table", "set", …); Column, when
// set, the column within key, set or inc.
type FieldProblem struct {
	Field, Column, Msg string
}

// Presence tells CheckFields whether a rule field was given at all and
// whether it names something (a non-empty string, table or list).
type Presence func(field string) (given, nonEmpty bool)

// SpecPresence is the Presence of a decoded RuleSpec, where an empty field
// and an absent one look alike.
func SpecPresence(rs RuleSpec) Presence {
	return func(field string) (bool, bool) {
		var n bool
		switch field {
		case "table":
			n = rs.Table != ""
		case "key":
			n = len(rs.Key) > 0
		case "set":
			n = len(rs.Set) > 0
		case "inc":
			n = len(rs.Inc) > 0
		case "sql":
			n = rs.SQL != ""
		case "args":
			n = len(rs.Args) > 0
		case "message":
			n = rs.Message != ""
		case "if_missing":
			n = rs.IfMissing != ""
		}
		return n, n
	}
}

// CheckFields reports the fields op requires but lacks and the fields it
// does not use: a stray field is almost always a mistake (a wrong op, or a
// key meant for the next rule), so it is an error rather than ignored.
func CheckFields(op event.OpSpec, has Presence) []FieldProblem {
	var ps []FieldProblem
	fail := func(field, format string) {
		ps = append(ps, FieldProblem{Field: field, Msg: fmt.Sprintf(format, op.Op)})
	}
	field := func(name string, u event.Use) (nonEmpty bool) {
		given, nonEmpty := has(name)
		switch {
		case u == event.Forbidden && given:
			fail(name, "is not allowed with op = %q")
		case u == event.Required && !given:
			fail(name, "is required with op = %q")
		case u == event.Required && !nonEmpty:
			fail(name, "must not be empty with op = %q")
		}
		return nonEmpty
	}
	field("table", op.Table)
	key := field("key", op.Key)
	field("sql", op.SQL)
	field("args", min(op.SQL, event.Optional))
	field("message", op.Message)
	missing := event.Forbidden
	if op.MayMiss {
		missing = event.Optional
	}
	field("if_missing", missing)
	if op.Write != event.Required {
		set, inc := field("set", op.Write), field("inc", op.Write)
		if op.AnyColumn && !key && !set && !inc {
			fail("key", "key, set or inc must name at least one column with op = %q")
		}
		return ps
	}
	_, set := has("set")
	incGiven, inc := has("inc")
	if !set && !inc {
		name := "set"
		if setGiven, _ := has("set"); !setGiven && incGiven {
			name = "inc"
		}
		fail(name, "set or inc must name at least one column with op = %q")
	}
	return ps
}

// CheckOverlap reports a column named in more than one of key, set and
// inc: the statement would assign it twice.
func CheckOverlap(rs RuleSpec) []FieldProblem {
	groups := []struct {
		name string
		cols map[string]string
	}{{"key", rs.Key}, {"set", rs.Set}, {"inc", rs.Inc}}
	var ps []FieldProblem
	for i, g := range groups {
		for _, col := range slices.Sorted(maps.Keys(g.cols)) {
			for _, earlier := range groups[:i] {
				if _, dup := earlier.cols[col]; dup {
					ps = append(ps, FieldProblem{Field: g.name, Column: col, Msg: fmt.Sprintf("column %q is already in %s", col, earlier.name)})
					break
				}
			}
		}
	}
	return ps
}

// quoteList renders allowed values for a message: "a", "b" or "c".
func quoteList(vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = strconv.Quote(v)
	}
	if len(q) < 2 {
		return strings.Join(q, "")
	}
	return strings.Join(q[:len(q)-1], ", ") + " or " + q[len(q)-1]
}
