// Package leader makes one node active per projection version: a
// PostgreSQL advisory lock held on a dedicated session, plus a lease epoch
// in the engine schema that every batch transaction verifies (fencing).
//
// The advisory lock decides who is active; the epoch makes that decision
// safe against a node that lost its lock but still has working connections
// (a network partition of only the lock session, a process frozen while its
// batch connections stay open). Acquiring bumps the epoch with an UPDATE of
// the lease row; every batch reads the row FOR SHARE and compares. The row
// lock orders the two: a takeover waits for an in-flight batch of the old
// owner to finish, and any batch of the old owner that starts after the
// bump sees the new epoch and rolls back.
package leader

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/apply"
)

// Lease is held by the active node of one projection version.
type Lease struct {
	conn       *pgx.Conn
	key        int64
	Epoch      int64
	schema     string
	projection string
	version    int64
	checkSQL   string
}

// Key derives the advisory lock key of a projection version.
func Key(schema, projection string, version int64) int64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "pgscribe\x00%s\x00%s\x00%d", schema, projection, version)
	return int64(h.Sum64())
}

// TryAcquire opens a dedicated session and tries the advisory lock. It
// returns (nil, nil) when another node holds it.
//
// leaseTimeout bounds the lock server-side: the session runs with
// idle_session_timeout = leaseTimeout, and Watch pings it well within that.
// A node that freezes (SIGSTOP, a stuck disk, a long pause) stops pinging,
// PostgreSQL ends its session, and the lock is free for a standby within
// leaseTimeout — whatever the frozen node's TCP stack still believes. When it
// wakes, its batches fail the epoch check.
func TryAcquire(ctx context.Context, url, schema, projection string, version int64, node string, leaseTimeout time.Duration) (*Lease, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse target url: %w", err)
	}
	cfg.RuntimeParams["application_name"] = "pgscribe-lock"
	if leaseTimeout > 0 {
		cfg.RuntimeParams["idle_session_timeout"] = fmt.Sprint(leaseTimeout.Milliseconds())
		// The epoch bump waits for the old owner's in-flight batch (it holds
		// the lease row FOR SHARE); never longer than a lease.
		cfg.RuntimeParams["lock_timeout"] = fmt.Sprint(leaseTimeout.Milliseconds())
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect lock session: %w", err)
	}
	l := &Lease{conn: conn, key: Key(schema, projection, version), schema: schema, projection: projection, version: version}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", l.key).Scan(&got); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("try advisory lock: %w", err)
	}
	if !got {
		conn.Close(context.WithoutCancel(ctx))
		return nil, nil
	}
	leases := pgx.Identifier{schema, "leases"}.Sanitize()
	err = conn.QueryRow(ctx, `INSERT INTO `+leases+` AS l (projection, version, epoch, node, acquired_at)
		VALUES ($1, $2, 1, $3, now())
		ON CONFLICT (projection, version) DO UPDATE SET epoch = l.epoch + 1, node = EXCLUDED.node, acquired_at = now()
		RETURNING epoch`, projection, version, node).Scan(&l.Epoch)
	if err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("bump lease epoch: %w", err)
	}
	l.checkSQL = `SELECT epoch FROM ` + leases + ` WHERE projection = $1 AND version = $2 FOR SHARE`
	return l, nil
}

// Check implements apply.Fence: inside a batch transaction, lock the lease
// row for share and verify the epoch is still ours.
func (l *Lease) Check(ctx context.Context, tx pgx.Tx) error {
	var epoch int64
	err := tx.QueryRow(ctx, l.checkSQL, l.projection, l.version).Scan(&epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return apply.ErrFenced
	}
	if err != nil {
		return fmt.Errorf("check lease epoch: %w", err)
	}
	if epoch != l.Epoch {
		return fmt.Errorf("%w (ours %d, current %d)", apply.ErrFenced, l.Epoch, epoch)
	}
	return nil
}

// ErrLost means the lock session broke: the lock is gone with it.
var ErrLost = errors.New("advisory lock session lost")

// Watch pings the lock session every interval and returns ErrLost (wrapped)
// when it fails, or nil when ctx ends.
func (l *Lease) Watch(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			pctx, cancel := context.WithTimeout(ctx, interval)
			err := l.conn.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("%w: %v", ErrLost, err)
			}
		}
	}
}

// Release unlocks and closes the session. Closing alone would release the
// lock too; unlocking first makes the handover immediate.
func (l *Lease) Release(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, _ = l.conn.Exec(cctx, "SELECT pg_advisory_unlock($1)", l.key)
	_ = l.conn.Close(cctx)
}
