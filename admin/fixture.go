package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
)

// A Fixture is one rule test file: the events to run through a projection's
// rules and what each should produce, and optionally the rows the tables
// must hold afterwards (checked with -database).
type Fixture struct {
	Path       string
	Projection string
	Version    int64 // 0: the only version of Projection in the configuration
	Events     []FixtureEvent
	Tables     []FixtureTable
	line       int // of the projection key
}

// FixtureEvent is one [[event]] entry.
type FixtureEvent struct {
	Label string // name, else "event[i]"
	Line  int
	Event *event.Event

	// What the event must produce. Unset (Checked false): nothing is
	// expected of it; it only feeds the tables.
	Checked    bool
	Skip       bool
	Intents    []event.Intent // expected, in order; Rule "" matches any rule
	DeadLetter *ExpectedDeadLetter
}

// ExpectedDeadLetter is an event's expected dead letter. Kind is the
// error_kind ("rule:open", "commit:23505 (unique_violation)"); an empty
// Message or Contains is not compared.
type ExpectedDeadLetter struct {
	Kind     string
	Message  string
	Contains string
}

// FixtureTable is one [[table]] entry: the rows the table must hold after
// every event applied, as a multiset, compared on Columns only.
type FixtureTable struct {
	Name    string
	Columns []string
	Rows    []map[string]any
	Line    int
}

// FixtureError is a fixture that cannot be used: file, line and key of each
// problem, as configuration errors give them (exit 2).
type FixtureError struct{ Errs config.Errors }

func (e *FixtureError) Error() string { return e.Errs.Error() }

// Unwrap exposes the individual problems.
func (e *FixtureError) Unwrap() error { return e.Errs }

// fixtureStart is the occurred_at of a fixture's first event that gives
// none; each next one is a second later, so rules reading occurred_at see
// distinct, reproducible times.
var fixtureStart = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// ParseFixture reads and checks a fixture file. Problems are returned
// together as a *FixtureError; an unreadable file too.
func ParseFixture(path string) (*Fixture, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, &FixtureError{Errs: config.Errors{{File: path, Msg: "cannot read: " + unwrapPath(err)}}}
	}
	return parseFixture(path, string(src))
}

func unwrapPath(err error) string {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// fixtureDecoder collects every problem of a fixture with its line.
type fixtureDecoder struct {
	file  string
	lines config.Lines
	errs  config.Errors
}

func (d *fixtureDecoder) fail(path []string, format string, args ...any) {
	d.errs = append(d.errs, &config.Error{File: d.file, Line: d.lines.Line(path...), Key: keyString(path), Msg: fmt.Sprintf(format, args...)})
}

func keyString(path []string) string {
	s := ""
	for i, e := range path {
		if i > 0 && e[0] != '[' {
			s += "."
		}
		s += e
	}
	return s
}

func sub(path []string, e ...string) []string { return append(slices.Clip(path), e...) }

func index(i int) string { return "[" + strconv.Itoa(i) + "]" }

// known reports keys of m not in allowed.
func (d *fixtureDecoder) known(path []string, m map[string]any, allowed ...string) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if slices.Contains(allowed, k) {
			continue
		}
		if s := config.Suggest(k, allowed); s != "" {
			d.fail(sub(path, k), "unknown key (did you mean %q?)", s)
		} else {
			d.fail(sub(path, k), "unknown key (known: %s)", strings.Join(allowed, ", "))
		}
	}
}

func (d *fixtureDecoder) str(path []string, m map[string]any, key string, required bool) string {
	v, ok := m[key]
	if !ok {
		if required {
			d.fail(sub(path, key), "is required")
		}
		return ""
	}
	s, ok := v.(string)
	if !ok {
		d.fail(sub(path, key), "must be a string, not %T", v)
	}
	return s
}

func (d *fixtureDecoder) integer(path []string, m map[string]any, key string) (int64, bool) {
	v, ok := m[key]
	if !ok {
		return 0, false
	}
	n, ok := v.(int64)
	if !ok {
		d.fail(sub(path, key), "must be an integer, not %T", v)
	}
	return n, ok
}

func (d *fixtureDecoder) table(path []string, m map[string]any, key string) map[string]any {
	v, ok := m[key]
	if !ok {
		return nil
	}
	t, ok := v.(map[string]any)
	if !ok {
		d.fail(sub(path, key), "must be a table, not %T", v)
	}
	return t
}

func (d *fixtureDecoder) tables(path []string, m map[string]any, key string) []map[string]any {
	v, ok := m[key]
	if !ok {
		return nil
	}
	switch a := v.(type) {
	case []map[string]any:
		return a
	case []any:
		out := make([]map[string]any, 0, len(a))
		for i, e := range a {
			t, ok := e.(map[string]any)
			if !ok {
				d.fail(sub(path, key, index(i)), "must be a table, not %T", e)
				continue
			}
			out = append(out, t)
		}
		return out
	}
	d.fail(sub(path, key), "must be an array of tables, not %T", v)
	return nil
}

func parseFixture(file, src string) (*Fixture, error) {
	var raw map[string]any
	if _, err := toml.Decode(src, &raw); err != nil {
		e := &config.Error{File: file, Msg: err.Error()}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			e.Line, e.Key, e.Msg = pe.Position.Line, pe.LastKey, pe.Message
		}
		return nil, &FixtureError{Errs: config.Errors{e}}
	}
	d := &fixtureDecoder{file: file, lines: config.IndexLines(src)}
	f := &Fixture{Path: file}
	d.known(nil, raw, "projection", "version", "event", "table")
	f.Projection = d.str(nil, raw, "projection", true)
	f.line = d.lines.Line("projection")
	if v, ok := d.integer(nil, raw, "version"); ok {
		if v < 1 {
			d.fail([]string{"version"}, "must be at least 1")
		}
		f.Version = v
	}
	evs := d.tables(nil, raw, "event")
	if len(evs) == 0 && len(d.errs) == 0 {
		d.fail([]string{"event"}, "a fixture needs at least one [[event]]")
	}
	streamPos := map[string]int64{}
	for i, m := range evs {
		if fe, ok := d.event(i, m, streamPos); ok {
			f.Events = append(f.Events, fe)
		}
	}
	for i, m := range d.tables(nil, raw, "table") {
		if ft, ok := d.tableRows(i, m); ok {
			f.Tables = append(f.Tables, ft)
		}
	}
	if len(d.errs) > 0 {
		slices.SortStableFunc(d.errs, func(a, b *config.Error) int { return a.Line - b.Line })
		return nil, &FixtureError{Errs: d.errs}
	}
	return f, nil
}

func (d *fixtureDecoder) event(i int, m map[string]any, streamPos map[string]int64) (FixtureEvent, bool) {
	p := []string{"event", index(i)}
	n := len(d.errs)
	d.known(p, m, "name", "type", "stream", "stream_position", "position", "id", "occurred_at",
		"data", "metadata", "skip", "intent", "dead_letter")
	ev := &event.Event{
		Type:     d.str(p, m, "type", true),
		StreamID: d.str(p, m, "stream", true),
		Position: int64(i + 1),
		// A fixed, valid uuid per event: rules may write id to a uuid column.
		ID:         fmt.Sprintf("00000000-0000-4000-8000-%012d", i+1),
		OccurredAt: fixtureStart.Add(time.Duration(i) * time.Second),
	}
	fe := FixtureEvent{Label: d.str(p, m, "name", false), Line: d.lines.Line(p...), Event: ev}
	if fe.Label == "" {
		fe.Label = "event" + index(i)
	}
	if s, ok := m["id"]; ok {
		ev.ID, _ = s.(string)
		if ev.ID == "" {
			d.fail(sub(p, "id"), "must be a non-empty string")
		}
	}
	if v, ok := d.integer(p, m, "position"); ok {
		ev.Position = v
	}
	ev.StreamPosition = streamPos[ev.StreamID] + 1
	if v, ok := d.integer(p, m, "stream_position"); ok {
		ev.StreamPosition = v
	}
	streamPos[ev.StreamID] = ev.StreamPosition
	switch t := m["occurred_at"].(type) {
	case nil:
	case time.Time:
		ev.OccurredAt = t
	case string:
		ts, err := time.Parse(time.RFC3339Nano, t)
		if err != nil {
			d.fail(sub(p, "occurred_at"), "must be an RFC 3339 time: %v", err)
		}
		ev.OccurredAt = ts
	default:
		d.fail(sub(p, "occurred_at"), "must be a datetime, not %T", t)
	}
	for _, doc := range []struct {
		key string
		raw *[]byte
	}{{"data", &ev.RawData}, {"metadata", &ev.RawMetadata}} {
		t := d.table(p, m, doc.key)
		if t == nil {
			t = map[string]any{}
		}
		b, err := json.Marshal(t)
		if err != nil {
			d.fail(sub(p, doc.key), "cannot be JSON: %v", err)
		}
		*doc.raw = b
	}
	if v, ok := m["skip"]; ok {
		b, isBool := v.(bool)
		if !isBool {
			d.fail(sub(p, "skip"), "must be a boolean")
		}
		fe.Skip, fe.Checked = b, b
	}
	for j, im := range d.tables(p, m, "intent") {
		fe.Intents = append(fe.Intents, d.intent(sub(p, "intent", index(j)), im))
		fe.Checked = true
	}
	if dm := d.table(p, m, "dead_letter"); dm != nil {
		dp := sub(p, "dead_letter")
		d.known(dp, dm, "rule", "kind", "message", "message_contains")
		dl := &ExpectedDeadLetter{Message: d.str(dp, dm, "message", false), Contains: d.str(dp, dm, "message_contains", false)}
		rule, kind := d.str(dp, dm, "rule", false), d.str(dp, dm, "kind", false)
		switch {
		case rule != "" && kind != "":
			d.fail(sub(dp, "kind"), "give rule or kind, not both")
		case rule != "":
			dl.Kind = "rule:" + rule
		case kind != "":
			dl.Kind = kind
		default:
			d.fail(sub(dp, "rule"), "is required (or kind, for a commit-time failure such as \"commit:23505 (unique_violation)\")")
		}
		fe.DeadLetter, fe.Checked = dl, true
	}
	expects := 0
	for _, b := range []bool{fe.Skip, len(fe.Intents) > 0, fe.DeadLetter != nil} {
		if b {
			expects++
		}
	}
	if expects > 1 {
		d.fail(p, "give one of skip, intent and dead_letter")
	}
	return fe, len(d.errs) == n
}

func (d *fixtureDecoder) intent(p []string, m map[string]any) event.Intent {
	d.known(p, m, "rule", "op", "table", "key", "set", "inc", "sql", "args")
	in := event.Intent{Rule: d.str(p, m, "rule", false), Op: event.Op(d.str(p, m, "op", true)), Table: d.str(p, m, "table", false)}
	spec, known := in.Op.Spec()
	switch {
	case in.Op == "":
	case !known || !spec.Intent():
		d.fail(sub(p, "op"), "must be %s", intentOps)
	case spec.Kind == event.KindStatement:
		in.SQL = d.str(p, m, "sql", spec.SQL == event.Required)
		if a, ok := m["args"].([]any); ok {
			in.Args = a
		} else if _, ok := m["args"]; ok {
			d.fail(sub(p, "args"), "must be an array")
		}
	case spec.Table == event.Required && in.Table == "":
		d.fail(sub(p, "table"), "is required with op = %q", in.Op)
	}
	in.Key = columns(d.table(p, m, "key"))
	in.Set = columns(d.table(p, m, "set"))
	in.Inc = columns(d.table(p, m, "inc"))
	return in
}

// intentOps lists the ops an expected intent may have, from the op table:
// "insert, upsert, update, delete or sql".
var intentOps = func() string {
	var names []string
	for _, o := range event.Ops {
		if o.Intent() {
			names = append(names, string(o.Op))
		}
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}()

// columns lists a table's entries sorted by name, the order of intents.
func columns(m map[string]any) []event.Column {
	if len(m) == 0 {
		return nil
	}
	cs := make([]event.Column, 0, len(m))
	for k, v := range m {
		cs = append(cs, event.Column{Name: k, Value: v})
	}
	slices.SortFunc(cs, func(a, b event.Column) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return cs
}

func (d *fixtureDecoder) tableRows(i int, m map[string]any) (FixtureTable, bool) {
	p := []string{"table", index(i)}
	n := len(d.errs)
	d.known(p, m, "name", "rows")
	ft := FixtureTable{Name: d.str(p, m, "name", true), Line: d.lines.Line(p...)}
	if _, ok := m["rows"]; !ok {
		d.fail(sub(p, "rows"), "is required (rows = [] for an empty table)")
	}
	ft.Rows = d.tables(p, m, "rows")
	for j, r := range ft.Rows {
		var cols []string
		for k := range r {
			cols = append(cols, k)
		}
		sort.Strings(cols)
		if j == 0 {
			ft.Columns = cols
		} else if !slices.Equal(cols, ft.Columns) {
			d.fail(sub(p, "rows", index(j)), "names columns %v, rows[0] names %v: every row must name the same columns", cols, ft.Columns)
		}
	}
	return ft, len(d.errs) == n
}
