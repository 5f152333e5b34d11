package rules

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/expr-lang/expr"
	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/vm"

	"github.com/pgscribe/pgscribe/event"
)

// expr's integer arithmetic is done in Go int; exact int64 results need a
// 64-bit int. This constant does not compile where int is narrower.
const _ = uint64(math.MaxInt - math.MaxInt64)

// Program is a projection's compiled rules. It is immutable and safe for
// concurrent use by several goroutines.
type Program struct {
	name    string
	version int64
	onError string
	rules   []*rule
	// byType lists, for every type named in some rule's `on`, the rules that
	// match it in rule order; any other type matches anyRules.
	byType   map[string][]*rule
	anyRules []*rule
	// Which JSON documents the rules of a type read: an event is decoded
	// only as far as its rules need (and not at all if none matches).
	usesByType map[string]uses
	anyUses    uses
	vms        sync.Pool // of *vm.VM
}

type rule struct {
	name    string
	index   int // place in the projection, 0-based
	op      event.Op
	kind    event.Kind
	table   string
	when    *expression // nil: always
	key     []column    // sorted by name
	set     []column
	inc     []column
	sql     string
	args    []expression
	message *expression // op = fail

	deadLetterIfMissing bool
}

type column struct {
	name string
	expr expression
}

// expression is one compiled expression and the rule field it came from.
type expression struct {
	field string
	prog  *vm.Program
}

// Target is what a data rule writes, for `pgscribe check` and the SQL
// layer. Column lists are sorted by name, as in the intents.
type Target struct {
	Rule       string
	Op         event.Op
	Table      string
	KeyColumns []string
	SetColumns []string
	IncColumns []string
}

// Name is the projection name.
func (p *Program) Name() string { return p.name }

// Version is the projection version.
func (p *Program) Version() int64 { return p.version }

// OnError is the projection's policy for rule errors: OnErrorDeadLetter
// (the default), OnErrorHalt or OnErrorPark.
func (p *Program) OnError() string { return p.onError }

// Targets returns one Target per insert, upsert, update or delete rule, in
// rule order. The caller owns the returned slices.
func (p *Program) Targets() []Target {
	var ts []Target
	for _, r := range p.rules {
		if r.kind != event.KindRow {
			continue
		}
		ts = append(ts, Target{
			Rule:       r.name,
			Op:         r.op,
			Table:      r.table,
			KeyColumns: columnNames(r.key),
			SetColumns: columnNames(r.set),
			IncColumns: columnNames(r.inc),
		})
	}
	return ts
}

func columnNames(cs []column) []string {
	if len(cs) == 0 {
		return nil
	}
	names := make([]string, len(cs))
	for i, c := range cs {
		names[i] = c.name
	}
	return names
}

// exprEnv declares the names and static types of the expression
// environment; Eval supplies values of the same types.
var exprEnv = map[string]any{
	"id":              "",
	"type":            "",
	"stream_id":       "",
	"stream_position": 0,
	"position":        0,
	"occurred_at":     time.Time{},
	"data":            map[string]any(nil),
	"metadata":        map[string]any(nil),
}

// Compile validates spec and compiles every expression in it once. It
// returns all errors found, joined; each is a *CompileError. See the package
// documentation for the environment and default rule names.
func Compile(spec Spec) (*Program, error) {
	c := compiler{spec: spec, opts: []expr.Option{
		expr.Env(exprEnv),
		expr.DisableBuiltin("now"), // rules are pure functions of the event
		expr.Timezone("UTC"),       // date() must not depend on the host
	}}
	p := &Program{
		name:    spec.Name,
		version: spec.Version,
		onError: spec.OnError,
		vms:     sync.Pool{New: func() any { return new(vm.VM) }},
	}
	if spec.Name == "" {
		c.fail("", "name", fmt.Errorf("projection name is required"))
	}
	if spec.Version < 0 {
		c.fail("", "version", fmt.Errorf("version must not be negative, got %d", spec.Version))
	}
	switch {
	case spec.OnError == "":
		p.onError = OnErrorDeadLetter
	case !slices.Contains(OnErrorValues, spec.OnError):
		c.fail("", "on_error", fmt.Errorf("must be %s, got %q", quoteList(OnErrorValues), spec.OnError))
	}
	if len(spec.Rules) == 0 {
		c.fail("", "rule", fmt.Errorf("projection has no rules"))
	}

	seen := make(map[string]int, len(spec.Rules))
	ons := make([][]string, len(spec.Rules))
	for i, rs := range spec.Rules {
		on, onErr := parseOn(rs.On)
		name := RuleName(i, rs)
		if onErr != nil {
			c.fail(name, "on", onErr)
		}
		if prev, dup := seen[name]; dup {
			c.fail(name, "name", fmt.Errorf("rule name already used by rule %d", prev))
		}
		seen[name] = i + 1
		ons[i] = on
		r := c.rule(name, rs)
		r.index = i
		p.rules = append(p.rules, r)
	}
	if err := errors.Join(c.errs...); err != nil {
		return nil, err
	}
	p.index(ons)
	return p, nil
}

// index builds the type → rules lookup so Eval does not scan every rule.
func (p *Program) index(ons [][]string) {
	p.byType = make(map[string][]*rule)
	for _, on := range ons {
		for _, t := range on {
			p.byType[t] = nil
		}
	}
	for t := range p.byType {
		var rs []*rule
		for i, r := range p.rules {
			if len(ons[i]) == 0 || slices.Contains(ons[i], t) {
				rs = append(rs, r)
			}
		}
		p.byType[t] = rs
	}
	for i, r := range p.rules {
		if len(ons[i]) == 0 {
			p.anyRules = append(p.anyRules, r)
		}
	}
	p.usesByType = make(map[string]uses, len(p.byType))
	for t, rs := range p.byType {
		p.usesByType[t] = usesOf(rs)
	}
	p.anyUses = usesOf(p.anyRules)
}

// Uses is what the rules that match events of type typ read of an
// event's two JSON documents (Eval decodes that much, unless the event's
// documents are decoded already).
func (p *Program) Uses(typ string) (data, metadata event.Want) {
	u, ok := p.usesByType[typ]
	if !ok {
		if len(p.anyRules) == 0 {
			return event.Want{}, event.Want{}
		}
		u = p.anyUses
	}
	return u.data, u.metadata
}

// uses is what expressions read of an event's two JSON documents.
type uses struct{ data, metadata event.Want }

// usesOf merges what the rules' expressions read: a document read whole
// by one is decoded whole, else the union of the keys they read.
func usesOf(rs []*rule) uses {
	v := newUsesVisitor()
	for _, r := range rs {
		for _, e := range r.expressions() {
			node := e.prog.Node()
			ast.Walk(&node, v)
		}
	}
	return uses{data: v.want("data"), metadata: v.want("metadata")}
}

// expressions lists every expression of the rule.
func (r *rule) expressions() []*expression {
	var exprs []*expression
	if r.when != nil {
		exprs = append(exprs, r.when)
	}
	if r.message != nil {
		exprs = append(exprs, r.message)
	}
	for _, cols := range [][]column{r.key, r.set, r.inc} {
		for i := range cols {
			exprs = append(exprs, &cols[i].expr)
		}
	}
	for i := range r.args {
		exprs = append(exprs, &r.args[i])
	}
	return exprs
}

// usesVisitor finds, for the documents data and metadata, which top-level
// keys expressions read: an identifier whose every use is a member access
// by a constant name (data.amount, data["amount"], data?.amount, and
// deeper paths below them) needs only those keys; any other use (data
// passed whole, data[expr], "k" in data, $env) needs the whole document.
type usesVisitor struct {
	keys  map[string]map[string]bool              // document → keys read
	whole map[string]bool                         // document → read whole
	ids   map[string]map[*ast.IdentifierNode]bool // document → its identifiers, true once covered by a member access
}

func newUsesVisitor() *usesVisitor {
	return &usesVisitor{keys: map[string]map[string]bool{}, whole: map[string]bool{},
		ids: map[string]map[*ast.IdentifierNode]bool{}}
}

func isDocument(name string) bool { return name == "data" || name == "metadata" }

// Visit sees children before their parent (ast.Walk is post-order).
func (v *usesVisitor) Visit(node *ast.Node) {
	switch n := (*node).(type) {
	case *ast.IdentifierNode:
		if n.Value == "$env" {
			v.whole["data"], v.whole["metadata"] = true, true
		} else if isDocument(n.Value) {
			if v.ids[n.Value] == nil {
				v.ids[n.Value] = map[*ast.IdentifierNode]bool{}
			}
			v.ids[n.Value][n] = false
		}
	case *ast.MemberNode:
		id, ok := n.Node.(*ast.IdentifierNode)
		if !ok || !isDocument(id.Value) || n.Method {
			return
		}
		key, ok := n.Property.(*ast.StringNode)
		if !ok {
			return // data[expr]: the identifier stays uncovered
		}
		if v.keys[id.Value] == nil {
			v.keys[id.Value] = map[string]bool{}
		}
		v.keys[id.Value][key.Value] = true
		v.ids[id.Value][id] = true
	}
}

func (v *usesVisitor) want(doc string) event.Want {
	if v.whole[doc] {
		return event.All
	}
	for _, covered := range v.ids[doc] {
		if !covered {
			return event.All
		}
	}
	keys := make([]string, 0, len(v.keys[doc]))
	for k := range v.keys[doc] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return event.Want{Keys: keys}
}

// parseOn accepts a type, a list of types, or nil (all types).
func parseOn(on any) ([]string, error) {
	var types []string
	switch v := on.(type) {
	case nil:
		return nil, nil
	case string:
		types = []string{v}
	case []string:
		types = v
	case []any:
		for _, e := range v {
			s, ok := e.(string)
			if !ok {
				return nil, fmt.Errorf("event types must be strings, got %T", e)
			}
			types = append(types, s)
		}
	default:
		return nil, fmt.Errorf("must be an event type or a list of event types, got %T", on)
	}
	if len(types) == 0 {
		return nil, fmt.Errorf("empty list matches no event; omit on to match all")
	}
	if slices.Contains(types, "") {
		return nil, fmt.Errorf("empty event type")
	}
	return slices.Clone(types), nil
}

// compiler accumulates the errors of one Compile call.
type compiler struct {
	spec Spec
	opts []expr.Option
	errs []error
}

func (c *compiler) fail(rule, field string, err error) {
	c.errs = append(c.errs, &CompileError{
		Projection: c.spec.Name, Version: c.spec.Version,
		Rule: rule, Field: field, Err: err,
	})
}

func (c *compiler) rule(name string, rs RuleSpec) *rule {
	r := &rule{name: name, op: event.Op(rs.Op), table: c.spec.Qualify(rs.Table), sql: rs.SQL,
		deadLetterIfMissing: rs.IfMissing == IfMissingDeadLetter}
	if op, ok := r.op.Spec(); ok {
		r.kind = op.Kind
		for _, p := range CheckFields(op, SpecPresence(rs)) {
			c.fail(name, p.Field, errors.New(p.Msg))
		}
	} else {
		c.fail(name, "op", fmt.Errorf("must be one of %s, got %q", strings.Join(event.OpNames(), ", "), rs.Op))
	}
	if rs.IfMissing != "" && !slices.Contains(IfMissingValues, rs.IfMissing) {
		c.fail(name, "if_missing", fmt.Errorf("must be %s, got %q", quoteList(IfMissingValues), rs.IfMissing))
	}
	for _, p := range CheckOverlap(rs) {
		c.fail(name, p.Field+"."+p.Column, errors.New(p.Msg))
	}

	if rs.When != "" {
		r.when = c.expression(name, "when", rs.When, reflect.Bool)
	}
	r.key = c.columns(name, "key", rs.Key, reflect.Invalid)
	r.set = c.columns(name, "set", rs.Set, reflect.Invalid)
	r.inc = c.columns(name, "inc", rs.Inc, reflect.Float64)
	for i, a := range rs.Args {
		// args[N] is bound to $N.
		if e := c.expression(name, "args["+strconv.Itoa(i+1)+"]", a, reflect.Invalid); e != nil {
			r.args = append(r.args, *e)
		}
	}
	if rs.Message != "" {
		r.message = c.expression(name, "message", rs.Message, reflect.String)
	}
	return r
}

// columns compiles a key/set/inc table into columns sorted by name.
func (c *compiler) columns(rule, group string, m map[string]string, want reflect.Kind) []column {
	if len(m) == 0 {
		return nil
	}
	names := make([]string, 0, len(m))
	for n := range m {
		names = append(names, n)
	}
	sort.Strings(names)
	cols := make([]column, 0, len(m))
	for _, n := range names {
		field := group + "." + n
		if n == "" {
			c.fail(rule, field, fmt.Errorf("empty column name"))
			continue
		}
		if e := c.expression(rule, field, m[n], want); e != nil {
			cols = append(cols, column{name: n, expr: *e})
		}
	}
	return cols
}

// expression compiles src. want is the result kind the field requires
// (reflect.Bool, reflect.String, reflect.Float64 meaning any number, or
// reflect.Invalid for any); a statically known result of another type is a
// compile error, an unknown one (data.x) is checked by Eval.
func (c *compiler) expression(rule, field, src string, want reflect.Kind) *expression {
	fail := func(err error, line, col int) *expression {
		c.errs = append(c.errs, &CompileError{
			Projection: c.spec.Name, Version: c.spec.Version,
			Rule: rule, Field: field, Expr: src, Line: line, Column: col, Err: err,
		})
		return nil
	}
	// expr.AsBool is deliberately not used for `when`: its cast turns nil
	// (a missing field) into false, which would silently skip events.
	prog, err := expr.Compile(src, c.opts...)
	if err != nil {
		line, col := errorPosition(err)
		return fail(err, line, col)
	}
	if t := prog.Node().Type(); t != nil && t.Kind() != reflect.Interface && !typeFits(t, want) {
		return fail(fmt.Errorf("%w: must be %s, got %s", ErrWrongType, kindName(want), t), 1, 1)
	}
	return &expression{field: field, prog: prog}
}

var durationType = reflect.TypeFor[time.Duration]()

func typeFits(t reflect.Type, want reflect.Kind) bool {
	k := t.Kind()
	switch want {
	case reflect.Invalid:
		return k != reflect.Func && k != reflect.Chan && k != reflect.UnsafePointer
	case reflect.Float64:
		return isNumberKind(k) && t != durationType
	default:
		return k == want
	}
}

func isNumberKind(k reflect.Kind) bool {
	return (k >= reflect.Int && k <= reflect.Uint64) || k == reflect.Float32 || k == reflect.Float64
}

func kindName(want reflect.Kind) string {
	switch want {
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string (convert with string())"
	case reflect.Float64:
		return "a number"
	default:
		return "a value"
	}
}
