package replication

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

// This file is the one path from PostgreSQL's text form of an events row
// into an event. The snapshot backfill asks for its columns in text format
// and the stream receives pgoutput's text tuples; both are what the
// columns' output functions print, under the same DateStyle (ISO) and
// TimeZone (UTC), and both go through decoder.event, so a row cannot
// decode one way in the backfill and another way live.

// The event fields, in the order of Columns.
const (
	fPosition = iota
	fID
	fStreamID
	fStreamPosition
	fType
	fData
	fMetadata
	fOccurredAt
	numFields
)

// fieldKeys are the fields' keys in [source.columns].
var fieldKeys = [numFields]string{"position", "id", "stream_id", "stream_position", "type", "data", "metadata", "occurred_at"}

// optional fields may be unmapped (an empty column name).
var optional = [numFields]bool{fID: true, fMetadata: true, fOccurredAt: true}

func (c Columns) names() [numFields]string {
	return [numFields]string{c.Position, c.ID, c.StreamID, c.StreamPosition, c.Type, c.Data, c.Metadata, c.OccurredAt}
}

// kind is how a column's text becomes its field.
type kind uint8

const (
	kindAbsent      kind = iota // not mapped
	kindInt                     // a base-10 integer (smallint, integer, bigint)
	kindString                  // the text as it is
	kindDocument                // JSON text (json, jsonb, or text holding JSON)
	kindTimestamptz             // ISO with a zone offset
	kindTimestamp               // ISO without a zone: read as UTC
)

// Built-in type OIDs (fixed in PostgreSQL's catalog).
const (
	oidInt2        = 21
	oidInt4        = 23
	oidInt8        = 20
	oidText        = 25
	oidVarchar     = 1043
	oidUUID        = 2950
	oidJSON        = 114
	oidJSONB       = 3802
	oidTimestamp   = 1114
	oidTimestamptz = 1184
)

// readable lists, per field, the base types it is read from and how.
var readable = [numFields][]struct {
	oid  uint32
	name string
	kind kind
}{
	fPosition:       {{oidInt8, "bigint", kindInt}, {oidInt4, "integer", kindInt}, {oidInt2, "smallint", kindInt}},
	fID:             {{oidUUID, "uuid", kindString}, {oidText, "text", kindString}, {oidVarchar, "varchar", kindString}, {oidInt8, "bigint", kindString}, {oidInt4, "integer", kindString}},
	fStreamID:       {{oidText, "text", kindString}, {oidVarchar, "varchar", kindString}, {oidUUID, "uuid", kindString}, {oidInt8, "bigint", kindString}, {oidInt4, "integer", kindString}, {oidInt2, "smallint", kindString}},
	fStreamPosition: {{oidInt8, "bigint", kindInt}, {oidInt4, "integer", kindInt}, {oidInt2, "smallint", kindInt}},
	fType:           {{oidText, "text", kindString}, {oidVarchar, "varchar", kindString}},
	fData:           {{oidJSONB, "jsonb", kindDocument}, {oidJSON, "json", kindDocument}, {oidText, "text", kindDocument}, {oidVarchar, "varchar", kindDocument}},
	fMetadata:       {{oidJSONB, "jsonb", kindDocument}, {oidJSON, "json", kindDocument}, {oidText, "text", kindDocument}, {oidVarchar, "varchar", kindDocument}},
	fOccurredAt:     {{oidTimestamptz, "timestamptz", kindTimestamptz}, {oidTimestamp, "timestamp", kindTimestamp}},
}

// builtin returns the name of oid when it is one of the base types some
// field reads, so that no catalog lookup is needed to know its base type.
func builtin(oid uint32) (name string, ok bool) {
	for _, rs := range readable {
		for _, r := range rs {
			if r.oid == oid {
				return r.name, true
			}
		}
	}
	return "", false
}

// ErrUnreadable is wrapped by the errors of an events table pgscribe
// cannot read: a mapped column missing, or of a type it cannot read. It is
// a deployment error, not an event's: nothing gets past it until the
// table or [source.columns] is fixed.
var ErrUnreadable = errors.New("events table cannot be read")

// ReadableType says whether the event field named key in [source.columns]
// ("position", "occurred_at", …) can be read from a column whose type,
// after domains, is base. When it cannot, want lists the types it can be
// read from.
func ReadableType(key string, base uint32) (ok bool, want string) {
	for f, k := range fieldKeys {
		if k != key {
			continue
		}
		_, err := kindOf(f, base)
		if err == nil {
			return true, ""
		}
		return false, accepted(f)
	}
	return false, ""
}

func accepted(f int) string {
	names := make([]string, len(readable[f]))
	for i, r := range readable[f] {
		names[i] = r.name
	}
	return strings.Join(names, ", ")
}

func kindOf(f int, base uint32) (kind, error) {
	for _, r := range readable[f] {
		if r.oid == base {
			return r.kind, nil
		}
	}
	return kindAbsent, fmt.Errorf("%s is read from %s only", fieldKeys[f], accepted(f))
}

// decoder turns the text of an events row, field by field, into an event.
type decoder struct {
	kinds [numFields]kind
}

// columnType is one mapped column as the catalog or the stream names it.
type columnType struct {
	name string
	typ  string // shown, for messages ("timestamp(3) without time zone", or an OID)
	base uint32 // type OID after domains
}

// newDecoder checks the mapped columns' types and builds their decoder;
// cols has the column of each mapped field (zero name for an unmapped
// optional one). The error wraps ErrUnreadable and names every column at
// fault.
func newDecoder(table string, cols [numFields]columnType) (*decoder, error) {
	d := &decoder{}
	var errs []error
	for f, c := range cols {
		if c.name == "" {
			if !optional[f] {
				errs = append(errs, fmt.Errorf("column for %s is not mapped", fieldKeys[f]))
			}
			continue
		}
		k, err := kindOf(f, c.base)
		if err != nil {
			errs = append(errs, fmt.Errorf("column %q (source.columns.%s) has type %s: %w", c.name, fieldKeys[f], c.typ, err))
			continue
		}
		d.kinds[f] = k
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreadable, table, errors.Join(errs...))
	}
	return d, nil
}

// event decodes one row. vals holds each mapped field's text, nil for SQL
// NULL; unmapped fields are ignored. A NULL position, stream id, stream
// position or type cannot be accounted for and is an error (the row
// breaks the events table's contract); a NULL id is "", a NULL document
// {} (RawData nil), a NULL occurred_at the zero time. An occurred_at that
// does not fit Go's time (infinity, years past 9999 or BC) makes the
// event fail decoding, which dead-letters it like a document that is not
// JSON, rather than stop the stream.
func (d *decoder) event(vals *[numFields][]byte) (*event.Event, error) {
	ev := &event.Event{}
	var err error
	if ev.Position, err = d.integer(vals, fPosition); err != nil {
		return nil, err
	}
	at := func(e error) error { return fmt.Errorf("event at position %d: %w", ev.Position, e) }
	if ev.StreamPosition, err = d.integer(vals, fStreamPosition); err != nil {
		return nil, at(err)
	}
	if ev.StreamID, err = d.required(vals, fStreamID); err != nil {
		return nil, at(err)
	}
	if ev.Type, err = d.required(vals, fType); err != nil {
		return nil, at(err)
	}
	if d.kinds[fID] != kindAbsent {
		ev.ID = string(vals[fID])
	}
	// vals point into the connection's read buffer: keep copies.
	if d.kinds[fData] != kindAbsent && vals[fData] != nil {
		ev.RawData = bytes.Clone(vals[fData])
	}
	if d.kinds[fMetadata] != kindAbsent && vals[fMetadata] != nil {
		ev.RawMetadata = bytes.Clone(vals[fMetadata])
	}
	if k := d.kinds[fOccurredAt]; k != kindAbsent && vals[fOccurredAt] != nil {
		s := string(vals[fOccurredAt])
		if k == kindTimestamp {
			ev.OccurredAt, err = parseTimestamp(s)
		} else {
			ev.OccurredAt, err = parseTimestamptz(s)
		}
		if err != nil {
			ev.Invalid = &event.DecodeError{Err: fmt.Errorf("event %s occurred_at: %w", ev.ID, err)}
		}
	}
	return ev, nil
}

func (d *decoder) required(vals *[numFields][]byte, f int) (string, error) {
	if vals[f] == nil {
		return "", fmt.Errorf("%s is NULL", fieldKeys[f])
	}
	return string(vals[f]), nil
}

func (d *decoder) integer(vals *[numFields][]byte, f int) (int64, error) {
	s, err := d.required(vals, f)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q: %w", fieldKeys[f], s, err)
	}
	return n, nil
}

// parseTimestamptz parses the ISO text form of timestamptz.
func parseTimestamptz(s string) (time.Time, error) {
	for _, layout := range []string{"2006-01-02 15:04:05.999999999-07", "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999-07:00:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("parse timestamptz %q", s)
}

// parseTimestamp parses the ISO text form of timestamp without time zone
// as UTC: what event stores that use it write (message-db stores
// now() AT TIME ZONE 'utc', SQLStreamStore a UTC clock), and the reading
// that does not depend on any server or session setting.
func parseTimestamp(s string) (time.Time, error) {
	t, err := time.ParseInLocation("2006-01-02 15:04:05.999999999", s, time.UTC)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse timestamp %q", s)
	}
	return t, nil
}

// typeLookup resolves what the stream alone cannot tell: the base type of
// a domain, and whether a relation is a partition of the events table.
type typeLookup interface {
	baseType(ctx context.Context, oid uint32) (base uint32, shown string, err error)
	partitionOf(ctx context.Context, relid uint32, table string) (bool, error)
}
