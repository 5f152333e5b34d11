package rules

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/expr-lang/expr/file"
)

// Sentinel causes of evaluation errors, for errors.Is.
var (
	// ErrNilValue: a key, set, inc or args value, or a when result, is nil —
	// usually a field missing from the event's data or metadata.
	ErrNilValue = errors.New("value is nil (missing field?)")
	// ErrWrongType: a value has a type its place does not accept (a when
	// that is not boolean, an inc that is not a number, a function value).
	ErrWrongType = errors.New("wrong type")
)

// CompileError is one error found by Compile: a syntax or type error in an
// expression, or an invalid rule field. Line and Column are 1-based
// positions within Expr; for an error about the expression's result type
// they point at its start, and they are 0 when the error is not about an
// expression (an unknown op, a missing table). Compile joins all of a
// spec's CompileErrors with errors.Join; find them with errors.As.
type CompileError struct {
	Projection string
	Version    int64
	Rule       string // rule name after defaulting; "" for projection-level errors
	Field      string // "when", "key.<col>", "set.<col>", "inc.<col>", "args[N]", "message", "op", …
	Expr       string // the expression text, if the error is in one
	Line       int
	Column     int
	Err        error
}

// Error names projection, rule, field and position, for example
// `projection "balances" v1, rule "open", set.balance: column 6: unknown
// name foo; expression "data.x + foo"`.
func (e *CompileError) Error() string {
	var b strings.Builder
	writeWhere(&b, e.Projection, e.Version, e.Rule, e.Field)
	writePosition(&b, e.Line, e.Column)
	b.WriteString(causeText(e.Err))
	if e.Expr != "" {
		b.WriteString("; expression ")
		b.WriteString(strconv.Quote(e.Expr))
	}
	return b.String()
}

// Unwrap returns the cause: often an *file.Error from expr.
func (e *CompileError) Unwrap() error { return e.Err }

// EvalError is an event that a rule could not turn into intents: an
// expression failed, a value was missing or of the wrong type, or a `fail`
// rule matched (Fail is then true and Err carries the rule's message). The
// engine dead-letters the event with error_kind Kind().
type EvalError struct {
	Projection string
	Version    int64
	Rule       string
	Field      string // as in CompileError; "" for a fail rule's verdict
	EventID    string
	Position   int64
	Err        error
	Fail       bool // true when a matching op = "fail" rule rejected the event
}

// Error names projection, rule, field and event, then the cause.
func (e *EvalError) Error() string {
	var b strings.Builder
	writeWhere(&b, e.Projection, e.Version, e.Rule, e.Field)
	fmt.Fprintf(&b, "event %s at position %d: ", e.EventID, e.Position)
	if e.Fail {
		b.WriteString("rejected: ")
	}
	if line, col := errorPosition(e.Err); col > 0 {
		writePosition(&b, line, col)
	}
	b.WriteString(causeText(e.Err))
	return b.String()
}

// Unwrap returns the cause.
func (e *EvalError) Unwrap() error { return e.Err }

// Kind is the dead-letter error_kind: "rule:" followed by the rule name.
func (e *EvalError) Kind() string { return "rule:" + e.Rule }

// Message is the dead-letter error_message: a fail rule's own message, or
// the field and cause of an evaluation error ("set.balance: …"). Projection,
// rule and event are columns of the dead-letter row already.
func (e *EvalError) Message() string {
	if e.Fail {
		return causeText(e.Err)
	}
	var b strings.Builder
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	if line, col := errorPosition(e.Err); col > 0 {
		writePosition(&b, line, col)
	}
	b.WriteString(causeText(e.Err))
	return b.String()
}

func writeWhere(b *strings.Builder, projection string, version int64, rule, field string) {
	fmt.Fprintf(b, "projection %q v%d, ", projection, version)
	if rule != "" {
		fmt.Fprintf(b, "rule %q, ", rule)
	}
	if field != "" {
		b.WriteString(field)
		b.WriteString(": ")
	}
}

func writePosition(b *strings.Builder, line, col int) {
	switch {
	case line > 1:
		fmt.Fprintf(b, "line %d, column %d: ", line, col)
	case col > 0:
		fmt.Fprintf(b, "column %d: ", col)
	}
}

// errorPosition returns the 1-based line and column of an expr error, or
// zeros when err carries no position.
func errorPosition(err error) (line, col int) {
	var fe *file.Error
	if !errors.As(err, &fe) {
		return 0, 0
	}
	return fe.Line, fe.Column + 1 // expr's Column is 0-based
}

// causeText is the cause without expr's multi-line source snippet, which
// the position and the quoted expression replace.
func causeText(err error) string {
	var fe *file.Error
	if errors.As(err, &fe) {
		return fe.Message
	}
	if err == nil {
		return "unknown error"
	}
	return err.Error()
}
