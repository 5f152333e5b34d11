package config

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// projectionNameRE keeps projection names valid inside replication slot
// names, which allow only lower-case letters, digits and underscores.
var projectionNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)

// schemaNameRE keeps a version's schema and serve names plain lower-case
// identifiers: they are quoted in SQL anyway, but a name that needs quotes
// would surprise readers writing unquoted queries against the served views,
// and a dot would read as a qualified table.
var schemaNameRE = regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)

const schemaNameRule = "must start with a lower-case letter or underscore and contain only lower-case letters, digits and underscores"

type projectionID struct {
	name    string
	version int64
}

// projections decodes [[projection]]; slotPrefix is the final
// source.slot_prefix, needed to check slot name lengths.
//
// Without withRules (LoadSettings) the rules are not read: each Spec has
// its identity and deployment keys (schema, serve, ddl,
// start_after_position) and no Rules.
func (d *decoder) projections(root *table, slotPrefix string, withRules bool) []rules.Spec {
	v, p, ok := root.get("projection")
	if !ok {
		return nil
	}
	elems, ok := tableArray(v)
	if !ok {
		d.fail(p, "must be an array of tables ([[projection]]), not %s", typeName(v))
		return nil
	}
	specs := make([]rules.Spec, 0, len(elems))
	first := map[projectionID]keyPath{}
	schemas := map[string]keyPath{} // version schema → where first set
	for i, e := range elems {
		pp := p.index(i)
		if _, ok := e.(map[string]any); !ok {
			d.fail(pp, "must be a table, not %s", typeName(e))
			continue
		}
		spec := d.projection(d.table(pp, e), slotPrefix, withRules)
		if spec.Name == "" || spec.Version < 1 {
			continue // already reported
		}
		if spec.Schema != "" {
			// Two versions writing one schema's tables would be one
			// version's read model built twice.
			if prev, dup := schemas[spec.Schema]; dup {
				d.fail(pp.key("schema"), "schema %q is already the schema of the projection at line %d: each version needs its own",
					spec.Schema, d.lines.line(prev))
			} else {
				schemas[spec.Schema] = pp.key("schema")
			}
		}
		id := projectionID{spec.Name, spec.Version}
		if prev, dup := first[id]; dup {
			d.fail(pp.key("name"), "duplicate projection %q version %d (first defined at line %d)",
				spec.Name, spec.Version, d.lines.line(prev))
			continue
		}
		first[id] = pp
		specs = append(specs, spec)
	}
	return specs
}

func (d *decoder) projection(t *table, slotPrefix string, withRules bool) rules.Spec {
	s := rules.Spec{OnError: rules.OnErrorDeadLetter}
	if !t.matching("name", &s.Name, projectionNameRE,
		"must start with a lower-case letter and contain only lower-case letters, digits and underscores (it becomes part of a replication slot name)") &&
		!t.has("name") {
		d.fail(t.path.key("name"), "is required")
	}

	var version int64
	if t.integer("version", &version) {
		if version >= 1 {
			s.Version = version
		} else {
			d.fail(t.path.key("version"), "must be at least 1, not %d", version)
		}
	} else if !t.has("version") {
		d.fail(t.path.key("version"), "is required")
	}

	if s.Name != "" && s.Version >= 1 {
		if slot := slotName(slotPrefix, s.Name, s.Version); len(slot) > maxIdentLen {
			d.fail(t.path.key("name"), "makes replication slot name %q, %d bytes; PostgreSQL allows %d",
				slot, len(slot), maxIdentLen)
		}
	}

	t.oneOf("on_error", &s.OnError, rules.OnErrorValues...)
	if t.matching("group", &s.Group, projectionNameRE,
		"must start with a lower-case letter and contain only lower-case letters, digits and underscores (it becomes part of a replication slot name)") {
		if slot := groupSlotName(slotPrefix, s.Group); len(slot) > maxIdentLen {
			d.fail(t.path.key("group"), "makes replication slot name %q, %d bytes; PostgreSQL allows %d",
				slot, len(slot), maxIdentLen)
		}
	}
	d.deployment(t, &s)

	v, rp, ok := t.get("rule")
	if !withRules {
		t.done()
		return s
	}
	elems, isArray := tableArray(v)
	switch {
	case !ok:
		d.fail(rp, "at least one [[projection.rule]] is required")
	case !isArray:
		d.fail(rp, "must be an array of tables ([[projection.rule]]), not %s", typeName(v))
	case len(elems) == 0:
		d.fail(rp, "at least one [[projection.rule]] is required")
	}
	named := map[string]keyPath{}
	for i, e := range elems {
		if _, ok := e.(map[string]any); !ok {
			d.fail(rp.index(i), "must be a table, not %s", typeName(e))
			continue
		}
		r := d.rule(d.table(rp.index(i), e))
		if r.Name != "" {
			if prev, dup := named[r.Name]; dup {
				d.fail(rp.index(i).key("name"), "duplicate rule name %q (first used at line %d)", r.Name, d.lines.line(prev))
			} else {
				named[r.Name] = rp.index(i).key("name")
			}
		}
		s.Rules = append(s.Rules, r)
	}
	t.done()
	return s
}

// deployment decodes the keys that place a version beside others: schema,
// serve, ddl and start_after_position.
func (d *decoder) deployment(t *table, s *rules.Spec) {
	for _, k := range []struct {
		key string
		dst *string
	}{{"schema", &s.Schema}, {"serve", &s.Serve}} {
		if t.matching(k.key, k.dst, schemaNameRE, schemaNameRule) && len(*k.dst) > maxIdentLen {
			d.fail(t.path.key(k.key), "must be at most %d bytes", maxIdentLen)
			*k.dst = ""
		}
	}
	// pgscribe never guesses a schema: serving or running DDL for a
	// version whose tables have no schema of their own would mean writing
	// over whatever the search_path finds.
	if s.Serve != "" {
		switch {
		case s.Schema == "" && !d.failedUnder(t.path.key("schema")):
			d.fail(t.path.key("serve"), "needs schema: promote points %s.<table> at views of this version's schema", s.Serve)
		case s.Serve == s.Schema:
			d.fail(t.path.key("serve"), "must differ from schema %q: the stable names are views over this version's tables", s.Schema)
		}
	}
	var ddl string
	if t.name("ddl", &ddl) {
		if s.Schema == "" && !d.failedUnder(t.path.key("schema")) {
			d.fail(t.path.key("ddl"), "needs schema: migrate runs the file with search_path set to this version's schema")
		}
		if !filepath.IsAbs(ddl) {
			ddl = filepath.Join(filepath.Dir(d.file), ddl)
		}
		if fi, err := os.Stat(ddl); err != nil {
			d.fail(t.path.key("ddl"), "cannot read %s: %v", ddl, errors.Unwrap(err))
		} else if fi.IsDir() {
			d.fail(t.path.key("ddl"), "%s is a directory, not a SQL file", ddl)
		}
		s.DDL = ddl
	}
	var after int64
	if t.integer("start_after_position", &after) {
		if after < 1 {
			d.fail(t.path.key("start_after_position"), "must be at least 1 (the last position the replaced projector applied), not %d", after)
		} else {
			s.StartAfterPosition = after
		}
	}
}

func (d *decoder) rule(t *table) rules.RuleSpec {
	var r rules.RuleSpec
	t.name("name", &r.Name)
	r.On = d.on(t)
	t.name("when", &r.When)
	ops := event.OpNames()
	opSet := t.oneOf("op", &r.Op, ops...)
	if !opSet && !t.has("op") {
		d.fail(t.path.key("op"), "is required (one of %s)", strings.Join(ops, ", "))
	}
	t.name("table", &r.Table)
	r.Key = d.columns(t, "key")
	r.Set = d.columns(t, "set")
	r.Inc = d.columns(t, "inc")
	t.name("sql", &r.SQL)
	r.Args = d.args(t)
	t.name("message", &r.Message)
	t.oneOf("if_missing", &r.IfMissing, rules.IfMissingValues...)
	t.done()

	if op, ok := event.Op(r.Op).Spec(); opSet && ok {
		decoded := rules.SpecPresence(r)
		d.report(t, rules.CheckFields(op, func(field string) (bool, bool) {
			// A value already reported as bad is not empty as well.
			_, nonEmpty := decoded(field)
			return t.has(field), nonEmpty || d.failedUnder(t.path.key(field))
		}))
	}
	d.report(t, rules.CheckOverlap(r))
	return r
}

// on decodes `on`: one event type or a list of them. A list is returned as
// []any of strings, the form toml gives for an `any` field.
func (d *decoder) on(t *table) any {
	v, p, ok := t.get("on")
	if !ok {
		return nil
	}
	switch on := v.(type) {
	case string:
		if on == "" {
			d.fail(p, "must not be empty (omit on to match every event type)")
			return nil
		}
		return on
	case []any:
		if len(on) == 0 {
			d.fail(p, "must list at least one event type (omit on to match every event type)")
			return nil
		}
		for i, e := range on {
			if s, ok := e.(string); !ok || s == "" {
				d.fail(p.index(i), "must be a non-empty event type string")
				return nil
			}
		}
		return on
	default:
		d.fail(p, "must be an event type or a list of event types, not %s", typeName(v))
		return nil
	}
}

// columns decodes a key, set or inc table: column name → expression.
func (d *decoder) columns(t *table, key string) map[string]string {
	v, p, ok := t.get(key)
	if !ok {
		return nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		d.fail(p, "must be a table of column = expression, not %s", typeName(v))
		return nil
	}
	cols := make(map[string]string, len(m))
	for _, col := range sortedKeys(m) {
		cp := p.key(col)
		expr, ok := m[col].(string)
		switch {
		case col == "":
			d.fail(cp, "column name must not be empty")
		case !ok:
			d.fail(cp, "must be an expression string, not %s", typeName(m[col]))
		case strings.TrimSpace(expr) == "":
			d.fail(cp, "expression must not be empty")
		default:
			cols[col] = expr
		}
	}
	return cols
}

func (d *decoder) args(t *table) []string {
	v, p, ok := t.get("args")
	if !ok {
		return nil
	}
	list, ok := v.([]any)
	if !ok {
		d.fail(p, "must be a list of expression strings, not %s", typeName(v))
		return nil
	}
	args := make([]string, 0, len(list))
	for i, e := range list {
		s, ok := e.(string)
		switch {
		case !ok:
			d.fail(p.index(i), "must be an expression string, not %s", typeName(e))
		case strings.TrimSpace(s) == "":
			d.fail(p.index(i), "expression must not be empty")
		default:
			args = append(args, s)
		}
	}
	return args
}

// report adds the problems the rules package found in a rule's fields.
func (d *decoder) report(t *table, ps []rules.FieldProblem) {
	for _, p := range ps {
		kp := t.path.key(p.Field)
		if p.Column != "" {
			kp = kp.key(p.Column)
		}
		d.fail(kp, "%s", p.Msg)
	}
}

// tableArray accepts both [[x]] arrays of tables and inline arrays; the
// elements are checked to be tables when decoded.
func tableArray(v any) ([]any, bool) {
	switch a := v.(type) {
	case []map[string]any:
		out := make([]any, len(a))
		for i, m := range a {
			out[i] = m
		}
		return out, true
	case []any:
		return a, true
	default:
		return nil, false
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
