package rules

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/expr-lang/expr/vm"

	"github.com/pgscribe/pgscribe/event"
)

// Eval turns ev into write intents: one per matching data rule, in rule
// order. It returns (nil, nil) when no rule matches, and on any error no
// intents and an *EvalError (Fail set when an op = "fail" rule matched).
// Eval is safe for concurrent use; it does not modify ev.
func (p *Program) Eval(ev *event.Event) ([]event.Intent, error) {
	rs, ok := p.byType[ev.Type]
	u := p.usesByType[ev.Type]
	if !ok {
		rs, u = p.anyRules, p.anyUses
	}
	if len(rs) == 0 {
		return nil, nil
	}
	if err := ev.DecodeDocuments(u.data, u.metadata); err != nil {
		return nil, err
	}

	// One environment per event, shared by all its expressions; the value
	// types match exprEnv.
	env := map[string]any{
		"id":              ev.ID,
		"type":            ev.Type,
		"stream_id":       ev.StreamID,
		"stream_position": int(ev.StreamPosition),
		"position":        int(ev.Position),
		"occurred_at":     ev.OccurredAt,
		"data":            ev.Data,
		"metadata":        ev.Metadata,
	}
	m := p.vms.Get().(*vm.VM)
	defer p.vms.Put(m)

	var intents []event.Intent
	for _, r := range rs {
		in, matched, err := r.eval(m, env)
		if err != nil {
			err.Projection, err.Version = p.name, p.version
			err.Rule, err.EventID, err.Position = r.name, ev.ID, ev.Position
			return nil, err
		}
		if !matched {
			continue
		}
		if intents == nil {
			intents = make([]event.Intent, 0, len(rs))
		}
		intents = append(intents, in)
	}
	return intents, nil
}

// eval runs one rule. matched is false when its when is false. The
// returned error has only Field, Err and Fail set.
func (r *rule) eval(m *vm.VM, env map[string]any) (in event.Intent, matched bool, _ *EvalError) {
	if r.when != nil {
		v, err := m.Run(r.when.prog, env)
		if err != nil {
			return in, false, &EvalError{Field: r.when.field, Err: err}
		}
		b, ok := v.(bool)
		if !ok {
			return in, false, &EvalError{Field: r.when.field, Err: typeError(v, "a boolean")}
		}
		if !b {
			return in, false, nil
		}
	}

	switch r.kind {
	case event.KindReject:
		v, err := m.Run(r.message.prog, env)
		if err != nil {
			return in, true, &EvalError{Field: r.message.field, Err: err}
		}
		msg, ok := v.(string)
		if !ok {
			// Only reachable with an untyped result (data.reason); the rule
			// meant to reject, so keep its text whatever its type.
			msg = fmt.Sprint(v)
		}
		return in, true, &EvalError{Err: errors.New(msg), Fail: true}

	case event.KindStatement:
		in = event.Intent{Rule: r.name, RuleIndex: r.index, Op: r.op, SQL: r.sql}
		if len(r.args) > 0 {
			in.Args = make([]any, len(r.args))
			for i := range r.args {
				v, err := run(m, &r.args[i], env)
				if err != nil {
					return in, true, err
				}
				in.Args[i] = v
			}
		}
		return in, true, nil
	}

	in = event.Intent{Rule: r.name, RuleIndex: r.index, Op: r.op, Table: r.table, DeadLetterIfMissing: r.deadLetterIfMissing}
	// One backing array for all of the intent's columns.
	nk, ns := len(r.key), len(r.set)
	cols := make([]event.Column, nk+ns+len(r.inc))
	if err := evalColumns(m, r.key, cols[:nk], env, false); err != nil {
		return in, true, err
	}
	if err := evalColumns(m, r.set, cols[nk:nk+ns], env, false); err != nil {
		return in, true, err
	}
	if err := evalColumns(m, r.inc, cols[nk+ns:], env, true); err != nil {
		return in, true, err
	}
	if nk > 0 {
		in.Key = cols[:nk:nk]
	}
	if ns > 0 {
		in.Set = cols[nk : nk+ns : nk+ns]
	}
	if len(r.inc) > 0 {
		in.Inc = cols[nk+ns:]
	}
	return in, true, nil
}

// evalColumns fills dst with the values of cs; number requires int64 or
// float64 values (inc).
func evalColumns(m *vm.VM, cs []column, dst []event.Column, env map[string]any, number bool) *EvalError {
	for i := range cs {
		c := &cs[i]
		v, err := run(m, &c.expr, env)
		if err != nil {
			return err
		}
		if number {
			switch v.(type) {
			case int64, float64:
			default:
				return &EvalError{Field: c.expr.field, Err: typeError(v, "a number")}
			}
		}
		dst[i] = event.Column{Name: c.name, Value: v}
	}
	return nil
}

// run evaluates a value expression: nil is an error and the result is
// normalised to the types documented in the package comment.
func run(m *vm.VM, e *expression, env map[string]any) (any, *EvalError) {
	v, err := m.Run(e.prog, env)
	if err != nil {
		return nil, &EvalError{Field: e.field, Err: err}
	}
	v, err = normalize(v)
	if err != nil {
		return nil, &EvalError{Field: e.field, Err: err}
	}
	return v, nil
}

func typeError(v any, want string) error {
	if v == nil {
		return ErrNilValue
	}
	return fmt.Errorf("%w: must be %s, got %T", ErrWrongType, want, v)
}

// normalize maps an expression result to int64, float64, string, bool,
// time.Time, time.Duration, map[string]any or []any.
func normalize(v any) (any, error) {
	switch x := v.(type) {
	case nil:
		return nil, ErrNilValue
	case int64, float64, string, bool, time.Time, time.Duration, map[string]any, []any:
		return v, nil
	case int: // the common one, without reflect
		return int64(x), nil
	case int8, int16, int32:
		return reflect.ValueOf(x).Int(), nil
	case uint, uint8, uint16, uint32, uint64:
		return uintToInt64(reflect.ValueOf(x).Uint())
	case float32:
		return float64(x), nil
	}
	// Other maps and slices (split() yields []string): convert the top
	// level so the SQL layer sees one shape.
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		out := make([]any, rv.Len())
		for i := range out {
			out[i] = rv.Index(i).Interface()
		}
		return out, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		out := make(map[string]any, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			out[it.Key().String()] = it.Value().Interface()
		}
		return out, nil
	}
	return nil, fmt.Errorf("%w: unsupported result type %T", ErrWrongType, v)
}

func uintToInt64(u uint64) (any, error) {
	if u > math.MaxInt64 {
		return nil, fmt.Errorf("%w: %d overflows int64", ErrWrongType, u)
	}
	return int64(u), nil
}
