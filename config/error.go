package config

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
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

	err error // underlying cause, if any (I/O or TOML parse error)
}

// Error formats the problem as file:line: key: msg, leaving out the parts
// that are unknown.
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
	if e.Key != "" {
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(e.Key)
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
