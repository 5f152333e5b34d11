package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/rules"
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

func TestRebuildProgress(t *testing.T) {
	tests := []struct {
		name        string
		done, total int64
		elapsed     time.Duration
		want        string
	}{
		{"half way", 50_000, 100_000, 2 * time.Second, "rebuilding: 50000 of 100000 events (50.0%), 25000 events/s, eta 2s"},
		{"nothing yet", 0, 100_000, time.Second, "rebuilding: 0 of 100000 events (0.0%), 0 events/s, eta ?"},
		{"more than the cursors counted", 12, 10, time.Second, "rebuilding: 12 of 10 events (100.0%), 12 events/s, eta ?"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := rebuildProgress(tt.done, tt.total, tt.elapsed); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// -json carries the same counts as the text report, and ErrDrift.
func TestVerifyJSON(t *testing.T) {
	rep := &driftReport{limit: 10,
		drift: map[string]int{"t": 1}, orderDep: map[string]int{"t": 1}, undecidable: map[string]int{}, keys: map[string][]string{"t": {"k"}},
		rows: []driftRow{
			{table: "t", kind: "different", live: map[string]any{"k": "a", "v": 2.0}, expected: map[string]any{"k": "a", "v": 1.0}},
			{table: "t", kind: "different", orderDependent: true, live: map[string]any{"k": "b", "v": 2.0}, expected: map[string]any{"k": "b", "v": 1.0}},
		},
		accounts: []accountDiff{{stream: "s", text: "stream s: …"}}}
	var b bytes.Buffer
	err := rep.writeJSON(&b, rules.Spec{Name: "p", Version: 2}, 100, 3, []string{"t"}, time.Second)
	if !errors.Is(err, ErrDrift) {
		t.Errorf("want ErrDrift, got %v", err)
	}
	var res VerifyResult
	if err := json.Unmarshal(b.Bytes(), &res); err != nil {
		t.Fatal(err)
	}
	if res.Projection != "p" || res.Version != 2 || res.Events != 100 || res.Streams != 3 || res.Drift != 2 || res.SharedLegitimate != 1 ||
		len(res.Tables) != 1 || len(res.Tables[0].Rows) != 2 || !res.Tables[0].Rows[0].Drift || res.Tables[0].Rows[1].Drift ||
		!res.Tables[0].Rows[1].Shared || len(res.Accounting) != 1 {
		t.Errorf("unexpected result %s", b.String())
	}
}

func TestPerStreamTables(t *testing.T) {
	r := func(table, op string, key, set map[string]string) rules.RuleSpec {
		return rules.RuleSpec{Name: table + op, On: "A", Op: op, Table: table, Key: key, Set: set}
	}
	tests := []struct {
		name  string
		rules []rules.RuleSpec
		keys  map[string][]string
		want  []string
	}{
		{"keyed by the event id", []rules.RuleSpec{r("ledger", "insert", map[string]string{"event_id": "id"}, map[string]string{"v": "1"})},
			map[string][]string{"ledger": {"event_id"}}, []string{"ledger"}},
		{"event id in set, part of a wider key", []rules.RuleSpec{r("ledger", "insert", nil, map[string]string{"event_id": " id ", "n": "1"})},
			map[string][]string{"ledger": {"event_id", "n"}}, []string{"ledger"}},
		{"keyed by the stream", []rules.RuleSpec{r("s", "upsert", map[string]string{"sid": "stream_id"}, nil), r("s", "delete", map[string]string{"sid": "stream_id"}, nil)},
			map[string][]string{"s": {"sid"}}, []string{"s"}},
		{"another rule writes it by another value", []rules.RuleSpec{r("s", "upsert", map[string]string{"sid": "stream_id"}, nil), r("s", "delete", map[string]string{"sid": "data.owner"}, nil)},
			map[string][]string{"s": {"sid"}}, nil},
		{"event id in one rule, stream in another", []rules.RuleSpec{r("s", "insert", map[string]string{"k": "id"}, nil), r("s", "delete", map[string]string{"k": "stream_id"}, nil)},
			map[string][]string{"s": {"k"}}, nil},
		{"not a column of the key verify uses", []rules.RuleSpec{r("l", "insert", map[string]string{"event_id": "id"}, map[string]string{"acct": "data.a"})},
			map[string][]string{"l": {"acct"}}, nil},
		{"a data value", []rules.RuleSpec{r("b", "upsert", map[string]string{"account_id": "data.account_id"}, nil)},
			map[string][]string{"b": {"account_id"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := perStreamTables(rules.Spec{Rules: tt.rules}, tt.keys)
			var names []string
			for n := range got {
				names = append(names, n)
			}
			if strings.Join(names, ",") != strings.Join(tt.want, ",") {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
