package apply

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgscribe/pgscribe/event"
)

// quoteTable quotes a possibly schema-qualified table name ("s.t") as an
// identifier. Names from configuration are never interpolated raw.
func quoteTable(name string) string {
	return event.Table(name).Quoted()
}

func quoteColumn(name string) string { return pgx.Identifier{name}.Sanitize() }

// columnTypes maps a table's column names to their type names without
// modifiers (character varying, not character varying(10)): values are cast
// to the base type and the column's own modifiers then apply on assignment,
// so an over-long value fails with 22001 instead of being silently cut.
type columnTypes map[string]string

// catalog caches column types per table for a Committer. Safe for
// concurrent use.
type catalog struct{ tableCache[columnTypes] }

func newCatalog() *catalog { return &catalog{newTableCache[columnTypes]()} }

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// types returns the column types of table, reading the catalog once. A
// missing table fails with PostgreSQL's own 42P01.
func (c *catalog) types(ctx context.Context, q queryer, table string) (columnTypes, error) {
	return c.get(table, func() (columnTypes, error) {
		rows, err := q.Query(ctx, `SELECT attname, format_type(atttypid, NULL) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, quoteTable(table))
		if err != nil {
			return nil, fmt.Errorf("read columns of %s: %w", table, err)
		}
		t := columnTypes{}
		var name, typ string
		if _, err := pgx.ForEachRow(rows, []any{&name, &typ}, func() error { t[name] = typ; return nil }); err != nil {
			return nil, fmt.Errorf("read columns of %s: %w", table, err)
		}
		return t, nil
	})
}

// statements renders and caches the SQL text per shape, so pgx's
// per-connection statement cache prepares each shape once.
type statements struct {
	mu    sync.RWMutex
	cache map[stmtKey]string
}

// stmtKey: a shape's statement with and without RETURNING differ.
type stmtKey struct {
	shape     shape
	returning bool
}

func newStatements() *statements { return &statements{cache: map[stmtKey]string{}} }

// groupSQL returns the statement for a group of rows of one shape and its
// arguments: one text[] per column, and the rows' ordinals when the
// statement returns the rows that matched.
func (s *statements) groupSQL(g *group, types columnTypes) (string, []any, error) {
	k := stmtKey{g.shape, g.returning}
	s.mu.RLock()
	text, ok := s.cache[k]
	s.mu.RUnlock()
	if !ok {
		var err error
		text, err = buildGroupSQL(g.first, types, g.returning)
		if err != nil {
			return "", nil, err
		}
		s.mu.Lock()
		s.cache[k] = text
		s.mu.Unlock()
	}
	first := g.first
	ncols := len(first.Key) + len(first.Set) + len(first.Inc)
	args := make([]any, ncols, ncols+1)
	cols := make([][]*string, ncols)
	for i := range cols {
		cols[i] = make([]*string, len(g.rows))
	}
	for r, in := range g.rows {
		j := 0
		for _, grp := range [][]event.Column{in.Key, in.Set, in.Inc} {
			for _, c := range grp {
				v, err := textValue(c.Value)
				if err != nil {
					return "", nil, fmt.Errorf("rule %s column %s: %w", in.Rule, c.Name, err)
				}
				cols[j][r] = v
				j++
			}
		}
	}
	for i := range cols {
		// pgx encodes a FlatArray without reflection; a []*string took
		// its reflection path (6.7% of the engine's CPU in W10's
		// backfill profile).
		args[i] = pgtype.FlatArray[*string](cols[i])
	}
	if g.returning {
		ords := make([]int32, len(g.rows))
		for i := range ords {
			ords[i] = int32(i + 1)
		}
		args = append(args, ords)
	}
	return text, args, nil
}

// buildGroupSQL renders the multi-row statement of an intent's shape:
// every column arrives as a text[] parameter, unnested and cast to the
// column's type; with returning, an int4[] of ordinals comes last.
func buildGroupSQL(in *event.Intent, types columnTypes, returning bool) (string, error) {
	o := opSQLs[in.Op]
	if o.build == nil {
		return "", fmt.Errorf("intent op %q cannot be rendered", in.Op)
	}
	s := &stmt{in: in, table: quoteTable(in.Table), val: map[string]string{}, returning: returning}
	var params, aliases []string
	add := func(cs []event.Column) []string {
		var out []string
		for _, c := range cs {
			n := len(params) + 1
			a := fmt.Sprintf("c%d", n)
			params = append(params, fmt.Sprintf("$%d::text[]", n))
			aliases = append(aliases, a)
			expr := "u." + a
			if typ, ok := types[c.Name]; ok {
				expr += "::" + typ
			}
			s.val[c.Name] = expr
			out = append(out, c.Name)
		}
		return out
	}
	s.keys, s.sets, s.incs = add(in.Key), add(in.Set), add(in.Inc)
	if returning {
		params = append(params, fmt.Sprintf("$%d::int4[]", len(params)+1))
		aliases = append(aliases, "ord")
	}
	s.from = fmt.Sprintf("unnest(%s) AS u(%s)", strings.Join(params, ", "), strings.Join(aliases, ", "))
	return o.build(s)
}

// textValue renders a value as PostgreSQL input text. Statements take every
// value as text and cast it to the column's type in SQL, so a value that
// does not fit its column fails in PostgreSQL with a data-exception SQLSTATE
// (22P02, 22003 …): an integrity-class error that dead-letters the one event,
// rather than a client-side encoding error that could not be attributed.
func textValue(v any) (*string, error) {
	var s string
	switch x := v.(type) {
	case nil:
		return nil, nil
	case string:
		s = x
	case int64:
		s = strconv.FormatInt(x, 10)
	case int:
		s = strconv.Itoa(x)
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			s = strconv.FormatFloat(x, 'g', -1, 64)
			s = strings.NewReplacer("+Inf", "Infinity", "-Inf", "-Infinity").Replace(s)
		} else {
			s = strconv.FormatFloat(x, 'g', -1, 64)
		}
	case bool:
		s = strconv.FormatBool(x)
	case time.Time:
		s = x.Format("2006-01-02 15:04:05.999999999Z07:00")
	case time.Duration:
		s = strconv.FormatInt(x.Microseconds(), 10) + " microseconds"
	case []byte:
		s = string(x)
	default:
		b, err := json.Marshal(x)
		if err != nil {
			return nil, fmt.Errorf("encode %T as JSON: %w", v, err)
		}
		s = string(b)
	}
	return &s, nil
}
