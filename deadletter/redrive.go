package deadletter

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// This file holds what `pgscribe deadletters retry` and `discard` do to the
// table: read the selected rows in stream order, remove a row once its
// event applied, record a new reason when it failed again, and discard.

// StreamOrder pages the rows of f in per-stream position order (stream_id,
// stream_position, id), limit rows after the key after (zero: from the
// start). f's AfterID and Limit are ignored.
func StreamOrder(ctx context.Context, q Querier, schema string, f Filter, after Row, limit int) ([]Row, error) {
	f.AfterID, f.Limit = 0, 0
	where, args := f.where()
	args = append(args, after.StreamID, after.StreamPosition, after.ID, limit)
	n := len(args)
	page := "(stream_id, stream_position, id) > ($" + strconv.Itoa(n-3) + ", $" + strconv.Itoa(n-2) + ", $" + strconv.Itoa(n-1) + ")"
	if where == "" {
		where = " WHERE " + page
	} else {
		where += " AND " + page
	}
	return queryRows(ctx, q, "read dead letters", `SELECT `+rowColumns+` FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+where+
		" ORDER BY stream_id, stream_position, id LIMIT $"+strconv.Itoa(n), args...)
}

// Event rebuilds the event a dead letter holds, with its original JSON as
// raw documents (the rules decode what they read).
func (r Row) Event() *event.Event {
	return &event.Event{Position: r.Position, ID: r.EventID, StreamID: r.StreamID, StreamPosition: r.StreamPosition,
		Type: r.EventType, RawData: r.EventData, RawMetadata: r.EventMetadata, OccurredAt: r.OccurredAt}
}

// Remove deletes one dead letter; false when it was gone already (retried
// or discarded meanwhile).
func Remove(ctx context.Context, q Querier, schema string, id int64) (bool, error) {
	tag, err := q.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, "dead_letters"}.Sanitize()+" WHERE id = $1", id)
	if err != nil {
		return false, fmt.Errorf("remove dead letter %d: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// Refail records why a retried dead letter failed again.
func Refail(ctx context.Context, q Querier, schema string, id int64, kind, message string) error {
	_, err := q.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "dead_letters"}.Sanitize()+
		" SET error_kind = $2, error_message = $3, dead_lettered_at = now() WHERE id = $1", id, kind, storable(message))
	if err != nil {
		return fmt.Errorf("record dead letter %d failed again: %w", id, err)
	}
	return nil
}

// Discarded is how many dead letters of one stream of a projection version
// a discard removed.
type Discarded struct {
	Projection string
	Version    int64
	StreamID   string
	Count      int64
}

// Discard deletes the dead letters matching f (AfterID and Limit ignored)
// and returns how many it removed per projection version and stream.
func Discard(ctx context.Context, q Querier, schema string, f Filter) ([]Discarded, error) {
	f.AfterID, f.Limit = 0, 0
	where, args := f.where()
	scan := func(r pgx.CollectableRow) (Discarded, error) {
		var d Discarded
		err := r.Scan(&d.Projection, &d.Version, &d.StreamID, &d.Count)
		return d, err
	}
	return event.QueryRows(ctx, q, "discard dead letters", scan, `WITH gone AS (DELETE FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+where+`
  RETURNING projection, version, stream_id)
SELECT projection, version, stream_id, count(*) FROM gone GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`, args...)
}
