package admin

import (
	"reflect"
	"testing"

	"github.com/pgscribe/pgscribe/event"
)

func intent(op event.Op, rule string, set, inc map[string]any) event.Intent {
	in := event.Intent{Op: op, Rule: rule, Table: "t", Key: []event.Column{{Name: "k", Value: "x"}}}
	for _, group := range []struct {
		m   map[string]any
		dst *[]event.Column
	}{{set, &in.Set}, {inc, &in.Inc}} {
		for c, v := range group.m {
			*group.dst = append(*group.dst, event.Column{Name: c, Value: v})
		}
	}
	return in
}

// The outcomes a shared row may legitimately show: each stream's last
// write, as recorded from its writes in its order.
func TestRowWrites(t *testing.T) {
	type write struct {
		stream  string
		pos     int64
		in      event.Intent
		applied bool
	}
	cols := []string{"k", "n", "v", "w"}
	tests := []struct {
		name            string
		writes          []write
		present, absent bool
		vals            map[string]map[string]any // stream → last values
		exact           []string
		undecidable     []string
	}{
		{
			name: "upserts of two streams",
			writes: []write{
				{"a", 1, intent(event.OpUpsert, "r", map[string]any{"v": 1, "w": 1}, map[string]any{"n": 1}), true},
				{"b", 1, intent(event.OpUpsert, "r", map[string]any{"v": 2, "w": 2}, map[string]any{"n": 1}), true},
				{"a", 2, intent(event.OpUpsert, "r", map[string]any{"v": 3, "w": 3}, map[string]any{"n": 1}), true},
			},
			present: true,
			vals:    map[string]map[string]any{"a": {"k": "x", "v": 3, "w": 3}, "b": {"k": "x", "v": 2, "w": 2}},
			exact:   []string{"n"},
		},
		{
			name: "a delete clears the stream's earlier values; a dead-lettered write is left out",
			writes: []write{
				{"a", 1, intent(event.OpInsert, "ins", map[string]any{"v": 1}, nil), true},
				{"a", 2, intent(event.OpDelete, "del", nil, nil), true},
				{"b", 1, intent(event.OpUpdate, "upd", map[string]any{"v": 2}, map[string]any{"n": 1}), true},
				{"b", 2, intent(event.OpUpdate, "upd", map[string]any{"v": 5}, nil), false},
			},
			present: true, absent: true,
			vals:        map[string]map[string]any{"a": {}, "b": {"k": "x", "v": 2}},
			undecidable: []string{"n", "w"},
		},
		{
			name: "a retried batch seen again does not go back",
			writes: []write{
				{"a", 1, intent(event.OpUpsert, "r", map[string]any{"v": 1, "w": 1, "n": 0}, nil), true},
				{"a", 2, intent(event.OpUpsert, "r", map[string]any{"v": 2, "w": 2, "n": 0}, nil), true},
				{"a", 1, intent(event.OpUpsert, "r", map[string]any{"v": 1, "w": 1, "n": 0}, nil), true},
				{"b", 1, intent(event.OpDelete, "del", nil, nil), true},
			},
			present: true, absent: true,
			vals: map[string]map[string]any{"a": {"k": "x", "v": 2, "w": 2, "n": 0}, "b": {}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r rowWrites
			for _, w := range tt.writes {
				r.record(w.stream, w.pos, w.in, cols, w.applied)
			}
			present, absent := r.presence()
			if present != tt.present || absent != tt.absent {
				t.Errorf("presence: got present %v absent %v, want %v %v", present, absent, tt.present, tt.absent)
			}
			got := map[string]map[string]any{}
			for s, sw := range r.streams {
				got[s] = sw.vals
			}
			if !reflect.DeepEqual(got, tt.vals) {
				t.Errorf("last values: got %v, want %v", got, tt.vals)
			}
			exact, undecidable := r.modes(cols, false)
			var und []string
			for _, c := range cols {
				if _, ok := undecidable[c]; ok {
					und = append(und, c)
				}
			}
			if !reflect.DeepEqual(exact, tt.exact) || !reflect.DeepEqual(und, tt.undecidable) {
				t.Errorf("modes: exact %v undecidable %v, want %v %v", exact, und, tt.exact, tt.undecidable)
			}
			// A sum is exact only if both sides applied the same events.
			if exact, undecidable := r.modes(cols, true); len(exact) > 0 || len(undecidable) < len(tt.exact)+len(tt.undecidable) {
				t.Errorf("modes with differing dead letters: exact %v undecidable %v", exact, undecidable)
			}
		})
	}
}
