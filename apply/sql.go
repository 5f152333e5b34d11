package apply

import (
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// quoteTable quotes a possibly schema-qualified table name ("s.t") as an
// identifier. Names from configuration are never interpolated raw.
func quoteTable(name string) string {
	return pgx.Identifier(strings.Split(name, ".")).Sanitize()
}

func quoteColumn(name string) string { return pgx.Identifier{name}.Sanitize() }

// statementKey identifies the shape of an intent: the same shape renders to
// the same SQL text, so pgx's per-connection statement cache prepares it once.
type statementKey struct {
	op    event.Op
	table string
	cols  string // key|set|inc column names, comma separated
}

// renderer renders intents into parameterised SQL, caching the text per
// shape. It is safe for concurrent use.
type renderer struct {
	mu    sync.RWMutex
	cache map[statementKey]string
}

func newRenderer() *renderer { return &renderer{cache: make(map[statementKey]string)} }

// render returns the SQL and arguments for one intent.
func (r *renderer) render(in *event.Intent) (string, []any, error) {
	if in.Op == event.OpSQL {
		return in.SQL, in.Args, nil
	}
	var sb strings.Builder
	for _, group := range [][]event.Column{in.Key, in.Set, in.Inc} {
		for _, c := range group {
			sb.WriteString(c.Name)
			sb.WriteByte(',')
		}
		sb.WriteByte('|')
	}
	k := statementKey{op: in.Op, table: in.Table, cols: sb.String()}
	r.mu.RLock()
	text, ok := r.cache[k]
	r.mu.RUnlock()
	if !ok {
		var err error
		text, err = buildSQL(in)
		if err != nil {
			return "", nil, err
		}
		r.mu.Lock()
		r.cache[k] = text
		r.mu.Unlock()
	}
	args := make([]any, 0, len(in.Key)+len(in.Set)+len(in.Inc))
	switch in.Op {
	case event.OpInsert, event.OpUpsert:
		args = appendValues(args, in.Key, in.Set, in.Inc)
	case event.OpUpdate:
		args = appendValues(args, in.Set, in.Inc, in.Key)
	case event.OpDelete:
		args = appendValues(args, in.Key)
	}
	return text, args, nil
}

func appendValues(args []any, groups ...[]event.Column) []any {
	for _, g := range groups {
		for _, c := range g {
			args = append(args, c.Value)
		}
	}
	return args
}

// buildSQL renders the statement for an intent's shape. Parameter order
// follows appendValues for the same op.
func buildSQL(in *event.Intent) (string, error) {
	table := quoteTable(in.Table)
	n := 0
	param := func() string { n++; return fmt.Sprintf("$%d", n) }
	switch in.Op {
	case event.OpInsert, event.OpUpsert:
		var cols, vals []string
		for _, g := range [][]event.Column{in.Key, in.Set, in.Inc} {
			for _, c := range g {
				cols = append(cols, quoteColumn(c.Name))
				vals = append(vals, param())
			}
		}
		q := fmt.Sprintf("INSERT INTO %s (%s) VALUES (%s)", table, strings.Join(cols, ", "), strings.Join(vals, ", "))
		if in.Op == event.OpInsert {
			return q, nil
		}
		var keys, sets []string
		for _, c := range in.Key {
			keys = append(keys, quoteColumn(c.Name))
		}
		for _, c := range in.Set {
			col := quoteColumn(c.Name)
			sets = append(sets, fmt.Sprintf("%s = EXCLUDED.%s", col, col))
		}
		for _, c := range in.Inc {
			col := quoteColumn(c.Name)
			// The target table's own value plus the increment: on conflict
			// the inserted value is the increment itself.
			sets = append(sets, fmt.Sprintf("%s = %s.%s + EXCLUDED.%s", col, table, col, col))
		}
		if len(sets) == 0 {
			return q + fmt.Sprintf(" ON CONFLICT (%s) DO NOTHING", strings.Join(keys, ", ")), nil
		}
		return q + fmt.Sprintf(" ON CONFLICT (%s) DO UPDATE SET %s", strings.Join(keys, ", "), strings.Join(sets, ", ")), nil
	case event.OpUpdate:
		var sets, where []string
		for _, c := range in.Set {
			sets = append(sets, fmt.Sprintf("%s = %s", quoteColumn(c.Name), param()))
		}
		for _, c := range in.Inc {
			col := quoteColumn(c.Name)
			sets = append(sets, fmt.Sprintf("%s = %s + %s", col, col, param()))
		}
		for _, c := range in.Key {
			where = append(where, fmt.Sprintf("%s = %s", quoteColumn(c.Name), param()))
		}
		if len(sets) == 0 || len(where) == 0 {
			return "", fmt.Errorf("update on %s needs key and set or inc columns", in.Table)
		}
		return fmt.Sprintf("UPDATE %s SET %s WHERE %s", table, strings.Join(sets, ", "), strings.Join(where, " AND ")), nil
	case event.OpDelete:
		var where []string
		for _, c := range in.Key {
			where = append(where, fmt.Sprintf("%s = %s", quoteColumn(c.Name), param()))
		}
		if len(where) == 0 {
			return "", fmt.Errorf("delete on %s needs key columns", in.Table)
		}
		return fmt.Sprintf("DELETE FROM %s WHERE %s", table, strings.Join(where, " AND ")), nil
	}
	return "", fmt.Errorf("intent op %q cannot be rendered", in.Op)
}
