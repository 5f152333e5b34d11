package apply

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

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
type catalog struct {
	mu     sync.RWMutex
	tables map[string]columnTypes
}

func newCatalog() *catalog { return &catalog{tables: map[string]columnTypes{}} }

type queryer interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// types returns the column types of table, reading the catalog once. A
// missing table fails with PostgreSQL's own 42P01.
func (c *catalog) types(ctx context.Context, q queryer, table string) (columnTypes, error) {
	c.mu.RLock()
	t, ok := c.tables[table]
	c.mu.RUnlock()
	if ok {
		return t, nil
	}
	rows, err := q.Query(ctx, `SELECT attname, format_type(atttypid, NULL) FROM pg_attribute
		WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, quoteTable(table))
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", table, err)
	}
	t = columnTypes{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return nil, err
		}
		t[name] = typ
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", table, err)
	}
	c.mu.Lock()
	c.tables[table] = t
	c.mu.Unlock()
	return t, nil
}

// statements renders and caches the SQL text per shape, so pgx's
// per-connection statement cache prepares each shape once.
type statements struct {
	mu    sync.RWMutex
	cache map[shape]string
}

func newStatements() *statements { return &statements{cache: map[shape]string{}} }

// groupSQL returns the statement for a group of rows of one shape and its
// arguments: one text[] per column.
func (s *statements) groupSQL(g *group, types columnTypes) (string, []any, error) {
	s.mu.RLock()
	text, ok := s.cache[g.shape]
	s.mu.RUnlock()
	if !ok {
		var err error
		text, err = buildGroupSQL(g.first, types)
		if err != nil {
			return "", nil, err
		}
		s.mu.Lock()
		s.cache[g.shape] = text
		s.mu.Unlock()
	}
	first := g.first
	ncols := len(first.Key) + len(first.Set) + len(first.Inc)
	args := make([]any, ncols)
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
		args[i] = cols[i]
	}
	return text, args, nil
}

// buildGroupSQL renders the multi-row statement of an intent's shape:
// every column arrives as a text[] parameter, unnested and cast to the
// column's type.
func buildGroupSQL(in *event.Intent, types columnTypes) (string, error) {
	table := quoteTable(in.Table)
	const t = "pgscribe_t"
	var params, aliases []string
	n := 0
	val := map[string]string{} // column → typed expression over u
	add := func(cs []event.Column) []string {
		var out []string
		for _, c := range cs {
			n++
			alias := fmt.Sprintf("c%d", n)
			params = append(params, fmt.Sprintf("$%d::text[]", n))
			aliases = append(aliases, alias)
			expr := "u." + alias
			if typ, ok := types[c.Name]; ok {
				expr += "::" + typ
			}
			val[c.Name] = expr
			out = append(out, c.Name)
		}
		return out
	}
	keys, sets, incs := add(in.Key), add(in.Set), add(in.Inc)
	from := fmt.Sprintf("unnest(%s) AS u(%s)", strings.Join(params, ", "), strings.Join(aliases, ", "))

	switch in.Op {
	case event.OpInsert, event.OpUpsert:
		var cols, exprs []string
		for _, group := range [][]string{keys, sets, incs} {
			for _, c := range group {
				cols = append(cols, quoteColumn(c))
				exprs = append(exprs, val[c])
			}
		}
		q := fmt.Sprintf("INSERT INTO %s AS %s (%s) SELECT %s FROM %s", table, t,
			strings.Join(cols, ", "), strings.Join(exprs, ", "), from)
		if in.Op == event.OpInsert {
			return q, nil
		}
		var keyCols, assigns []string
		for _, c := range keys {
			keyCols = append(keyCols, quoteColumn(c))
		}
		for _, c := range sets {
			assigns = append(assigns, fmt.Sprintf("%s = EXCLUDED.%s", quoteColumn(c), quoteColumn(c)))
		}
		for _, c := range incs {
			// The stored value plus the increment; a new row gets the
			// increment itself.
			assigns = append(assigns, fmt.Sprintf("%s = %s.%s + EXCLUDED.%s", quoteColumn(c), t, quoteColumn(c), quoteColumn(c)))
		}
		if len(assigns) == 0 {
			return q + fmt.Sprintf(" ON CONFLICT (%s) DO NOTHING", strings.Join(keyCols, ", ")), nil
		}
		return q + fmt.Sprintf(" ON CONFLICT (%s) DO UPDATE SET %s", strings.Join(keyCols, ", "), strings.Join(assigns, ", ")), nil
	case event.OpUpdate:
		var assigns, where []string
		for _, c := range sets {
			assigns = append(assigns, fmt.Sprintf("%s = %s", quoteColumn(c), val[c]))
		}
		for _, c := range incs {
			assigns = append(assigns, fmt.Sprintf("%s = %s.%s + %s", quoteColumn(c), t, quoteColumn(c), val[c]))
		}
		for _, c := range keys {
			where = append(where, fmt.Sprintf("%s.%s = %s", t, quoteColumn(c), val[c]))
		}
		if len(assigns) == 0 || len(where) == 0 {
			return "", fmt.Errorf("update on %s needs key and set or inc columns", in.Table)
		}
		return fmt.Sprintf("UPDATE %s AS %s SET %s FROM %s WHERE %s", table, t,
			strings.Join(assigns, ", "), from, strings.Join(where, " AND ")), nil
	case event.OpDelete:
		var where []string
		for _, c := range keys {
			where = append(where, fmt.Sprintf("%s.%s = %s", t, quoteColumn(c), val[c]))
		}
		if len(where) == 0 {
			return "", fmt.Errorf("delete on %s needs key columns", in.Table)
		}
		return fmt.Sprintf("DELETE FROM %s AS %s USING %s WHERE %s", table, t, from, strings.Join(where, " AND ")), nil
	}
	return "", fmt.Errorf("intent op %q cannot be rendered", in.Op)
}
