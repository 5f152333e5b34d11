package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// This file is the rest of what leader/ owns besides taking the lock: the
// leases table (its halt columns and reading a row) and finding which
// backend holds a projection version's advisory lock.

// Row is a projection version's row in the leases table.
type Row struct {
	Node       string
	Epoch      int64
	Acquired   time.Time
	HaltedAt   *time.Time // set while the holder is halted
	HaltReason *string
}

func leasesTable(schema string) string { return pgx.Identifier{schema, "leases"}.Sanitize() }

// Load reads the lease row of a projection version; false when there is
// none (the version never ran).
func Load(ctx context.Context, q event.Querier, schema, projection string, version int64) (Row, bool, error) {
	var r Row
	err := q.QueryRow(ctx, `SELECT node, epoch, acquired_at, halted_at, halt_reason FROM `+leasesTable(schema)+
		` WHERE projection = $1 AND version = $2`, projection, version).Scan(&r.Node, &r.Epoch, &r.Acquired, &r.HaltedAt, &r.HaltReason)
	if errors.Is(err, pgx.ErrNoRows) {
		return Row{}, false, nil
	}
	if err != nil {
		return Row{}, false, fmt.Errorf("load lease: %w", err)
	}
	return r, true, nil
}

// RecordHalt records on the lease row, if the lease is still this one,
// that its holder halted and why, for `pgscribe status`.
func (l *Lease) RecordHalt(ctx context.Context, q event.Querier, reason string) error {
	_, err := q.Exec(ctx, `UPDATE `+l.leases+` SET halted_at = now(), halt_reason = $4
			WHERE projection = $1 AND version = $2 AND epoch = $3`, l.projection, l.version, l.Epoch, reason)
	return err
}

// ClearHalt removes a recorded halt from the lease row, if the lease is
// still this one.
func (l *Lease) ClearHalt(ctx context.Context, q event.Querier) error {
	_, err := q.Exec(ctx, `UPDATE `+l.leases+` SET halted_at = NULL, halt_reason = NULL
			WHERE projection = $1 AND version = $2 AND epoch = $3 AND halted_at IS NOT NULL`, l.projection, l.version, l.Epoch)
	return err
}

// Holder returns the backend of q's database holding the advisory lock of
// a projection version, 0 when none does. pg_try_advisory_lock(bigint)
// shows in pg_locks with the key's high 32 bits in classid, its low 32
// bits in objid and objsubid 1 (the two-int4 form uses objsubid 2), in the
// current database.
func Holder(ctx context.Context, q event.Querier, schema, projection string, version int64) (int32, error) {
	hi, lo := keyParts(Key(schema, projection, version))
	var pid int32
	err := q.QueryRow(ctx, `SELECT coalesce(min(pid), 0) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND classid = $1::bigint::oid AND objid = $2::bigint::oid`, hi, lo).Scan(&pid)
	if err != nil {
		return 0, fmt.Errorf("look up advisory lock: %w", err)
	}
	return pid, nil
}

// keyParts splits a bigint advisory lock key the way pg_locks shows it.
func keyParts(key int64) (classid, objid int64) {
	k := uint64(key)
	return int64(k >> 32), int64(k & 0xFFFFFFFF)
}
