package config

import (
	"cmp"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/pgscribe/pgscribe/rules"
)

// Error is one problem in the configuration file. Line is 1-based; it is 0
// only when no line of the file relates to the problem (for example a
// required key whose table is absent altogether). Key is the dotted key at
// fault, with array elements indexed: projection[0].rule[2].op.
type Error struct {
	File string
	Line int
	Key  string
	Msg  string
	// Where is Key as a user names it: a projection by name and version, a
	// rule by its name (or its default name), then the rest of the key:
	// projection "bank" v1, rule "open-index": set. Empty outside
	// [[projection]] or when the projection has no usable name.
	Where string

	err error // underlying cause, if any (I/O or TOML parse error)
}

// Error formats the problem as file:line: key: msg, leaving out the parts
// that are unknown; Where, when set, stands for the key.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		if e.File != "" {
			b.WriteByte(':')
		} else {
			b.WriteString("line ")
		}
		b.WriteString(strconv.Itoa(e.Line))
	}
	if key := cmp.Or(e.Where, e.Key); key != "" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(key)
	}
	if b.Len() > 0 {
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns the cause: the os error of an unreadable file or the
// toml.ParseError of a syntax error; nil otherwise.
func (e *Error) Unwrap() error { return e.err }

// Errors is every problem Load found, sorted by line. errors.As(err,
// &target) with target a *Error yields the first; range over an Errors
// (errors.As with an Errors target) for all of them.
type Errors []*Error

// Error lists the problems one per line.
func (es Errors) Error() string {
	msgs := make([]string, len(es))
	for i, e := range es {
		msgs[i] = e.Error()
	}
	return strings.Join(msgs, "\n")
}

// Unwrap exposes the individual problems to errors.Is and errors.As.
func (es Errors) Unwrap() []error {
	errs := make([]error, len(es))
	for i, e := range es {
		errs[i] = e
	}
	return errs
}

// sort orders the problems by line, keeping the order in which they were
// found among problems of one line.
func (es Errors) sort() {
	slices.SortStableFunc(es, func(a, b *Error) int { return cmp.Compare(a.Line, b.Line) })
}

// projectionKeyRE splits a key under [[projection]]: element, rule element
// and the rest.
var projectionKeyRE = regexp.MustCompile(`^projection\[(\d+)\](?:\.rule\[(\d+)\])?(?:\.(.+))?$`)

// nameRules sets Where on the problems under [[projection]], naming the
// projection and rule as the user wrote them (raw is the decoded file). A
// projection without a usable name and version keeps its indexed key.
func nameRules(es Errors, raw map[string]any) {
	elems, _ := tableArray(raw["projection"])
	for _, e := range es {
		m := projectionKeyRE.FindStringSubmatch(e.Key)
		if m == nil {
			continue
		}
		pi, _ := strconv.Atoi(m[1])
		if pi >= len(elems) {
			continue
		}
		proj, _ := elems[pi].(map[string]any)
		name, _ := proj["name"].(string)
		version, ok := proj["version"].(int64)
		if name == "" || !ok {
			continue
		}
		where := fmt.Sprintf("projection %q v%d", name, version)
		if m[2] != "" {
			ri, _ := strconv.Atoi(m[2])
			rs, _ := tableArray(proj["rule"])
			if ri >= len(rs) {
				continue
			}
			r, _ := rs[ri].(map[string]any)
			spec := rules.RuleSpec{On: r["on"]}
			spec.Name, _ = r["name"].(string)
			where += fmt.Sprintf(", rule %q", rules.RuleName(ri, spec))
		}
		if m[3] != "" {
			where += ": " + m[3]
		}
		e.Where = where
	}
}
