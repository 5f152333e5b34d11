package apply

import (
	"fmt"
	"slices"
	"strings"

	"github.com/pgscribe/pgscribe/event"
)

// The SQL half of the op table (event.Ops has the rest): how an op's
// multi-row statement is built and which privileges it needs. Every op of
// event.Ops has an entry; TestEveryOpHasSQL fails otherwise.

// opSQL is one op's SQL.
type opSQL struct {
	// build renders the statement of a row op's group; nil for the ops
	// that write no rows of their own (sql runs the rule's text, fail
	// writes nothing).
	build func(s *stmt) (string, error)
	// privileges lists what the statement needs on its table, given the
	// key, set and inc columns that exist there; nil for the ops without
	// a statement of ours.
	privileges func(key, set, inc []string) []Privilege
	// onConflict: the statement names the key columns in ON CONFLICT,
	// which needs a unique index or constraint on exactly them.
	onConflict bool
	// stores is which of an intent's columns the statement stores in the
	// table, whose values must fit their bounded columns (inc values are
	// numbers and are left out). Every op gives one; none for the ops that
	// store nothing of ours.
	stores stores
}

// stores names the intent columns a statement stores. The zero value is
// no answer, so that an op that forgets it fails TestEveryOpHasSQL.
type stores int8

const (
	_ stores = iota
	storesNone
	storesKeySet // the key and set columns
	storesSet    // the set columns; the key is compared, not stored
)

// storedColumns lists in's column groups whose values the op's statement
// stores; nil when it stores none.
func storedColumns(in *event.Intent) [][]event.Column {
	switch opSQLs[in.Op].stores {
	case storesKeySet:
		return [][]event.Column{in.Key, in.Set}
	case storesSet:
		return [][]event.Column{in.Set}
	}
	return nil
}

var opSQLs = map[event.Op]opSQL{
	event.OpInsert: {build: buildInsert, stores: storesKeySet, privileges: func(key, set, inc []string) []Privilege {
		return []Privilege{{"INSERT", slices.Concat(key, set, inc)}}
	}},
	event.OpUpsert: {build: buildUpsert, onConflict: true, stores: storesKeySet, privileges: func(key, set, inc []string) []Privilege {
		ps := []Privilege{{"INSERT", slices.Concat(key, set, inc)}}
		if len(set)+len(inc) > 0 { // a key-only upsert does nothing on conflict
			ps = append(ps, Privilege{"UPDATE", slices.Concat(set, inc)})
		}
		return append(ps, Privilege{"SELECT", slices.Concat(key, inc)})
	}},
	event.OpUpdate: {build: buildUpdate, stores: storesSet, privileges: func(key, set, inc []string) []Privilege {
		return []Privilege{{"UPDATE", slices.Concat(set, inc)}, {"SELECT", slices.Concat(key, inc)}}
	}},
	event.OpDelete: {build: buildDelete, stores: storesNone, privileges: func(key, _, _ []string) []Privilege {
		return []Privilege{{"DELETE", nil}, {"SELECT", key}}
	}},
	event.OpSQL:  {stores: storesNone}, // the rule's own statement: PostgreSQL checks it
	event.OpFail: {stores: storesNone},
}

// Privilege is a privilege a rule's statement needs on its table: on the
// whole table, or (Columns non-nil) on each of those columns.
type Privilege struct {
	Name    string // INSERT, UPDATE, DELETE or SELECT
	Columns []string
}

// Privileges lists what the statement of a row op needs on its table, for
// `pgscribe check`; key, set and inc are the rule's columns that exist.
// It is nil for the ops that run no statement of pgscribe's.
func Privileges(op event.Op, key, set, inc []string) []Privilege {
	if o := opSQLs[op]; o.privileges != nil {
		return o.privileges(key, set, inc)
	}
	return nil
}

// NeedsUniqueKey reports whether the op's statement uses ON CONFLICT on
// the key columns.
func NeedsUniqueKey(op event.Op) bool { return opSQLs[op].onConflict }

// stmt is what the op builders share: the quoted table, its alias, the
// unnest source and each column's typed value expression.
type stmt struct {
	in               *event.Intent
	table            string
	from             string
	keys, sets, incs []string
	val              map[string]string // column → typed expression over u
	// returning: the statement returns the ordinal (u.ord, 1-based) of
	// every input row that matched, to tell which rows missed.
	returning bool
}

// alias is the target table's alias in every statement.
const alias = "pgscribe_t"

func buildInsert(s *stmt) (string, error) {
	var cols, exprs []string
	for _, group := range [][]string{s.keys, s.sets, s.incs} {
		for _, c := range group {
			cols = append(cols, quoteColumn(c))
			exprs = append(exprs, s.val[c])
		}
	}
	return fmt.Sprintf("INSERT INTO %s AS %s (%s) SELECT %s FROM %s", s.table, alias,
		strings.Join(cols, ", "), strings.Join(exprs, ", "), s.from), nil
}

func buildUpsert(s *stmt) (string, error) {
	q, _ := buildInsert(s)
	var keyCols, assigns []string
	for _, c := range s.keys {
		keyCols = append(keyCols, quoteColumn(c))
	}
	if len(keyCols) == 0 {
		return "", fmt.Errorf("upsert on %s needs key columns", s.in.Table)
	}
	for _, c := range s.sets {
		assigns = append(assigns, fmt.Sprintf("%s = EXCLUDED.%s", quoteColumn(c), quoteColumn(c)))
	}
	for _, c := range s.incs {
		// The stored value plus the increment; a new row gets the
		// increment itself.
		assigns = append(assigns, fmt.Sprintf("%s = %s.%s + EXCLUDED.%s", quoteColumn(c), alias, quoteColumn(c), quoteColumn(c)))
	}
	if len(assigns) == 0 {
		// Key only: insert the row if it is absent, change nothing else.
		return q + fmt.Sprintf(" ON CONFLICT (%s) DO NOTHING", strings.Join(keyCols, ", ")), nil
	}
	return q + fmt.Sprintf(" ON CONFLICT (%s) DO UPDATE SET %s", strings.Join(keyCols, ", "), strings.Join(assigns, ", ")), nil
}

func buildUpdate(s *stmt) (string, error) {
	var assigns []string
	for _, c := range s.sets {
		assigns = append(assigns, fmt.Sprintf("%s = %s", quoteColumn(c), s.val[c]))
	}
	for _, c := range s.incs {
		assigns = append(assigns, fmt.Sprintf("%s = %s.%s + %s", quoteColumn(c), alias, quoteColumn(c), s.val[c]))
	}
	where := s.keyMatch()
	if len(assigns) == 0 || where == "" {
		return "", fmt.Errorf("update on %s needs key and set or inc columns", s.in.Table)
	}
	return fmt.Sprintf("UPDATE %s AS %s SET %s FROM %s WHERE %s", s.table, alias,
		strings.Join(assigns, ", "), s.from, where) + s.returningClause(), nil
}

func buildDelete(s *stmt) (string, error) {
	where := s.keyMatch()
	if where == "" {
		return "", fmt.Errorf("delete on %s needs key columns", s.in.Table)
	}
	return fmt.Sprintf("DELETE FROM %s AS %s USING %s WHERE %s", s.table, alias, s.from, where) + s.returningClause(), nil
}

// keyMatch is the WHERE condition joining the target row to its input row.
func (s *stmt) keyMatch() string {
	var where []string
	for _, c := range s.keys {
		where = append(where, fmt.Sprintf("%s.%s = %s", alias, quoteColumn(c), s.val[c]))
	}
	return strings.Join(where, " AND ")
}

func (s *stmt) returningClause() string {
	if !s.returning {
		return ""
	}
	return " RETURNING u.ord"
}
