package admin

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/deadletter"
)

func TestCellAndTail(t *testing.T) {
	if got := cell("a\tb\nc\x00d"); got != "a b c d" {
		t.Errorf("cell = %q", got)
	}
	tests := []struct {
		name  string
		in    string
		width int
		want  string
	}{
		{name: "fits", in: "abcdef", width: 6, want: "abcdef"},
		{name: "cut keeps the end", in: "context: cause", width: 6, want: "…cause"},
		{name: "counts characters, not bytes", in: "ééééééé", width: 3, want: "…éé"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tail(tt.in, tt.width); got != tt.want {
				t.Errorf("tail(%q, %d) = %q, want %q", tt.in, tt.width, got, tt.want)
			}
		})
	}
}

func deadFixture() []deadletter.Row {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	return []deadletter.Row{
		{ID: 7, Projection: "balances", Version: 1, Position: 70, EventID: "e7", StreamID: "acct\t1", StreamPosition: 3,
			EventType: "Withdrawn", ErrorKind: "rule:non_positive", ErrorMessage: "projection p: " + strings.Repeat("x", 100),
			EventData: []byte(`{"amount": 0}`), EventMetadata: []byte(`{}`), OccurredAt: at, DeadLetteredAt: at},
		{ID: 9, Projection: "balances", Version: 1, Position: 90, EventID: "e9", StreamID: "acct-2", StreamPosition: 1,
			EventType: "Opened", ErrorKind: "commit:23505 (unique_violation)", ErrorMessage: "dup", DeadLetteredAt: at},
	}
}

func TestWriteDeadLettersText(t *testing.T) {
	rows := deadFixture()
	var b bytes.Buffer
	if err := writeDeadLettersText(&b, rows, 2); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"ID", "balances v1", "acct 1/3", "rule:non_positive", "…" + strings.Repeat("x", 59),
		"2025-01-02T03:04:05Z", "-after 9"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, strings.Repeat("x", 60)) || strings.Contains(out, "projection p:") {
		t.Errorf("message not cut to its last %d characters:\n%s", messageWidth, out)
	}
	b.Reset()
	if err := writeDeadLettersText(&b, rows, 100); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "-after") {
		t.Errorf("a short page suggests a next one:\n%s", b.String())
	}
	b.Reset()
	if err := writeDeadLettersText(&b, nil, 100); err != nil || b.String() != "no dead letters\n" {
		t.Errorf("empty list: %q, %v", b.String(), err)
	}
}

func TestWriteDeadLettersJSON(t *testing.T) {
	var b bytes.Buffer
	if err := writeDeadLettersJSON(&b, deadFixture()); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&b)
	var got []map[string]any
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != 2 {
		t.Fatalf("got %d lines, want 2", len(got))
	}
	if d, _ := got[0]["event_data"].(map[string]any); d["amount"] != 0.0 {
		t.Errorf("event_data = %v", got[0]["event_data"])
	}
	if got[0]["stream_id"] != "acct\t1" || got[0]["error_message"] != "projection p: "+strings.Repeat("x", 100) {
		t.Errorf("JSON must carry values unchanged: %v", got[0])
	}
	if got[1]["event_data"] != nil || got[1]["occurred_at"] != nil {
		t.Errorf("missing data and time must be null: %v", got[1])
	}
}

func TestWriteStats(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	st := deadletter.Stats{Total: 3, Oldest: &at, Newest: &at,
		ByKind:       []deadletter.KindCount{{Kind: "rule:a", Count: 2}, {Kind: "rule:b", Count: 1}},
		ByProjection: []deadletter.ProjCount{{Projection: "p", Version: 1, Count: 3}}}
	var b bytes.Buffer
	if err := writeStatsText(&b, st); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"total", "3", "rule:a", "p v1"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, b.String())
		}
	}
	b.Reset()
	if err := writeStatsJSON(&b, deadletter.Stats{}); err != nil {
		t.Fatal(err)
	}
	var empty map[string]any
	if err := json.Unmarshal(b.Bytes(), &empty); err != nil {
		t.Fatal(err)
	}
	if kinds, ok := empty["by_error_kind"].([]any); !ok || len(kinds) != 0 || empty["oldest"] != nil {
		t.Errorf("empty stats JSON: %s", b.String())
	}
}
