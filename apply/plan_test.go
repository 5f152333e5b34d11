package apply

import (
	"math"
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
