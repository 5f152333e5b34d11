// Package event holds the leaf types that flow through pgscribe's pipeline:
// a decoded source event, the write intents rules derive from it, and the
// log sequence number type used for ordering and acknowledgement. It imports
// nothing of pgscribe's own, so every stage can depend on it.
package event

import (
	"fmt"
	"time"
)

// LSN is a PostgreSQL write-ahead log position.
type LSN uint64

// String formats the LSN the way PostgreSQL does (for example 16/B374D848).
func (l LSN) String() string { return fmt.Sprintf("%X/%X", uint32(l>>32), uint32(l)) }

// ParseLSN parses PostgreSQL's textual LSN form (X/Y).
func ParseLSN(s string) (LSN, error) {
	var hi, lo uint32
	if _, err := fmt.Sscanf(s, "%X/%X", &hi, &lo); err != nil {
		return 0, fmt.Errorf("parse lsn %q: %w", s, err)
	}
	return LSN(uint64(hi)<<32 | uint64(lo)), nil
}

// Event is one row of the source events table, decoded.
//
// Data and Metadata are the decoded jsonb documents: objects become
// map[string]any, arrays []any, integral numbers int64 (exact), other numbers
// float64. RawData and RawMetadata keep the original JSON text for dead
// letters.
//
// ID is "" when the events table has no id column, OccurredAt the zero
// time when it has no occurred_at column or the row holds NULL there.
// Invalid, when set, is a field the source could not decode (an
// occurred_at of infinity, for example): DecodeDocuments returns it, so
// the event is dead-lettered rather than applied with a wrong value.
//
// CommitLSN and CommitTime come from the source transaction's commit as
// delivered by logical replication; both are zero for events read by the
// initial snapshot backfill.
type Event struct {
	Position       int64
	ID             string
	StreamID       string
	StreamPosition int64
	Type           string
	Data           map[string]any
	Metadata       map[string]any
	RawData        []byte
	RawMetadata    []byte
	OccurredAt     time.Time
	Invalid        *DecodeError

	CommitLSN  LSN
	CommitTime time.Time
}

// Column is one column assignment of an intent, in rule order.
type Column struct {
	Name  string
	Value any
}

// Intent is one write a rule derived from an event. Table may be schema
// qualified ("schema.table"); names are identifiers and must be quoted by
// whoever renders SQL. For OpSQL, SQL and Args are set and the other fields
// are empty.
type Intent struct {
	Rule string
	// RuleIndex is the rule's 0-based place in its projection: the
	// statements of a batch run in rule order, the same in every batch.
	RuleIndex int
	Op        Op
	Table     string
	Key       []Column
	Set       []Column
	Inc       []Column
	SQL       string
	Args      []any
	// DeadLetterIfMissing: the rule says if_missing = "dead_letter", so an
	// update or delete that matches no row dead-letters the event.
	DeadLetterIfMissing bool
}

// VersionKey names a projection version, as a map key (status reads some
// figures of every version in one query and looks each one up).
type VersionKey struct {
	Projection string
	Version    int64
}
