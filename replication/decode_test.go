package replication

import (
	"testing"
	"time"

	"github.com/jackc/pglogrepl"

	"github.com/pgscribe/pgscribe/event"
)

func TestParseTimestamptz(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    time.Time
		wantErr bool
	}{
		{name: "utc micros", in: "2026-11-30 02:45:09.123456+00", want: time.Date(2026, 11, 30, 2, 45, 9, 123456000, time.UTC)},
		{name: "no fraction", in: "2026-11-30 02:45:09+00", want: time.Date(2026, 11, 30, 2, 45, 9, 0, time.UTC)},
		{name: "half-hour zone", in: "2026-11-30 08:15:09.5+05:30", want: time.Date(2026, 11, 30, 2, 45, 9, 500000000, time.UTC)},
		{name: "garbage", in: "yesterday", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseTimestamptz(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr && !got.Equal(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
		})
	}
}

func textCol(s string) *pglogrepl.TupleDataColumn {
	return &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte(s)}
}

func testStreamer(table string) *streamer {
	s := &streamer{src: Source{Table: table, Columns: Columns{
		Position: "position", ID: "id", StreamID: "stream_id", StreamPosition: "stream_position",
		Type: "type", Data: "data", Metadata: "metadata", OccurredAt: "occurred_at"}}}
	s.schema, s.table = s.src.tableName()
	return s
}

func relationOf(namespace, name string, cols ...string) *pglogrepl.RelationMessage {
	m := &pglogrepl.RelationMessage{Namespace: namespace, RelationName: name}
	for _, c := range cols {
		m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: c})
	}
	return m
}

func TestMapRelationAndDecode(t *testing.T) {
	s := testStreamer("events")
	// Columns in another order than the reference table, plus an extra one.
	rel := s.mapRelation(relationOf("public", "events",
		"extra", "type", "id", "position", "stream_id", "stream_position", "data", "metadata", "occurred_at"))
	if !rel.ours {
		t.Fatal("events table not recognised")
	}
	s.commitLSN, s.commitTime = 0x16B374D848, time.Unix(100, 0)
	tup := &pglogrepl.TupleData{Columns: []*pglogrepl.TupleDataColumn{
		textCol("x"), textCol("Deposited"), textCol("0190e1c2-aaaa-bbbb-cccc-000000000001"), textCol("70002"),
		textCol("acc-1"), textCol("7"), textCol(`{"amount": 9007199254740993}`), textCol(`{}`), textCol("2026-11-30 02:45:09.123456+00"),
	}}
	ev, err := s.decode(rel, tup)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Position != 70002 || ev.StreamID != "acc-1" || ev.StreamPosition != 7 || ev.Type != "Deposited" {
		t.Fatalf("decoded %+v", ev)
	}
	if ev.CommitLSN != event.LSN(0x16B374D848) || !ev.CommitTime.Equal(time.Unix(100, 0)) {
		t.Fatalf("commit lsn/time = %v %v", ev.CommitLSN, ev.CommitTime)
	}
	if err := ev.Decode(); err != nil {
		t.Fatal(err)
	}
	if ev.Data["amount"] != int64(9007199254740993) {
		t.Fatalf("amount = %#v", ev.Data["amount"])
	}
}

func TestMapRelationOtherTables(t *testing.T) {
	tests := []struct {
		name      string
		table     string
		namespace string
		relname   string
		ours      bool
	}{
		{name: "default schema", table: "events", namespace: "public", relname: "events", ours: true},
		{name: "other table", table: "events", namespace: "public", relname: "orders"},
		{name: "same name, other schema", table: "events", namespace: "audit", relname: "events"},
		{name: "qualified", table: "es.events", namespace: "es", relname: "events", ours: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testStreamer(tt.table)
			if got := s.mapRelation(relationOf(tt.namespace, tt.relname, "position")).ours; got != tt.ours {
				t.Fatalf("ours = %v, want %v", got, tt.ours)
			}
		})
	}
}

func TestDecodeMissingColumn(t *testing.T) {
	s := testStreamer("events")
	rel := s.mapRelation(relationOf("public", "events", "position", "id"))
	_, err := s.decode(rel, &pglogrepl.TupleData{Columns: []*pglogrepl.TupleDataColumn{textCol("1"), textCol("x")}})
	if err == nil {
		t.Fatal("decoded a row without stream_id")
	}
}
