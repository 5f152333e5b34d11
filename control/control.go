// Package control reads and writes the operator controls of projection
// versions in the engine schema: pause and resume (the controls table) and
// queued dead-letter retries (the retry_requests table). The commands write
// them; the node holding a projection version's lock polls them, obeys and
// records on each retry request which node ran it, when, and its counts
// (StartRetry, FinishRetry), so a control holds across restarts and
// failovers.
package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// State is a projection version's controls as stored.
type State struct {
	PausedAt    *time.Time // set while paused
	PauseReason string
	PausedBy    string
	// ResumeSeq grows with every resume; a halted holder retries when it
	// sees it move.
	ResumeSeq int64
	// PendingRetry is the id of the oldest retry request not done yet, 0
	// when there is none.
	PendingRetry int64
}

// Paused reports whether the version is paused.
func (s State) Paused() bool { return s.PausedAt != nil }

func table(schema, name string) string { return pgx.Identifier{schema, name}.Sanitize() }

// Load reads the controls of a projection version: one statement, what the
// active node runs every poll (two index lookups).
func Load(ctx context.Context, q event.Querier, schema, projection string, version int64) (State, error) {
	var s State
	var reason, by *string
	err := q.QueryRow(ctx, `SELECT c.paused_at, c.pause_reason, c.paused_by, coalesce(c.resume_seq, 0),
  coalesce((SELECT min(id) FROM `+table(schema, "retry_requests")+`
    WHERE projection = $1 AND version = $2 AND done_at IS NULL), 0)
FROM (SELECT 1) AS one LEFT JOIN `+table(schema, "controls")+` AS c ON c.projection = $1 AND c.version = $2`,
		projection, version).Scan(&s.PausedAt, &reason, &by, &s.ResumeSeq, &s.PendingRetry)
	if err != nil {
		return State{}, fmt.Errorf("load controls: %w", err)
	}
	if reason != nil {
		s.PauseReason = *reason
	}
	if by != nil {
		s.PausedBy = *by
	}
	return s, nil
}

// Pause marks a projection version paused. It reports false when it was
// paused already (the first pause's time and reason are kept).
func Pause(ctx context.Context, q event.Querier, schema, projection string, version int64, reason, by string) (bool, error) {
	tag, err := q.Exec(ctx, `INSERT INTO `+table(schema, "controls")+` AS c (projection, version, paused_at, pause_reason, paused_by)
VALUES ($1, $2, now(), $3, $4)
ON CONFLICT (projection, version) DO UPDATE SET paused_at = now(), pause_reason = $3, paused_by = $4, updated_at = now()
  WHERE c.paused_at IS NULL`, projection, version, reason, by)
	if err != nil {
		return false, fmt.Errorf("pause: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// Resume clears a pause and bumps resume_seq, which also wakes a halted
// holder. It reports whether the version was paused.
func Resume(ctx context.Context, q event.Querier, schema, projection string, version int64) (wasPaused bool, err error) {
	// old reads the row as the statement's snapshot has it, before the
	// update (FOR UPDATE would skip the row the update changed).
	err = q.QueryRow(ctx, `WITH old AS (
  SELECT paused_at FROM `+table(schema, "controls")+` WHERE projection = $1 AND version = $2)
INSERT INTO `+table(schema, "controls")+` AS c (projection, version, resume_seq)
VALUES ($1, $2, 1)
ON CONFLICT (projection, version) DO UPDATE SET paused_at = NULL, pause_reason = NULL, paused_by = NULL,
  resume_seq = c.resume_seq + 1, updated_at = now()
RETURNING coalesce((SELECT paused_at IS NOT NULL FROM old), false)`, projection, version).Scan(&wasPaused)
	if err != nil {
		return false, fmt.Errorf("resume: %w", err)
	}
	return wasPaused, nil
}

// Retry is a queued dead-letter retry: its selectors and, once run, what
// became of it.
type Retry struct {
	ID          int64
	Projection  string
	Version     int64
	IDs         []int64 // none: any
	ErrorKind   string  // empty: any
	StreamID    string  // empty: any
	Skip        bool    // deadletters skip: drop the rows and release their streams
	RequestedBy string
	RequestedAt time.Time
	Node        string
	StartedAt   *time.Time
	DoneAt      *time.Time
	Selected    int64
	Applied     int64
	Failed      int64
	Error       string
}

func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// RequestRetry queues a retry and returns its id.
func RequestRetry(ctx context.Context, q event.Querier, schema string, r Retry) (int64, error) {
	var ids []int64
	if len(r.IDs) > 0 {
		ids = r.IDs
	}
	var id int64
	err := q.QueryRow(ctx, `INSERT INTO `+table(schema, "retry_requests")+`
  (projection, version, ids, error_kind, stream_id, skip, requested_by) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id`,
		r.Projection, r.Version, ids, nullable(r.ErrorKind), nullable(r.StreamID), r.Skip, r.RequestedBy).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("queue retry: %w", err)
	}
	return id, nil
}

// ErrNoRetry: no retry request has that id.
var ErrNoRetry = errors.New("no such retry request")

// LoadRetry reads one retry request.
func LoadRetry(ctx context.Context, q event.Querier, schema string, id int64) (Retry, error) {
	var r Retry
	var kind, stream, node, errText *string
	var selected, applied, failed *int64
	err := q.QueryRow(ctx, `SELECT id, projection, version, coalesce(ids, '{}'), error_kind, stream_id, skip, requested_by,
  requested_at, node, started_at, done_at, selected, applied, failed, error
FROM `+table(schema, "retry_requests")+` WHERE id = $1`, id).Scan(&r.ID, &r.Projection, &r.Version, &r.IDs,
		&kind, &stream, &r.Skip, &r.RequestedBy, &r.RequestedAt, &node, &r.StartedAt, &r.DoneAt, &selected, &applied, &failed, &errText)
	if errors.Is(err, pgx.ErrNoRows) {
		return Retry{}, fmt.Errorf("retry request %d: %w", id, ErrNoRetry)
	}
	if err != nil {
		return Retry{}, fmt.Errorf("load retry request: %w", err)
	}
	for _, p := range []struct {
		dst *string
		src *string
	}{{&r.ErrorKind, kind}, {&r.StreamID, stream}, {&r.Node, node}, {&r.Error, errText}} {
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	for _, p := range []struct {
		dst *int64
		src *int64
	}{{&r.Selected, selected}, {&r.Applied, applied}, {&r.Failed, failed}} {
		if p.src != nil {
			*p.dst = *p.src
		}
	}
	return r, nil
}

// StartRetry records that node runs the request.
func StartRetry(ctx context.Context, q event.Querier, schema string, id int64, node string) error {
	_, err := q.Exec(ctx, `UPDATE `+table(schema, "retry_requests")+` SET node = $2, started_at = now() WHERE id = $1`, id, node)
	if err != nil {
		return fmt.Errorf("start retry request: %w", err)
	}
	return nil
}

// FinishRetry records what became of a request; errText non-empty when it
// failed as a whole.
func FinishRetry(ctx context.Context, q event.Querier, schema string, id, selected, applied, failed int64, errText string) error {
	_, err := q.Exec(ctx, `UPDATE `+table(schema, "retry_requests")+`
SET done_at = now(), selected = $2, applied = $3, failed = $4, error = $5 WHERE id = $1`,
		id, selected, applied, failed, nullable(errText))
	if err != nil {
		return fmt.Errorf("finish retry request: %w", err)
	}
	return nil
}

// PendingRetries counts a version's retry requests not done yet.
func PendingRetries(ctx context.Context, q event.Querier, schema, projection string, version int64) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT count(*) FROM `+table(schema, "retry_requests")+`
WHERE projection = $1 AND version = $2 AND done_at IS NULL`, projection, version).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count retry requests: %w", err)
	}
	return n, nil
}
