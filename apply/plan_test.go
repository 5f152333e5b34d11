package apply

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/pgscribe/pgscribe/event"
)

func upsert(k string, inc int64, set string) *event.Intent {
	return &event.Intent{Op: event.OpUpsert, Table: "b", Key: []event.Column{col("k", k)},
		Set: []event.Column{col("s", set)}, Inc: []event.Column{col("n", inc)}}
}

func update(k string, inc int64) *event.Intent {
	return &event.Intent{Op: event.OpUpdate, Table: "b", Key: []event.Column{col("k", k)}, Inc: []event.Column{col("n", inc)}}
}

func del(k string) *event.Intent {
	return &event.Intent{Op: event.OpDelete, Table: "b", Key: []event.Column{col("k", k)}}
}

// describe renders layers as op:key=inc lists for comparison.
func describe(layers [][]*group) [][]string {
	var out [][]string
	for _, l := range layers {
		var ls []string
		for _, g := range l {
			s := string(g.shape.op) + ":"
			for i, r := range g.rows {
				if i > 0 {
					s += ","
				}
				s += r.Key[0].Value.(string)
				if len(r.Inc) > 0 {
					s += "=" + fmtAny(r.Inc[0].Value)
				}
			}
			ls = append(ls, s)
		}
		out = append(out, ls)
	}
	return out
}

func fmtAny(v any) string {
	s, _ := textValue(v)
	return *s
}

func TestPlanGroups(t *testing.T) {
	tests := []struct {
		name     string
		in       []*event.Intent
		want     [][]string
		fallback bool
	}{
		{
			name: "distinct rows share one statement",
			in:   []*event.Intent{update("a", 1), update("b", 2)},
			want: [][]string{{"update:a=1,b=2"}},
		},
		{
			name: "same row folds inc",
			in:   []*event.Intent{update("a", 1), update("b", 2), update("a", 3)},
			want: [][]string{{"update:a=4,b=2"}},
		},
		{
			name: "upsert then updates: two layers, updates folded",
			in:   []*event.Intent{upsert("a", 10, "x"), update("a", 1), upsert("b", 5, "y"), update("a", 2), update("b", 1)},
			want: [][]string{{"upsert:a=10,b=5"}, {"update:a=3,b=1"}},
		},
		{
			name: "upserts fold with last set",
			in:   []*event.Intent{upsert("a", 1, "x"), upsert("a", 2, "y")},
			want: [][]string{{"upsert:a=3"}},
		},
		{
			name: "delete then upsert of the same row keeps order",
			in:   []*event.Intent{upsert("a", 1, "x"), del("a"), upsert("a", 2, "y")},
			want: [][]string{{"upsert:a=1"}, {"delete:a"}, {"upsert:a=2"}},
		},
		{
			name: "int64 overflow does not fold",
			in:   []*event.Intent{update("a", math.MaxInt64), update("a", 1)},
			want: [][]string{{"update:a=9223372036854775807"}, {"update:a=1"}},
		},
		{
			name:     "sql intent falls back",
			in:       []*event.Intent{update("a", 1), {Op: event.OpSQL, SQL: "select 1"}},
			fallback: true,
		},
		{
			name: "two key sets on one table fall back",
			in: []*event.Intent{update("a", 1),
				{Op: event.OpUpdate, Table: "b", Key: []event.Column{col("other", "a")}, Inc: []event.Column{col("n", int64(1))}}},
			fallback: true,
		},
		{
			name: "keyless insert into a modified table falls back",
			in: []*event.Intent{update("a", 1),
				{Op: event.OpInsert, Table: "b", Set: []event.Column{col("k", "z")}}},
			fallback: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			layers, ok := planGroups(tt.in)
			if ok == tt.fallback {
				t.Fatalf("ok = %v, want fallback %v", ok, tt.fallback)
			}
			if tt.fallback {
				return
			}
			got := describe(layers)
			if len(got) != len(tt.want) {
				t.Fatalf("layers = %v, want %v", got, tt.want)
			}
			for i := range got {
				if len(got[i]) != len(tt.want[i]) {
					t.Fatalf("layers = %v, want %v", got, tt.want)
				}
				for j := range got[i] {
					if got[i][j] != tt.want[i][j] {
						t.Fatalf("layers = %v, want %v", got, tt.want)
					}
				}
			}
		})
	}
}

func TestFoldDoesNotModifyInputs(t *testing.T) {
	a, b := update("a", 1), update("a", 2)
	if _, ok := planGroups([]*event.Intent{a, b}); !ok {
		t.Fatal("fallback")
	}
	if a.Inc[0].Value != int64(1) || b.Inc[0].Value != int64(2) {
		t.Fatalf("inputs modified: %v %v", a.Inc, b.Inc)
	}
}

// TestPlanLockOrder: rows of a statement are sorted by key and the
// statements of a layer run in rule order, whatever order the events came
// in, so two batches writing the same rows lock them in the same order.
func TestPlanLockOrder(t *testing.T) {
	ins := func(k string) *event.Intent {
		return &event.Intent{Op: event.OpInsert, Table: "m", RuleIndex: 0, Key: []event.Column{col("k", k)}}
	}
	upd := func(k string) *event.Intent {
		in := update(k, 1)
		in.RuleIndex = 1
		return in
	}
	for _, order := range [][]*event.Intent{
		{upd("c"), upd("a"), ins("z"), upd("b"), ins("y")},
		{ins("y"), upd("b"), ins("z"), upd("a"), upd("c")},
	} {
		layers, ok := planGroups(order)
		if !ok {
			t.Fatal("fallback")
		}
		got := describe(layers)
		want := [][]string{{"insert:y,z", "update:a=1,b=1,c=1"}}
		if len(got) != 1 || len(got[0]) != 2 || got[0][0] != want[0][0] || got[0][1] != want[0][1] {
			t.Fatalf("layers = %v, want %v", got, want)
		}
	}
}

// TestPlanMisses: a folded update row stands for every intent folded into
// it, and a statement returns its matched rows only where a row count
// cannot say whose the misses are.
func TestPlanMisses(t *testing.T) {
	a1, b, a2 := update("a", 1), update("b", 2), update("a", 3)
	layers, _ := planGroups([]*event.Intent{b, a1, a2}) // sorting moves the folded row
	g := layers[0][0]
	src := g.sources()
	if s := src[0]; len(s) != 2 || s[0] != a1 || s[1] != a2 {
		t.Errorf("sources of the folded row = %v", s)
	}
	if s, ok := src[1]; ok || g.rows[1] != b {
		t.Errorf("row b: sources %v, row %v", s, g.rows[1])
	}
	if !g.returning {
		t.Error("a group with a folded row must return its matched rows")
	}

	layers, _ = planGroups([]*event.Intent{update("a", 1), update("b", 2)})
	if layers[0][0].returning {
		t.Error("one rule, no fold, ignore: the row count is enough")
	}
	dl := update("c", 1)
	dl.DeadLetterIfMissing = true
	layers, _ = planGroups([]*event.Intent{update("a", 1), dl})
	if !layers[0][0].returning {
		t.Error("a dead_letter rule needs the matched rows")
	}
	layers, _ = planGroups([]*event.Intent{upsert("a", 1, "x"), upsert("a", 1, "y")})
	if g := layers[0][0]; g.mayMiss || g.returning || g.folds != nil {
		t.Error("upserts cannot miss")
	}
}

// TestRowLocks: the sequential path's row locks: a shared lock per table
// and an exclusive one per row (table, key columns, key values), sorted,
// without keyless or sql intents; over rowLockBudget rows, an exclusive
// lock per table and none per row.
func TestRowLocks(t *testing.T) {
	row := func(table, k string) *event.Intent {
		return &event.Intent{Op: event.OpUpsert, Table: table, Key: []event.Column{{Name: "k", Value: k}}}
	}
	a, b, c := row("t", "a"), row("t", "b"), row("u", "a")
	sql := &event.Intent{Op: event.OpSQL, SQL: "SELECT 1"}
	keyless := &event.Intent{Op: event.OpInsert, Table: "t", Set: []event.Column{{Name: "k", Value: "a"}}}
	got := rowLocks([]*event.Intent{b, a, sql, c, row("t", "a"), keyless}, nil)
	if len(got) != 5 {
		t.Fatalf("rowLocks = %v, want 5 locks (t, t/a, t/b, u, u/a)", got)
	}
	sorted := slices.IsSortedFunc(got, func(x, y rowLock) int {
		if x.table != y.table {
			return int(x.table) - int(y.table)
		}
		return int(x.row) - int(y.row)
	})
	if !sorted {
		t.Errorf("rowLocks = %v, not sorted", got)
	}
	tables := 0
	for _, l := range got {
		if l.row == 0 {
			tables++
			if l.exclusive {
				t.Errorf("a table's lock is exclusive for 3 rows: %v", got)
			}
		} else if !l.exclusive {
			t.Errorf("a row's lock is shared: %v", got)
		}
	}
	if tables != 2 {
		t.Errorf("rowLocks = %v, want a lock for each of t and u", got)
	}
	if again := rowLocks([]*event.Intent{c, a, b}, nil); !slices.Equal(got, again) {
		t.Errorf("rowLocks depends on the intents' order: %v and %v", got, again)
	}
	if rowLocks([]*event.Intent{sql, keyless}, nil) != nil {
		t.Error("rowLocks locks rows of keyless or sql intents")
	}
	var many []*event.Intent
	for i := range rowLockBudget + 1 {
		many = append(many, row("t", fmt.Sprint(i)), row("u", "a"))
	}
	if big := rowLocks(many, nil); len(big) != 2 || !big[0].exclusive || !big[1].exclusive || big[0].row != 0 || big[1].row != 0 {
		t.Errorf("over the budget: %v, want the two tables' locks, exclusive, and no row's", big)
	}
	// With the streams (the isolated pass): over the budget, the rows two
	// streams write (u/a) are locked, the tables shared.
	streams := make([]string, len(many))
	for i := range many {
		streams[i] = fmt.Sprint("s-", i)
	}
	got = rowLocks(many, streams)
	if len(got) != 3 || got[0].exclusive && got[0].row == 0 || got[1].exclusive && got[1].row == 0 {
		t.Errorf("over the budget with streams: %v, want t and u shared and u/a exclusive", got)
	}
	// Over the budget even so: the tables exclusive.
	var hot []*event.Intent
	var hotStreams []string
	for i := range rowLockBudget + 1 {
		for _, s := range []string{"x", "y"} {
			hot = append(hot, row("t", fmt.Sprint(i)))
			hotStreams = append(hotStreams, s)
		}
	}
	if got := rowLocks(hot, hotStreams); len(got) != 1 || !got[0].exclusive {
		t.Errorf("%d rows that two streams write: %v, want t exclusive", rowLockBudget+1, got)
	}
}
