package cursor

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// Outcome names one of a cursor's counts.
type Outcome string

// The counts an event is accounted in.
const (
	OutApplied      Outcome = "applied"
	OutSkipped      Outcome = "skipped"
	OutDeadLettered Outcome = "dead_lettered"
	OutParked       Outcome = "parked"
)

// Move moves n events of a stream from one count to another, leaving its
// position alone: a retried dead letter becomes applied (or skipped), a
// discarded one skipped. Conservation (events = applied + skipped +
// dead_lettered) holds before and after. The counts only add up, so a
// batch advancing the same cursor concurrently commutes with it. A stream
// without a cursor (a reset that kept the version's dead letters) has no
// counts to move.
func Move(ctx context.Context, q event.Querier, schema, projection string, version int64, streamID string, from, to Outcome, n int64) error {
	if from == to || n == 0 {
		return nil
	}
	set := func(o Outcome, sign string) string {
		c := pgx.Identifier{string(o)}.Sanitize()
		return c + " = " + c + " " + sign + " $4"
	}
	_, err := q.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "cursors"}.Sanitize()+" SET "+
		set(from, "-")+", "+set(to, "+")+", updated_at = now() WHERE projection = $1 AND version = $2 AND stream_id = $3",
		projection, version, streamID, n)
	if err != nil {
		return fmt.Errorf("move cursor counts of stream %s: %w", streamID, err)
	}
	return nil
}

// Park parks a stream from position since on: a held event failed again
// when released and is now the stream's dead letter.
func Park(ctx context.Context, q event.Querier, schema, projection string, version int64, streamID string, since int64) error {
	_, err := q.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "cursors"}.Sanitize()+
		" SET parked_since = $4, updated_at = now() WHERE projection = $1 AND version = $2 AND stream_id = $3",
		projection, version, streamID, since)
	if err != nil {
		return fmt.Errorf("park stream %s: %w", streamID, err)
	}
	return nil
}

// Unpark releases a stream once it holds no event and has no dead letter
// left; it reports whether the stream is released.
func Unpark(ctx context.Context, q event.Querier, schema, projection string, version int64, streamID string) (bool, error) {
	var parked bool
	err := q.QueryRow(ctx, "UPDATE "+pgx.Identifier{schema, "cursors"}.Sanitize()+` AS c
SET parked_since = CASE WHEN c.parked = 0 AND NOT EXISTS (SELECT 1 FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+` AS d
    WHERE d.projection = c.projection AND d.version = c.version AND d.stream_id = c.stream_id) THEN NULL ELSE c.parked_since END,
  updated_at = now()
WHERE c.projection = $1 AND c.version = $2 AND c.stream_id = $3 RETURNING c.parked_since IS NOT NULL`,
		projection, version, streamID).Scan(&parked)
	if errors.Is(err, pgx.ErrNoRows) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("release stream %s: %w", streamID, err)
	}
	return !parked, nil
}
