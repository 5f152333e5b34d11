package apply

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/pgscribe/pgscribe/event"
)

// The batched write path. A batch's intents are folded and grouped into as
// few multi-row statements as keep the result identical to applying them
// one by one in order:
//
//   - Consecutive intents on the same row (same table, key columns and key
//     values) with the same shape fold into one: inc values add, set values
//     take the later one. That is exact for update and upsert (an upsert
//     folded with an upsert inserts the summed increment or adds it).
//   - Every other intent on a row goes one layer after the previous intent
//     on that row. Within a layer each row appears at most once, so one
//     multi-row statement per (layer, shape) never touches a row twice.
//   - Layers run in order; within a layer, statements run in rule order
//     (then by shape), and every statement's rows are sorted by key. That
//     order is the same in every batch, so partitions whose batches write
//     the same rows lock them in one order and wait for each other instead
//     of deadlocking. Reordering within a layer is exact: a layer touches
//     each row once.
//
// Batches whose row identity is ambiguous fall back to one statement per
// intent in order: any op = "sql" intent (arbitrary SQL), or a table written
// through different key column sets, or a keyless insert into a table that
// is also updated or deleted in the batch. Such a batch first takes a
// transaction-level advisory lock per row its keyed intents address, in
// one order (rowLocks), so that its writes in event order do not deadlock
// with another partition's.

// shape is what makes intents share one statement.
type shape struct {
	op    event.Op
	table string
	key   string // column names joined by \x00
	set   string
	inc   string
}

func shapeOf(in *event.Intent) shape {
	return shape{op: in.Op, table: in.Table, key: names(in.Key), set: names(in.Set), inc: names(in.Inc)}
}

func names(cs []event.Column) string {
	var b strings.Builder
	for i, c := range cs {
		if i > 0 {
			b.WriteByte(0)
		}
		b.WriteString(c.Name)
	}
	return b.String()
}

// group is one multi-row statement: rows of intents of one shape.
type group struct {
	shape shape
	first *event.Intent // column names come from here
	rows  []*event.Intent
	keys  []string // keyValues of each row, for the lock order; nil for keyless rows
	// rank is the lowest rule index among the rows: groups of a layer run
	// in rule order.
	rank int
	// For ops that may match no row (update, delete): folds lists the
	// intents folded into a row, the row's first intent included (a miss
	// counts for each of them); returning says the statement must return
	// which rows matched, because a count alone cannot say whose the
	// misses are.
	mayMiss   bool
	folds     []fold
	returning bool
}

// fold is an intent folded into row row of its group.
type fold struct {
	row int
	in  *event.Intent
}

// sources returns, for each row folded from several intents, those intents
// (the slow path: only a statement with misses asks).
func (g *group) sources() map[int][]*event.Intent {
	m := make(map[int][]*event.Intent)
	for _, f := range g.folds {
		m[f.row] = append(m[f.row], f.in)
	}
	return m
}

// rowID identifies a read-model row by its table, key columns and values.
type rowID struct {
	table, key, vals string
}

type rowState struct {
	layer  int
	g      *group
	idx    int  // index in g.rows
	folded bool // g.folds lists the row's intents
}

// planGroups folds and groups intents. ok is false when the batch must take the
// sequential path.
func planGroups(intents []*event.Intent) (layers [][]*group, ok bool) {
	keysOf := map[string]string{} // table → key column set used
	keyless := map[string]bool{}  // table has a keyless insert
	modified := map[string]bool{} // table has an op that addresses existing rows
	var op event.OpSpec           // of the intent at hand; looked up when the op changes
	for _, in := range intents {
		if in.Op != op.Op {
			op, _ = in.Op.Spec()
		}
		if op.Kind != event.KindRow {
			return nil, false
		}
		if len(in.Key) == 0 {
			keyless[in.Table] = true
			continue
		}
		k := names(in.Key)
		if prev, seen := keysOf[in.Table]; seen && prev != k {
			return nil, false
		}
		keysOf[in.Table] = k
		if op.Key == event.Required {
			modified[in.Table] = true
		}
	}
	for t := range keyless {
		if modified[t] {
			return nil, false
		}
	}

	rows := map[rowID]*rowState{}
	var ls []map[shape]*group
	groupAt := func(layer int, sh shape, in *event.Intent) *group {
		for len(ls) <= layer {
			ls = append(ls, map[shape]*group{})
		}
		g := ls[layer][sh]
		if g == nil {
			op, _ := in.Op.Spec()
			g = &group{shape: sh, first: in, rank: in.RuleIndex, mayMiss: op.MayMiss}
			ls[layer][sh] = g
		}
		g.rank = min(g.rank, in.RuleIndex)
		return g
	}
	for _, in := range intents {
		sh := shapeOf(in)
		if len(in.Key) == 0 {
			g := groupAt(0, sh, in)
			g.rows = append(g.rows, in)
			continue
		}
		id := rowID{table: in.Table, key: sh.key, vals: keyValues(in.Key)}
		st := rows[id]
		layer := 0
		if st != nil {
			if in.Op != op.Op {
				op, _ = in.Op.Spec()
			}
			if st.g.shape == sh && op.Folds {
				if merged, ok := foldIntents(st.g.rows[st.idx], in); ok {
					if st.g.mayMiss {
						if !st.folded {
							st.g.folds = append(st.g.folds, fold{st.idx, st.g.rows[st.idx]})
							st.folded = true
						}
						st.g.folds = append(st.g.folds, fold{st.idx, in})
					}
					st.g.rows[st.idx] = merged
					continue
				}
			}
			layer = st.layer + 1
		}
		g := groupAt(layer, sh, in)
		g.rows = append(g.rows, in)
		g.keys = append(g.keys, id.vals)
		rows[id] = &rowState{layer: layer, g: g, idx: len(g.rows) - 1}
	}
	layers = make([][]*group, len(ls))
	for i, l := range ls {
		for _, g := range l {
			g.lockOrder()
			layers[i] = append(layers[i], g)
		}
		slices.SortFunc(layers[i], compareGroups)
	}
	return layers, true
}

// compareGroups orders the statements of a layer: by rule, then by shape,
// so that the order does not depend on the order events arrived in.
func compareGroups(a, b *group) int {
	return cmp.Or(cmp.Compare(a.rank, b.rank),
		cmp.Compare(a.shape.table, b.shape.table), cmp.Compare(a.shape.op, b.shape.op),
		cmp.Compare(a.shape.key, b.shape.key), cmp.Compare(a.shape.set, b.shape.set),
		cmp.Compare(a.shape.inc, b.shape.inc))
}

// lockOrder sorts the group's rows by key and decides whether its
// statement must return the rows that matched.
func (g *group) lockOrder() {
	if g.keys != nil && !slices.IsSorted(g.keys) {
		perm := make([]int, len(g.rows))
		for i := range perm {
			perm[i] = i
		}
		slices.SortFunc(perm, func(a, b int) int { return strings.Compare(g.keys[a], g.keys[b]) })
		rows, keys := make([]*event.Intent, len(perm)), make([]string, len(perm))
		moved := make([]int, len(perm)) // old row → new row
		for to, from := range perm {
			rows[to], keys[to] = g.rows[from], g.keys[from]
			moved[from] = to
		}
		for i := range g.folds {
			g.folds[i].row = moved[g.folds[i].row]
		}
		g.rows, g.keys = rows, keys
	}
	if !g.mayMiss {
		return
	}
	// The row count of the statement's command tag says how many rows
	// missed; that is enough when every row is one intent of one rule that
	// ignores misses. Otherwise the statement returns the rows that matched.
	g.returning = len(g.folds) > 0
	for _, in := range g.rows {
		if g.returning {
			break
		}
		g.returning = in.DeadLetterIfMissing || in.Rule != g.first.Rule
	}
}

// keyValues renders key values into a comparable string. Values of
// different Go types never compare equal, as in SQL after parameter typing
// they might — so two intents whose keys differ only in type count as two
// rows; they then land in one layer only if the database sees them as
// distinct too, and otherwise the statement fails and the batch is isolated.
//
// It runs for every intent of a batch: the common key types are rendered
// without fmt (the same text "%T:%v" gives them), the rest through it.
func keyValues(cs []event.Column) string {
	var buf [64]byte // most keys fit: no allocation but the result
	b := buf[:0]
	for _, c := range cs {
		switch v := c.Value.(type) {
		case string:
			b = append(append(b, "string:"...), v...)
		case int64:
			b = strconv.AppendInt(append(b, "int64:"...), v, 10)
		case bool:
			b = strconv.AppendBool(append(b, "bool:"...), v)
		default:
			b = fmt.Appendf(b, "%T:%v", c.Value, c.Value)
		}
		b = append(b, 0)
	}
	return string(b)
}

// foldIntents merges b into a (same row, same shape, b after a). The result
// is a new intent; a and b are not modified.
func foldIntents(a, b *event.Intent) (*event.Intent, bool) {
	inc := make([]event.Column, len(a.Inc))
	for i := range a.Inc {
		v, ok := addValues(a.Inc[i].Value, b.Inc[i].Value)
		if !ok {
			return nil, false
		}
		inc[i] = event.Column{Name: a.Inc[i].Name, Value: v}
	}
	m := *b
	m.Inc = inc
	return &m, true
}

// addValues adds two increments; false when they cannot be folded exactly
// (int64 overflow, or a non-number).
func addValues(x, y any) (any, bool) {
	switch a := x.(type) {
	case int64:
		switch b := y.(type) {
		case int64:
			s := a + b
			if (b > 0 && s < a) || (b < 0 && s > a) {
				return nil, false
			}
			return s, true
		case float64:
			return float64(a) + b, true
		}
	case float64:
		switch b := y.(type) {
		case int64:
			return a + float64(b), true
		case float64:
			return a + b, true
		}
	}
	return nil, false
}
