package cursor

import (
	"context"
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
