// Package deadletter writes and reads the dead_letters table: events a
// projection could not apply (a rule error, a fail rule, or an
// integrity-class SQL error pinned on the event), kept with the event as it
// was and the reason.
//
// Insert runs inside the caller's batch transaction, next to the cursor
// advance that accounts for the events, so a dead letter exists exactly when
// its event is counted as dead-lettered.
package deadletter

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/event"
)

// Querier is what this package needs from a database handle (Insert uses
// Exec, List and GetStats Query): pgx.Tx, *pgx.Conn, *pgxpool.Pool and
// *pgxpool.Conn satisfy it.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Row is one dead letter. EventData and EventMetadata are raw JSON (nil is
// stored as NULL). ID and DeadLetteredAt are set by the database; Insert
// ignores them.
type Row struct {
	ID             int64
	Projection     string
	Version        int64
	Position       int64
	EventID        string
	StreamID       string
	StreamPosition int64
	EventType      string
	ErrorKind      string
	ErrorMessage   string
	EventData      []byte
	EventMetadata  []byte
	OccurredAt     time.Time // zero when unknown (stored as NULL)
	DeadLetteredAt time.Time
}

// FromEvent builds the dead letter of ev for a projection version. The event's
// original JSON text is kept when it has it; otherwise its decoded documents
// are encoded again. A document that jsonb cannot hold (the text of a json
// or text events column that is not JSON: a "decode" dead letter) is kept
// as a JSON string of its text, so that the dead letter can be written and
// shows what the event held.
func FromEvent(projection string, version int64, ev *event.Event, kind, message string) Row {
	return Row{
		Projection:     projection,
		Version:        version,
		Position:       ev.Position,
		EventID:        ev.ID,
		StreamID:       ev.StreamID,
		StreamPosition: ev.StreamPosition,
		EventType:      ev.Type,
		ErrorKind:      kind,
		ErrorMessage:   message,
		EventData:      rawJSON(ev.RawData, ev.Data),
		EventMetadata:  rawJSON(ev.RawMetadata, ev.Metadata),
		OccurredAt:     ev.OccurredAt,
	}
}

func rawJSON(raw []byte, doc map[string]any) []byte {
	if len(raw) > 0 {
		if json.Valid(raw) && !jsonbRejects(raw) {
			return raw
		}
		// Not JSON, or JSON that jsonb rejects: the text as a JSON string
		// (invalid UTF-8 becomes U+FFFD).
		b, _ := json.Marshal(string(raw))
		return b
	}
	if doc == nil {
		return nil
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil // decoded jsonb always encodes; keep the row rather than fail the batch
	}
	return b
}

// jsonbRejects reports whether valid JSON has an escape that jsonb does not
// take: \u0000, or (erring on the safe side) any surrogate escape, since a
// lone one is refused. Such text comes only from a json or text column.
func jsonbRejects(raw []byte) bool {
	for i := bytes.Index(raw, []byte(`\u`)); i >= 0 && i+6 <= len(raw); {
		// An escaped backslash before the u is not an escape; counting the
		// backslashes in front tells.
		n := 0
		for j := i; j >= 0 && raw[j] == '\\'; j-- {
			n++
		}
		if n%2 == 1 {
			v, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
			if err == nil && (v == 0 || (v >= 0xD800 && v <= 0xDFFF)) {
				return true
			}
		}
		k := bytes.Index(raw[i+2:], []byte(`\u`))
		if k < 0 {
			break
		}
		i += 2 + k
	}
	return false
}

// Insert writes rows in one statement. Pass the batch transaction. Error
// kinds and messages are made storable (valid UTF-8, no NUL bytes, which text
// columns reject) so that a strange error message cannot fail the batch.
func Insert(ctx context.Context, q Querier, schema string, rows []Row) error {
	if err := insert(ctx, q, InsertSQL(schema), rows); err != nil {
		return fmt.Errorf("insert dead letters: %w", err)
	}
	return nil
}

// insert runs sql, a statement over the unnested columns of rows (as
// InsertSQL's), for rows.
func insert(ctx context.Context, q Querier, sql string, rows []Row) error {
	if len(rows) == 0 {
		return nil
	}
	n := len(rows)
	var (
		proj, eventID, streamID, typ = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		kind, msg                    = make([]string, n), make([]string, n)
		version, pos, spos           = make([]int64, n), make([]int64, n), make([]int64, n)
		data, meta                   = make([]*string, n), make([]*string, n)
		occurred                     = make([]*time.Time, n)
	)
	for i := range rows {
		r := &rows[i]
		proj[i], version[i], pos[i] = r.Projection, r.Version, r.Position
		eventID[i], streamID[i], spos[i], typ[i] = r.EventID, r.StreamID, r.StreamPosition, r.EventType
		kind[i], msg[i] = storable(r.ErrorKind), storable(r.ErrorMessage)
		data[i], meta[i] = jsonText(r.EventData), jsonText(r.EventMetadata)
		if !r.OccurredAt.IsZero() {
			occurred[i] = &r.OccurredAt
		}
	}
	_, err := q.Exec(ctx, sql, proj, version, pos, eventID, streamID, spos, typ, kind, msg, data, meta, occurred)
	return err
}

func storable(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "")
}

func jsonText(b []byte) *string {
	if len(b) == 0 {
		return nil
	}
	s := string(b)
	return &s
}

// Filter selects dead letters. Zero fields match anything.
type Filter struct {
	Projection string
	Version    int64 // 0 = any version
	StreamID   string
	ErrorKind  string
	IDs        []int64 // only these ids (none: any)
	AfterID    int64   // List only: rows with a larger id (paging: pass the last id seen)
	Limit      int     // List only: default 100, at most 10000
}

// Paging bounds of List.
const (
	DefaultLimit = 100
	MaxLimit     = 10000
)

// where renders the filter's conditions (without paging) and their arguments.
func (f Filter) where() (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, arg any) {
		args = append(args, arg)
		conds = append(conds, strings.Replace(cond, "?", "$"+strconv.Itoa(len(args)), 1))
	}
	if f.Projection != "" {
		add("projection = ?", f.Projection)
	}
	if f.Version != 0 {
		add("version = ?", f.Version)
	}
	if f.StreamID != "" {
		add("stream_id = ?", f.StreamID)
	}
	if f.ErrorKind != "" {
		add("error_kind = ?", f.ErrorKind)
	}
	if len(f.IDs) > 0 {
		add("id = ANY(?)", f.IDs)
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

// List returns the dead letters matching f in id order, at most f.Limit of
// them, starting after f.AfterID.
func List(ctx context.Context, q Querier, schema string, f Filter) ([]Row, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	limit = min(limit, MaxLimit)
	where, args := f.where()
	args = append(args, f.AfterID, limit)
	page := "id > $" + strconv.Itoa(len(args)-1)
	if where == "" {
		where = " WHERE " + page
	} else {
		where += " AND " + page
	}
	sql := `SELECT ` + rowColumns + `
FROM ` + pgx.Identifier{schema, "dead_letters"}.Sanitize() + where +
		" ORDER BY id LIMIT $" + strconv.Itoa(len(args))
	return queryRows(ctx, q, "list dead letters", sql, args...)
}

// rowColumns are the columns scanRows reads, in its order.
const rowColumns = `id, projection, version, position, event_id, stream_id, stream_position, event_type,
  error_kind, error_message, event_data::text, event_metadata::text, occurred_at, dead_lettered_at`

// scanRows reads rows of rowColumns.
// queryRows runs a query of the columns scanRows reads and scans its rows;
// what says in errors which read failed.
func queryRows(ctx context.Context, q Querier, what, sql string, args ...any) ([]Row, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

func scanRows(rows pgx.Rows) ([]Row, error) {
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var r Row
		var data, meta *string
		var occurred *time.Time
		if err := rows.Scan(&r.ID, &r.Projection, &r.Version, &r.Position, &r.EventID, &r.StreamID,
			&r.StreamPosition, &r.EventType, &r.ErrorKind, &r.ErrorMessage, &data, &meta, &occurred,
			&r.DeadLetteredAt); err != nil {
			return nil, err
		}
		if data != nil {
			r.EventData = []byte(*data)
		}
		if meta != nil {
			r.EventMetadata = []byte(*meta)
		}
		if occurred != nil {
			r.OccurredAt = *occurred
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// KindCount is the number of dead letters of one error kind.
type KindCount struct {
	Kind  string
	Count int64
}

// ProjCount is the number of dead letters of one projection version.
type ProjCount struct {
	Projection     string
	Version, Count int64
}

// Stats summarises the dead letters matching a filter. ByKind is ordered by
// count (largest first) then kind; ByProjection by projection and version.
// Oldest and Newest are dead_lettered_at bounds, nil when there are none.
type Stats struct {
	Total        int64
	ByKind       []KindCount
	ByProjection []ProjCount
	Oldest       *time.Time
	Newest       *time.Time
}

// GetStats summarises the dead letters matching f in one query (AfterID and
// Limit are ignored).
func GetStats(ctx context.Context, q Querier, schema string, f Filter) (Stats, error) {
	where, args := f.where()
	// One scan of the matching rows, three groupings: by kind, by projection
	// version, and the grand total. GROUPING() tells them apart.
	sql := `SELECT GROUPING(error_kind), GROUPING(projection, version),
  coalesce(error_kind, ''), coalesce(projection, ''), coalesce(version, 0),
  count(*), min(dead_lettered_at), max(dead_lettered_at)
FROM ` + pgx.Identifier{schema, "dead_letters"}.Sanitize() + where + `
GROUP BY GROUPING SETS ((error_kind), (projection, version), ())
ORDER BY 1, 2, CASE WHEN GROUPING(error_kind) = 0 THEN count(*) END DESC, 3, 4, 5`
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return Stats{}, fmt.Errorf("dead letter stats: %w", err)
	}
	defer rows.Close()
	var st Stats
	for rows.Next() {
		var gKind, gProj int32
		var kind, proj string
		var version, count int64
		var oldest, newest *time.Time
		if err := rows.Scan(&gKind, &gProj, &kind, &proj, &version, &count, &oldest, &newest); err != nil {
			return Stats{}, fmt.Errorf("dead letter stats: %w", err)
		}
		switch {
		case gKind == 0:
			st.ByKind = append(st.ByKind, KindCount{Kind: kind, Count: count})
		case gProj == 0:
			st.ByProjection = append(st.ByProjection, ProjCount{Projection: proj, Version: version, Count: count})
		default:
			st.Total, st.Oldest, st.Newest = count, oldest, newest
		}
	}
	if err := rows.Err(); err != nil {
		return Stats{}, fmt.Errorf("dead letter stats: %w", err)
	}
	return st, nil
}

// InsertSQL is the statement Insert runs, for a caller that prepares it.
//
// WITH ORDINALITY and ORDER BY make ids follow the order of rows, so List
// returns a batch's dead letters in the order they happened.
func InsertSQL(schema string) string {
	return "INSERT INTO " + pgx.Identifier{schema, "dead_letters"}.Sanitize() + ` (projection, version, position,
  event_id, stream_id, stream_position, event_type, error_kind, error_message,
  event_data, event_metadata, occurred_at)
SELECT u.projection, u.version, u.position, u.event_id, u.stream_id, u.stream_position, u.event_type,
  u.error_kind, u.error_message, u.event_data::jsonb, u.event_metadata::jsonb, u.occurred_at
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::text[],
  $8::text[], $9::text[], $10::text[], $11::text[], $12::timestamptz[]) WITH ORDINALITY
  AS u (projection, version, position, event_id, stream_id, stream_position, event_type,
        error_kind, error_message, event_data, event_metadata, occurred_at, ord)
ORDER BY u.ord`
}

// Counts returns the number of dead letters of every projection version
// that has any, in one statement: what status shows per version, without
// one query (and one visit of each version's rows) per version.
func Counts(ctx context.Context, q Querier, schema string) (map[event.VersionKey]int64, error) {
	rows, err := q.Query(ctx, `SELECT projection, version, count(*) FROM `+
		pgx.Identifier{schema, "dead_letters"}.Sanitize()+` GROUP BY projection, version`)
	if err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	defer rows.Close()
	out := map[event.VersionKey]int64{}
	for rows.Next() {
		var k event.VersionKey
		var n int64
		if err := rows.Scan(&k.Projection, &k.Version, &n); err != nil {
			return nil, fmt.Errorf("count dead letters: %w", err)
		}
		out[k] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count dead letters: %w", err)
	}
	return out, nil
}
