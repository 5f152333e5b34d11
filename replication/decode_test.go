package replication

import (
	"context"
	"errors"
	"strings"
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

var allColumns = []string{"position", "id", "stream_id", "stream_position", "type", "data", "metadata", "occurred_at"}

// referenceTypes are the reference table's column types.
var referenceTypes = map[string]uint32{
	"position": oidInt8, "id": oidUUID, "stream_id": oidText, "stream_position": oidInt8,
	"type": oidText, "data": oidJSONB, "metadata": oidJSONB, "occurred_at": oidTimestamptz, "extra": oidText,
}

func relationOf(namespace, name string, cols ...string) *pglogrepl.RelationMessage {
	m := &pglogrepl.RelationMessage{Namespace: namespace, RelationName: name}
	for _, c := range cols {
		m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: c, DataType: referenceTypes[c]})
	}
	return m
}

func TestMapRelationAndDecode(t *testing.T) {
	s := testStreamer("events")
	// Columns in another order than the reference table, plus an extra one.
	rel, err := s.mapRelation(context.Background(), relationOf("public", "events",
		"extra", "type", "id", "position", "stream_id", "stream_position", "data", "metadata", "occurred_at"))
	if err != nil {
		t.Fatal(err)
	}
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
	if ev.RawData == nil || &ev.RawData[0] == &tup.Columns[6].Data[0] {
		t.Fatal("data not copied out of the message buffer")
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

// TestMapRelation: a relation is ours when it is the configured table,
// and ours but unreadable when a column is missing or of a type the
// decoder refuses.
func TestMapRelation(t *testing.T) {
	textPosition := relationOf("public", "events", allColumns...)
	textPosition.Columns[0].DataType = oidText
	tests := []struct {
		name, table string
		rel         *pglogrepl.RelationMessage
		ours        bool
		unreadable  bool     // ErrUnreadable
		says        []string // what the unreadable error names
	}{
		{name: "default schema", table: "events", rel: relationOf("public", "events", allColumns...), ours: true},
		{name: "other table", table: "events", rel: relationOf("public", "orders", allColumns...)},
		{name: "same name, other schema", table: "events", rel: relationOf("audit", "events", allColumns...)},
		{name: "qualified", table: "es.events", rel: relationOf("es", "events", allColumns...), ours: true},
		{name: "missing stream_id", table: "events", rel: relationOf("public", "events", "position", "id"), unreadable: true},
		{name: "position of type text", table: "events", rel: textPosition, unreadable: true, says: []string{`"position"`, "type text"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rel, err := testStreamer(tt.table).mapRelation(context.Background(), tt.rel)
			if tt.unreadable {
				if !errors.Is(err, ErrUnreadable) {
					t.Fatalf("err = %v, want ErrUnreadable", err)
				}
				for _, s := range tt.says {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("err = %v, want it to name %s", err, s)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if rel.ours != tt.ours {
				t.Fatalf("ours = %v, want %v", rel.ours, tt.ours)
			}
		})
	}
}

// row builds the text of an events row, field by field; nil is NULL.
func row(pos, id, stream, spos, typ, data, meta, occ *string) *[numFields][]byte {
	var v [numFields][]byte
	for f, s := range []*string{pos, id, stream, spos, typ, data, meta, occ} {
		if s != nil {
			v[f] = []byte(*s)
		}
	}
	return &v
}

func str(s string) *string { return &s }

func TestDecoderEvent(t *testing.T) {
	types := func(occ uint32, drop ...int) [numFields]columnType {
		cols := [numFields]columnType{
			{name: "p", base: oidInt4}, {name: "i", base: oidUUID}, {name: "s", base: oidInt8}, {name: "sp", base: oidInt4},
			{name: "t", base: oidVarchar}, {name: "d", base: oidJSON}, {name: "m", base: oidText}, {name: "o", base: occ},
		}
		for _, f := range drop {
			cols[f] = columnType{}
		}
		return cols
	}
	utc := time.Date(2026, 12, 1, 11, 56, 6, 672146000, time.UTC)
	tests := []struct {
		name        string
		cols        [numFields]columnType
		row         *[numFields][]byte
		want        event.Event
		wantErr     bool
		wantInvalid bool
	}{
		{name: "timestamp without time zone is UTC", cols: types(oidTimestamp),
			row:  row(str("7"), str("u"), str("42"), str("0"), str("T"), str(`{"a":1}`), str(`{}`), str("2026-12-01 11:56:06.672146")),
			want: event.Event{Position: 7, ID: "u", StreamID: "42", StreamPosition: 0, Type: "T", OccurredAt: utc}},
		{name: "timestamptz", cols: types(oidTimestamptz),
			row:  row(str("7"), str("u"), str("42"), str("1"), str("T"), str(`{}`), str(`{}`), str("2026-12-01 11:56:06.672146+00")),
			want: event.Event{Position: 7, ID: "u", StreamID: "42", StreamPosition: 1, Type: "T", OccurredAt: utc}},
		{name: "NULL documents, id and time", cols: types(oidTimestamptz),
			row:  row(str("7"), nil, str("s"), str("1"), str("T"), nil, nil, nil),
			want: event.Event{Position: 7, StreamID: "s", StreamPosition: 1, Type: "T"}},
		{name: "absent id, metadata, occurred_at", cols: types(0, fID, fMetadata, fOccurredAt),
			row:  row(str("7"), str("ignored"), str("s"), str("1"), str("T"), str(`{}`), str("ignored"), str("ignored")),
			want: event.Event{Position: 7, StreamID: "s", StreamPosition: 1, Type: "T"}},
		{name: "infinity dead-letters", cols: types(oidTimestamp),
			row:  row(str("7"), str("u"), str("s"), str("1"), str("T"), nil, nil, str("infinity")),
			want: event.Event{Position: 7, ID: "u", StreamID: "s", StreamPosition: 1, Type: "T"}, wantInvalid: true},
		{name: "NULL stream id", cols: types(oidTimestamp),
			row: row(str("7"), str("u"), nil, str("1"), str("T"), nil, nil, nil), wantErr: true},
		{name: "NULL position", cols: types(oidTimestamp),
			row: row(nil, str("u"), str("s"), str("1"), str("T"), nil, nil, nil), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := newDecoder("events", tt.cols)
			if err != nil {
				t.Fatal(err)
			}
			ev, err := d.event(tt.row)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if ev.Position != tt.want.Position || ev.ID != tt.want.ID || ev.StreamID != tt.want.StreamID ||
				ev.StreamPosition != tt.want.StreamPosition || ev.Type != tt.want.Type || !ev.OccurredAt.Equal(tt.want.OccurredAt) {
				t.Fatalf("decoded %+v, want %+v", ev, tt.want)
			}
			if (ev.Invalid != nil) != tt.wantInvalid {
				t.Fatalf("Invalid = %v, want %v", ev.Invalid, tt.wantInvalid)
			}
			if tt.wantInvalid && ev.DecodeDocuments(event.All, event.All) == nil {
				t.Fatal("an invalid event decodes")
			}
		})
	}
}

func TestNewDecoderRefusesTypes(t *testing.T) {
	tests := []struct {
		name    string
		field   int
		base    uint32
		wantErr bool
	}{
		{name: "bigint position", field: fPosition, base: oidInt8},
		{name: "text position", field: fPosition, base: oidText, wantErr: true},
		{name: "uuid stream id", field: fStreamID, base: oidUUID},
		{name: "bytea data", field: fData, base: 17, wantErr: true},
		{name: "date occurred_at", field: fOccurredAt, base: 1082, wantErr: true},
		{name: "numeric stream position", field: fStreamPosition, base: 1700, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cols := [numFields]columnType{
				{name: "p", base: oidInt8}, {name: "i", base: oidUUID}, {name: "s", base: oidText}, {name: "sp", base: oidInt8},
				{name: "t", base: oidText}, {name: "d", base: oidJSONB}, {name: "m", base: oidJSONB}, {name: "o", base: oidTimestamptz},
			}
			cols[tt.field] = columnType{name: "col", typ: "shown", base: tt.base}
			_, err := newDecoder("events", cols)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr && !errors.Is(err, ErrUnreadable) {
				t.Fatalf("err = %v, want ErrUnreadable", err)
			}
			ok, _ := ReadableType(fieldKeys[tt.field], tt.base)
			if ok == tt.wantErr {
				t.Fatalf("ReadableType = %v, want %v", ok, !tt.wantErr)
			}
		})
	}
}
