package admin

import (
	"testing"
)

// rowHash must be equal for keys the second pass takes as equal (the same
// JSON text), whatever Go type a value had.
func TestRowHash(t *testing.T) {
	tests := []struct {
		name  string
		a, b  []any
		equal bool
	}{
		{"same strings", []any{"acct-1"}, []any{"acct-1"}, true},
		{"int and float of one number", []any{int64(5), "x"}, []any{float64(5), "x"}, true},
		{"string and number", []any{"5"}, []any{5}, false},
		{"column boundaries", []any{"ab", "c"}, []any{"a", "bc"}, false},
		{"different strings", []any{"acct-1"}, []any{"acct-2"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rowHash(tt.a) == rowHash(tt.b); got != tt.equal {
				t.Errorf("rowHash(%v) == rowHash(%v): %v, want %v", tt.a, tt.b, got, tt.equal)
			}
		})
	}
}

// A stream's repeated writes to one row are sent once while the cache
// holds them; a write that does not commute is sent apart from one that
// does.
func TestRowLogRecent(t *testing.T) {
	l := &rowLog{ch: make(chan []rowRec, 10), done: make(chan struct{})}
	r := rowRec{table: 1, key: rowHash([]any{"acct-1"}), stream: streamHash("s1"), nonComm: true}
	l.add([]rowRec{r})
	l.add([]rowRec{r})
	c := r
	c.nonComm = false
	l.add([]rowRec{c, r})
	o := r
	o.stream = streamHash("s2")
	l.add([]rowRec{o})
	// The same key in two tables, in one event and again: two records.
	u, v := r, r
	u.table, v.table = 2, 3
	l.add([]rowRec{u, v})
	l.add([]rowRec{u, v})
	if got := l.rows.Load(); got != 5 {
		t.Errorf("sent %d records, want 5 (one per table, stream and kind of write)", got)
	}
}
