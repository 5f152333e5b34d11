package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// ErrExpectation is returned by Test when some fixture's expectation failed
// (exit 1); the failures themselves were written out.
var ErrExpectation = errors.New("rule test failed")

// TestOptions configures Test.
type TestOptions struct {
	// Database also applies each fixture's events in a throwaway schema of
	// the target database and checks its [[table]] rows and commit-time
	// dead letters.
	Database bool
}

// Test runs rule fixtures against the configuration's rules: every event
// through its projection's compiled rules, comparing intents, skips and
// dead letters with the fixture's expectations; with o.Database, through
// the engine's SQL path as well. It writes one line per fixture (and a
// readable diff per failure) to w. A fixture that cannot be read or does
// not fit the configuration is a *FixtureError (exit 2); a failed
// expectation is ErrExpectation (exit 1).
func Test(ctx context.Context, cfg *config.Config, paths []string, o TestOptions, w io.Writer) error {
	fixtures := make([]*Fixture, 0, len(paths))
	var bad config.Errors
	for _, p := range paths {
		f, err := ParseFixture(p)
		var fe *FixtureError
		if errors.As(err, &fe) {
			bad = append(bad, fe.Errs...)
			continue
		}
		fixtures = append(fixtures, f)
	}
	progs := map[*Fixture]*rules.Program{}
	specs := map[*Fixture]rules.Spec{}
	for _, f := range fixtures {
		spec, ferr := f.spec(cfg)
		if ferr != nil {
			bad = append(bad, ferr)
			continue
		}
		prog, err := rules.Compile(spec)
		if err != nil {
			return fmt.Errorf("compile %s v%d: %w", spec.Name, spec.Version, err)
		}
		progs[f], specs[f] = prog, spec
	}
	if len(bad) > 0 {
		return &FixtureError{Errs: bad}
	}
	var conn *pgx.Conn
	if o.Database {
		var err error
		if conn, err = pgx.Connect(ctx, cfg.TargetURL()); err != nil {
			return fmt.Errorf("connect to target: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
	}
	failed := 0
	for _, f := range fixtures {
		start := time.Now()
		r, err := runFixture(ctx, cfg, conn, f, specs[f], progs[f])
		if err != nil {
			var fe *FixtureError
			if errors.As(err, &fe) {
				return err
			}
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		d := time.Since(start).Round(time.Millisecond)
		if len(r.failures) == 0 {
			fmt.Fprintf(w, "ok    %s  (%s v%d: %d events, %d checked%s; %s)\n", f.Path, specs[f].Name, specs[f].Version,
				len(f.Events), r.checked, r.extra(o.Database), d)
			continue
		}
		failed++
		fmt.Fprintf(w, "FAIL  %s  (%s v%d: %d events; %s)\n", f.Path, specs[f].Name, specs[f].Version, len(f.Events), d)
		for _, fl := range r.failures {
			fmt.Fprintf(w, "  %s\n", strings.ReplaceAll(fl, "\n", "\n  "))
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d fixtures failed: %w", failed, len(fixtures), ErrExpectation)
	}
	return nil
}

// spec finds the fixture's projection in the configuration.
func (f *Fixture) spec(cfg *config.Config) (rules.Spec, *config.Error) {
	var found []rules.Spec
	for _, s := range cfg.Projections {
		if s.Name == f.Projection && (f.Version == 0 || s.Version == f.Version) {
			found = append(found, s)
		}
	}
	e := &config.Error{File: f.Path, Line: f.line, Key: "projection"}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) == 0 && f.Version != 0:
		e.Msg = fmt.Sprintf("no projection %q version %d in %s", f.Projection, f.Version, cfg.Path)
	case len(found) == 0:
		e.Msg = fmt.Sprintf("no projection %q in %s", f.Projection, cfg.Path)
	default:
		e.Msg = fmt.Sprintf("%s has %d versions of %q: give version", cfg.Path, len(found), f.Projection)
	}
	return rules.Spec{}, e
}

type fixtureResult struct {
	failures      []string
	tableFailures []string // listed after the events' failures
	checked       int
	needsDatabase int // dead-letter expectations of commit-time failures not checked offline
	tables        int
}

func (r *fixtureResult) extra(db bool) string {
	switch {
	case db:
		return fmt.Sprintf(", %d tables", r.tables)
	case r.needsDatabase > 0:
		return fmt.Sprintf(", %d commit-time dead letters need -database", r.needsDatabase)
	}
	return ""
}

// outcome is what happened to one event.
type outcome struct {
	intents []event.Intent
	dead    bool
	kind    string
	message string
}

func runFixture(ctx context.Context, cfg *config.Config, conn *pgx.Conn, f *Fixture, spec rules.Spec, prog *rules.Program) (*fixtureResult, error) {
	r := &fixtureResult{}
	outs := make([]outcome, len(f.Events))
	for i, fe := range f.Events {
		// Eval decodes into the event; work on a copy so a -database build
		// starts from the raw documents, as the engine's events do.
		ev := *fe.Event
		intents, err := prog.Eval(&ev)
		if err != nil {
			outs[i] = deadOutcome(err)
			continue
		}
		outs[i] = outcome{intents: intents}
	}
	if conn != nil {
		if err := databaseRun(ctx, cfg, conn, f, spec, prog, outs, r); err != nil {
			return nil, err
		}
	}
	for i, fe := range f.Events {
		if !fe.Checked {
			continue
		}
		if conn == nil && fe.DeadLetter != nil && strings.HasPrefix(fe.DeadLetter.Kind, "commit:") {
			r.needsDatabase++
			continue
		}
		r.checked++
		if diff := compareOutcome(fe, outs[i]); diff != "" {
			r.failures = append(r.failures, fmt.Sprintf("%s:%d: %s (%s, stream %s #%d):\n%s",
				f.Path, fe.Line, fe.Label, fe.Event.Type, fe.Event.StreamID, fe.Event.StreamPosition, diff))
		}
	}
	r.failures = append(r.failures, r.tableFailures...)
	return r, nil
}

func deadOutcome(err error) outcome {
	o := outcome{dead: true, kind: "rule", message: err.Error()}
	var k interface{ Kind() string }
	if errors.As(err, &k) {
		o.kind = k.Kind()
	}
	var m interface{ Message() string }
	if errors.As(err, &m) {
		o.message = m.Message()
	}
	return o
}

// compareOutcome returns a readable diff of what the event should have
// produced against what it did, or "".
func compareOutcome(fe FixtureEvent, got outcome) string {
	var b strings.Builder
	gotText := describeOutcome(got)
	switch {
	case fe.DeadLetter != nil:
		dl := fe.DeadLetter
		if !got.dead {
			fmt.Fprintf(&b, "  want dead letter %s\n  got  %s", dl.Kind, gotText)
			break
		}
		if got.kind != dl.Kind {
			fmt.Fprintf(&b, "  dead letter kind: want %s, got %s", dl.Kind, got.kind)
		}
		if dl.Message != "" && got.message != dl.Message {
			addLine(&b, fmt.Sprintf("  dead letter message: want %q\n                       got  %q", dl.Message, got.message))
		}
		if dl.Contains != "" && !strings.Contains(got.message, dl.Contains) {
			addLine(&b, fmt.Sprintf("  dead letter message: want it to contain %q\n                       got  %q", dl.Contains, got.message))
		}
	case fe.Skip:
		if got.dead || len(got.intents) > 0 {
			fmt.Fprintf(&b, "  want skipped (no rule matches)\n  got  %s", gotText)
		}
	default:
		if got.dead {
			fmt.Fprintf(&b, "  want %d intents\n  got  %s", len(fe.Intents), gotText)
			break
		}
		for i := 0; i < max(len(fe.Intents), len(got.intents)); i++ {
			switch {
			case i >= len(got.intents):
				addLine(&b, fmt.Sprintf("  intent %d: missing: %s", i+1, describeIntent(fe.Intents[i])))
			case i >= len(fe.Intents):
				addLine(&b, fmt.Sprintf("  intent %d (rule %s): unexpected: %s", i+1, got.intents[i].Rule, describeIntent(got.intents[i])))
			default:
				for _, d := range intentDiff(fe.Intents[i], got.intents[i]) {
					addLine(&b, fmt.Sprintf("  intent %d (rule %s): %s", i+1, got.intents[i].Rule, d))
				}
			}
		}
	}
	return b.String()
}

func addLine(b *strings.Builder, s string) {
	if b.Len() > 0 {
		b.WriteByte('\n')
	}
	b.WriteString(s)
}

func describeOutcome(o outcome) string {
	switch {
	case o.dead:
		return fmt.Sprintf("dead letter %s: %s", o.kind, o.message)
	case len(o.intents) == 0:
		return "skipped (no rule matches)"
	}
	parts := make([]string, len(o.intents))
	for i, in := range o.intents {
		parts[i] = fmt.Sprintf("[rule %s] %s", in.Rule, describeIntent(in))
	}
	return fmt.Sprintf("%d intents: %s", len(o.intents), strings.Join(parts, "; "))
}

func describeIntent(in event.Intent) string {
	if in.Op == event.OpSQL {
		return fmt.Sprintf("sql %q args %s", in.SQL, formatValue(in.Args))
	}
	s := fmt.Sprintf("%s %s", in.Op, in.Table)
	for _, g := range []struct {
		name string
		cs   []event.Column
	}{{"key", in.Key}, {"set", in.Set}, {"inc", in.Inc}} {
		if len(g.cs) > 0 {
			s += " " + g.name + " " + formatColumns(g.cs)
		}
	}
	return s
}

func formatColumns(cs []event.Column) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.Name + " = " + formatValue(c.Value)
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// intentDiff lists the differences between an expected and an actual
// intent, one readable line each.
func intentDiff(want, got event.Intent) []string {
	var ds []string
	if want.Rule != "" && want.Rule != got.Rule {
		ds = append(ds, fmt.Sprintf("rule: want %s, got %s", want.Rule, got.Rule))
	}
	if want.Op != got.Op {
		ds = append(ds, fmt.Sprintf("op: want %s, got %s", want.Op, got.Op))
	}
	if want.Table != got.Table {
		ds = append(ds, fmt.Sprintf("table: want %s, got %s", want.Table, got.Table))
	}
	if want.SQL != got.SQL {
		ds = append(ds, fmt.Sprintf("sql: want %q, got %q", want.SQL, got.SQL))
	}
	if len(want.Args) != len(got.Args) {
		ds = append(ds, fmt.Sprintf("args: want %s, got %s", formatValue(want.Args), formatValue(got.Args)))
	} else {
		for i := range want.Args {
			if !valuesEqual(want.Args[i], got.Args[i]) {
				ds = append(ds, fmt.Sprintf("args[%d]: want %s, got %s", i, formatValue(want.Args[i]), formatValue(got.Args[i])))
			}
		}
	}
	for _, g := range []struct {
		name      string
		want, got []event.Column
	}{{"key", want.Key, got.Key}, {"set", want.Set, got.Set}, {"inc", want.Inc, got.Inc}} {
		ds = append(ds, columnsDiff(g.name, g.want, g.got)...)
	}
	return ds
}

func columnsDiff(group string, want, got []event.Column) []string {
	var ds []string
	gm := map[string]any{}
	for _, c := range got {
		gm[c.Name] = c.Value
	}
	wm := map[string]bool{}
	for _, c := range want {
		wm[c.Name] = true
		g, ok := gm[c.Name]
		switch {
		case !ok:
			ds = append(ds, fmt.Sprintf("%s.%s: want %s, got no such column", group, c.Name, formatValue(c.Value)))
		case !valuesEqual(c.Value, g):
			ds = append(ds, fmt.Sprintf("%s.%s: want %s, got %s", group, c.Name, formatValue(c.Value), formatValue(g)))
		}
	}
	for _, c := range got {
		if !wm[c.Name] {
			ds = append(ds, fmt.Sprintf("%s.%s: not expected, got %s", group, c.Name, formatValue(c.Value)))
		}
	}
	return ds
}

// valuesEqual compares a fixture value (TOML: int64, float64, string, bool,
// datetime, arrays, tables) with an intent value: numbers by value whatever
// their Go type, times by instant (a string is read as RFC 3339),
// documents element by element.
func valuesEqual(want, got any) bool {
	if wn, ok := number(want); ok {
		gn, ok := number(got)
		return ok && wn == gn
	}
	switch w := want.(type) {
	case time.Time:
		g, ok := asTime(got)
		return ok && w.Equal(g)
	case string:
		if g, ok := got.(time.Time); ok {
			wt, err := time.Parse(time.RFC3339Nano, w)
			return err == nil && wt.Equal(g)
		}
		return w == got
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !valuesEqual(w[i], g[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k, v := range w {
			gv, ok := g[k]
			if !ok || !valuesEqual(v, gv) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(want, got)
}

func number(v any) (float64, bool) {
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case float64:
		return n, !math.IsNaN(n)
	}
	return 0, false
}

func asTime(v any) (time.Time, bool) {
	switch t := v.(type) {
	case time.Time:
		return t, true
	case string:
		p, err := time.Parse(time.RFC3339Nano, t)
		return p, err == nil
	}
	return time.Time{}, false
}

// formatValue renders a value the way a fixture writes it.
func formatValue(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return strconv.Quote(x)
	case float64:
		// Rows compared in PostgreSQL come back as jsonb, whose numbers
		// decode as float64: print 1058739, not 1.058739e+06.
		return strconv.FormatFloat(x, 'f', -1, 64)
	case json.Number:
		return x.String()
	case time.Time:
		return x.Format(time.RFC3339Nano)
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = formatValue(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = k + " = " + formatValue(x[k])
		}
		return "{ " + strings.Join(parts, ", ") + " }"
	}
	return fmt.Sprint(v)
}

// databaseRun applies the fixture's events in a scratch schema, reads back
// commit-time dead letters into outs, and compares the [[table]] rows.
func databaseRun(ctx context.Context, cfg *config.Config, conn *pgx.Conn, f *Fixture, spec rules.Spec, prog *rules.Program,
	outs []outcome, r *fixtureResult) error {
	if err := checkSQLRules(spec); err != nil {
		return &FixtureError{Errs: config.Errors{{File: f.Path, Line: f.line, Key: "projection", Msg: err.Error()}}}
	}
	tables := projectionTables(prog)
	for _, t := range f.Tables {
		if !slices.Contains(tables, t.Name) {
			return &FixtureError{Errs: config.Errors{{File: f.Path, Line: t.Line, Key: "table",
				Msg: fmt.Sprintf("projection %s v%d writes no table %q (it writes %s)", spec.Name, spec.Version, t.Name, strings.Join(tables, ", "))}}}
		}
	}
	return withScratch(ctx, conn, "pgscribe_test", tables, func(s *scratch) error {
		return databaseBuild(ctx, cfg, conn, s, f, spec, prog, outs, r)
	})
}

// databaseBuild is databaseRun's work inside its scratch schema.
func databaseBuild(ctx context.Context, cfg *config.Config, conn *pgx.Conn, s *scratch, f *Fixture, spec rules.Spec, prog *rules.Program,
	outs []outcome, r *fixtureResult) error {
	pool, err := buildPool(ctx, cfg.TargetURL(), s.schema, 2)
	if err != nil {
		return err
	}
	defer pool.Close()
	// One partition: events apply in the fixture's order, whatever their
	// streams, so a fixture's outcome is reproducible.
	err = s.build(ctx, pool, spec, &scratchEval{prog: prog, tables: s.tables}, buildOptions{
		Parallelism: 1, BatchSize: cfg.Engine.BatchSize, QueueSize: cfg.Engine.BatchSize,
		Retry:       apply.Options{MaxAttempts: cfg.Retry.MaxAttempts, Backoff: cfg.Retry.Backoff, MaxBackoff: cfg.Retry.MaxBackoff},
		SuspectWait: time.Millisecond,
	}, func(ctx context.Context, dispatch func(*event.Event) error) error {
		for _, fe := range f.Events {
			ev := *fe.Event
			if err := dispatch(&ev); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		var halt *apply.HaltError
		if errors.As(err, &halt) {
			r.failures = append(r.failures, fmt.Sprintf("%s: the projection would halt: %v", f.Path, err))
			return nil
		}
		return err
	}
	// Dead letters the commit isolated (and the rule errors again).
	rows, err := conn.Query(ctx, fmt.Sprintf("SELECT event_id, error_kind, error_message FROM %s", pgx.Identifier{s.schema, "dead_letters"}.Sanitize()))
	if err != nil {
		return fmt.Errorf("read scratch dead letters: %w", err)
	}
	byID := map[string]int{}
	for i, fe := range f.Events {
		byID[fe.Event.ID] = i
	}
	for rows.Next() {
		var id, kind, msg string
		if err := rows.Scan(&id, &kind, &msg); err != nil {
			rows.Close()
			return fmt.Errorf("read scratch dead letters: %w", err)
		}
		if i, ok := byID[id]; ok {
			outs[i] = outcome{dead: true, kind: kind, message: msg}
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read scratch dead letters: %w", err)
	}
	for _, t := range f.Tables {
		r.tables++
		diff, err := tableDiff(ctx, conn, s, f, t)
		if err != nil {
			return err
		}
		if diff != "" {
			r.tableFailures = append(r.tableFailures, fmt.Sprintf("%s:%d: table %s after all %d events:\n%s", f.Path, t.Line, t.Name, len(f.Events), diff))
		}
	}
	return nil
}

// tableDiff compares a scratch table with the fixture's rows, as
// multisets on the fixture's columns, in PostgreSQL: the fixture's values
// are cast to the columns' types by jsonb_populate_recordset, so
// "2024-01-01T00:00:00Z" equals a timestamptz and 100 a numeric.
func tableDiff(ctx context.Context, conn *pgx.Conn, s *scratch, f *Fixture, t FixtureTable) (string, error) {
	ident := s.ident(t.Name)
	cols := t.Columns
	if len(t.Rows) == 0 {
		var n int64
		if err := conn.QueryRow(ctx, "SELECT count(*) FROM "+ident).Scan(&n); err != nil {
			return "", fmt.Errorf("count %s: %w", t.Name, err)
		}
		if n == 0 {
			return "", nil
		}
		return fmt.Sprintf("  want no rows, got %d", n), nil
	}
	have, err := columnNames(ctx, conn, ident)
	if err != nil {
		return "", err
	}
	for _, c := range cols {
		if !slices.Contains(have, c) {
			return "", &FixtureError{Errs: config.Errors{{File: f.Path, Line: t.Line, Key: "table.rows",
				Msg: fmt.Sprintf("table %s has no column %q", t.Name, c)}}}
		}
	}
	want, err := json.Marshal(t.Rows)
	if err != nil {
		return "", fmt.Errorf("encode rows of %s: %w", t.Name, err)
	}
	sel := quoteColumns(cols)
	q := fmt.Sprintf(`WITH want AS (SELECT %[1]s FROM jsonb_populate_recordset(NULL::%[2]s, $1::jsonb)),
got AS (SELECT %[1]s FROM %[2]s)
SELECT 'missing', to_jsonb(m) FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM got) m
UNION ALL
SELECT 'unexpected', to_jsonb(x) FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM want) x`, sel, ident)
	rows, err := conn.Query(ctx, q, string(want))
	if err != nil {
		return "", fmt.Errorf("compare rows of %s: %w", t.Name, err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var what string
		var row map[string]any
		if err := rows.Scan(&what, &row); err != nil {
			return "", fmt.Errorf("compare rows of %s: %w", t.Name, err)
		}
		addLine(&b, fmt.Sprintf("  %-10s row %s", what, formatRow(cols, row)))
	}
	if err := rows.Err(); err != nil {
		return "", fmt.Errorf("compare rows of %s: %w", t.Name, err)
	}
	return b.String(), nil
}

// formatRow renders a row's columns in order, as a fixture writes them.
func formatRow(cols []string, row map[string]any) string {
	parts := make([]string, len(cols))
	for i, c := range cols {
		parts[i] = c + " = " + formatValue(row[c])
	}
	return "{ " + strings.Join(parts, ", ") + " }"
}

// queryStrings runs a query of one text column and returns its values.
func queryStrings(ctx context.Context, q event.Querier, sql string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// columnNames lists a table's columns.
func columnNames(ctx context.Context, conn *pgx.Conn, ident string) ([]string, error) {
	names, err := queryStrings(ctx, conn, `SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`, ident)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", ident, err)
	}
	return names, nil
}
