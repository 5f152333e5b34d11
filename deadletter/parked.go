package deadletter

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// This file holds the parked_events table (on_error = "park"): the events a
// parked stream holds behind its dead letter, kept as a dead letter keeps
// its event (a Row without error), in the stream's order.

// Park writes held events in one statement. Pass the batch transaction.
func Park(ctx context.Context, q Querier, schema string, rows []Row) error {
	sql := "INSERT INTO " + pgx.Identifier{schema, "parked_events"}.Sanitize() + ` (projection, version, position,
  event_id, stream_id, stream_position, event_type, event_data, event_metadata, occurred_at)
SELECT u.projection, u.version, u.position, u.event_id, u.stream_id, u.stream_position, u.event_type,
  u.event_data::jsonb, u.event_metadata::jsonb, u.occurred_at
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::bigint[], $7::text[],
  $8::text[], $9::text[], $10::text[], $11::text[], $12::timestamptz[])
  AS u (projection, version, position, event_id, stream_id, stream_position, event_type,
        error_kind, error_message, event_data, event_metadata, occurred_at)`
	if err := insert(ctx, q, sql, rows); err != nil {
		return fmt.Errorf("park events: %w", err)
	}
	return nil
}

// Held returns up to limit events a stream holds, in stream order (ID,
// ErrorKind, ErrorMessage and DeadLetteredAt are zero).
func Held(ctx context.Context, q Querier, schema, projection string, version int64, streamID string, limit int) ([]Row, error) {
	return queryRows(ctx, q, "read parked events", `SELECT 0::bigint, projection, version, position, event_id, stream_id, stream_position, event_type,
  '', '', event_data::text, event_metadata::text, occurred_at, parked_at
FROM `+pgx.Identifier{schema, "parked_events"}.Sanitize()+`
WHERE projection = $1 AND version = $2 AND stream_id = $3 ORDER BY stream_position LIMIT $4`, projection, version, streamID, limit)
}

// Unhold deletes one held event; false when it was gone already.
func Unhold(ctx context.Context, q Querier, schema string, r Row) (bool, error) {
	tag, err := q.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, "parked_events"}.Sanitize()+
		" WHERE projection = $1 AND version = $2 AND stream_id = $3 AND stream_position = $4",
		r.Projection, r.Version, r.StreamID, r.StreamPosition)
	if err != nil {
		return false, fmt.Errorf("release parked event: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ParkedStream is a stream held behind a dead letter: how many events it
// holds and since when (the oldest held event's parked_at).
type ParkedStream struct {
	StreamID       string
	Held           int64
	FirstPosition  int64 // the stream position of its first held event
	Since, LastAdd time.Time
}

// ParkedStreams lists up to limit streams of a projection version that
// hold parked events, by stream id.
func ParkedStreams(ctx context.Context, q Querier, schema, projection string, version int64, limit int) ([]ParkedStream, error) {
	scan := func(r pgx.CollectableRow) (ParkedStream, error) {
		var p ParkedStream
		err := r.Scan(&p.StreamID, &p.Held, &p.FirstPosition, &p.Since, &p.LastAdd)
		return p, err
	}
	return event.QueryRows(ctx, q, "read parked streams", scan, `SELECT stream_id, count(*), min(stream_position), min(parked_at), max(parked_at)
FROM `+pgx.Identifier{schema, "parked_events"}.Sanitize()+`
WHERE projection = $1 AND version = $2 GROUP BY stream_id ORDER BY stream_id LIMIT $3`, projection, version, limit)
}
