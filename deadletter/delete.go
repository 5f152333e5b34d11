package deadletter

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Delete removes every dead letter of a projection version and returns how
// many it removed. `pgscribe reset -dead-letters` calls it in the reset's
// transaction: a rebuild dead-letters the same events again, so the old rows
// would only count them twice.
func Delete(ctx context.Context, q Querier, schema, projection string, version int64) (int64, error) {
	n, err := deleteVersion(ctx, q, schema, "dead_letters", projection, version)
	if err != nil {
		return 0, fmt.Errorf("delete dead letters: %w", err)
	}
	return n, nil
}

// DeleteParked removes every held event of a projection version (reset:
// the rebuild reads them again).
func DeleteParked(ctx context.Context, q Querier, schema, projection string, version int64) (int64, error) {
	n, err := deleteVersion(ctx, q, schema, "parked_events", projection, version)
	if err != nil {
		return 0, fmt.Errorf("delete parked events: %w", err)
	}
	return n, nil
}

func deleteVersion(ctx context.Context, q Querier, schema, table, projection string, version int64) (int64, error) {
	tag, err := q.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, table}.Sanitize()+
		" WHERE projection = $1 AND version = $2", projection, version)
	return tag.RowsAffected(), err
}
