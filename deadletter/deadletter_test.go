package deadletter

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

func TestDeadLetterFromEvent(t *testing.T) {
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name             string
		ev               event.Event
		wantData, wantMD string
	}{
		{"raw JSON kept",
			event.Event{RawData: []byte(`{"b": 1,  "a": 2}`), RawMetadata: []byte(`{}`), Data: map[string]any{"x": 1}},
			`{"b": 1,  "a": 2}`, `{}`},
		{"decoded documents re-encoded",
			event.Event{Data: map[string]any{"n": int64(9007199254740993)}, Metadata: map[string]any{}},
			`{"n":9007199254740993}`, `{}`},
		{"nothing", event.Event{}, "", ""},
		{"text that is not JSON kept as a JSON string",
			event.Event{RawData: []byte(`{"amount": 5,`), RawMetadata: []byte("plain \"text\"\n")},
			`"{\"amount\": 5,"`, `"plain \"text\"\n"`},
		{"JSON with a NUL escape (jsonb rejects it) kept as a JSON string",
			event.Event{RawData: []byte(`{"a": "x\u0000y"}`)},
			`"{\"a\": \"x\\u0000y\"}"`, ""},
		{"invalid UTF-8 replaced", event.Event{RawData: []byte("a\xffb")}, `"a\ufffdb"`, ""},
		{"a lone surrogate escape (jsonb rejects it) kept as a JSON string",
			event.Event{RawData: []byte(`["\ud800"]`)}, `"[\"\\ud800\"]"`, ""},
		{"an escaped backslash before u0000 is JSON jsonb takes",
			event.Event{RawData: []byte(`{"path": "C:\\u0000"}`)}, `{"path": "C:\\u0000"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := tt.ev
			ev.Position, ev.ID, ev.StreamID, ev.StreamPosition, ev.Type, ev.OccurredAt = 7, "id-1", "s-1", 3, "T", at
			r := FromEvent("p", 2, &ev, "rule:r", "boom")
			want := Row{Projection: "p", Version: 2, Position: 7, EventID: "id-1", StreamID: "s-1", StreamPosition: 3,
				EventType: "T", ErrorKind: "rule:r", ErrorMessage: "boom", OccurredAt: at}
			got := r
			got.EventData, got.EventMetadata = nil, nil
			if !reflect.DeepEqual(got, want) {
				t.Errorf("FromEvent() = %+v, want %+v", got, want)
			}
			if string(r.EventData) != tt.wantData || string(r.EventMetadata) != tt.wantMD {
				t.Errorf("data, metadata = %s, %s; want %s, %s", r.EventData, r.EventMetadata, tt.wantData, tt.wantMD)
			}
		})
	}
}

func TestDeadLetterStorable(t *testing.T) {
	cases := map[string]string{
		"bad value": "bad value",
		"a\x00b":    "ab",       // NUL removed
		"a\xffb":    "a\uFFFDb", // invalid UTF-8 replaced
	}
	for in, want := range cases {
		if got := storable(in); got != want {
			t.Errorf("storable(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestDeadLetterFilterWhere(t *testing.T) {
	tests := map[string]struct {
		f        Filter
		want     string
		wantArgs []any
	}{
		"none":       {Filter{AfterID: 5, Limit: 3}, "", nil},
		"projection": {Filter{Projection: "p"}, " WHERE projection = $1", []any{"p"}},
		"all": {Filter{Projection: "p", Version: 2, StreamID: "s", ErrorKind: "k"},
			" WHERE projection = $1 AND version = $2 AND stream_id = $3 AND error_kind = $4", []any{"p", int64(2), "s", "k"}},
		"stream and kind": {Filter{StreamID: "s", ErrorKind: "k"},
			" WHERE stream_id = $1 AND error_kind = $2", []any{"s", "k"}},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			got, args := tt.f.where()
			if got != tt.want || !slices.Equal(args, tt.wantArgs) {
				t.Errorf("where() = %q %v, want %q %v", got, args, tt.want, tt.wantArgs)
			}
		})
	}
}
