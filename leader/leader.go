package leader

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/event"
)

// ErrLost means the lock session broke: the lock is gone with it.
var ErrLost = errors.New("advisory lock session lost")

// Lease is held by the active node of one projection version. Check is safe
// for concurrent use by any number of batch transactions; Watch and Release
// share the lock session and may be called from different goroutines.
type Lease struct {
	// Epoch is the lease epoch this node wrote when it acquired the lock.
	Epoch int64
	// Acquired is the acquired_at this node wrote with Epoch (the server's
	// clock, microseconds). Check compares both: an epoch alone can repeat
	// when a PostgreSQL failover loses the last bump (asynchronous
	// replication) and the next holder bumps to the same number again.
	Acquired time.Time

	key        int64
	projection string
	version    int64
	checkSQL   string
	leases     string // the quoted leases table

	mu   sync.Mutex // serialises use of conn: Watch pings, Release
	conn session    // the lock session
}

// session is what a Lease needs of its lock session (*pgx.Conn).
type session interface {
	Ping(ctx context.Context) error
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Close(ctx context.Context) error
	IsClosed() bool
}

// Key derives the advisory lock key of a projection version. Two engine
// schemas on one database never share a key, so two pgscribe installations
// side by side do not block each other.
func Key(schema, projection string, version int64) int64 {
	h := fnv.New64a()
	fmt.Fprintf(h, "pgscribe\x00%s\x00%s\x00%d", schema, projection, version)
	return int64(h.Sum64())
}

// sessionParams are the server settings of the lock session.
func sessionParams(leaseTimeout time.Duration) map[string]string {
	p := map[string]string{"application_name": "pgscribe-lock"}
	if leaseTimeout > 0 {
		ms := fmt.Sprint(leaseTimeout.Milliseconds())
		// Watch pings well within this; a node that stops pinging (frozen,
		// cut off) loses the session and the lock within leaseTimeout,
		// whatever its own TCP stack still believes.
		p["idle_session_timeout"] = ms
		// The epoch bump waits for the old owner's in-flight batch (it
		// holds the lease row FOR SHARE), never longer than a lease.
		p["lock_timeout"] = ms
	}
	return p
}

// TryAcquire opens a dedicated session on the target database (url) and
// tries the advisory lock of the projection version. When it gets the lock
// it bumps the lease epoch in <schema>.leases, records node as the holder,
// and returns the Lease; it returns (nil, nil) when another node holds the
// lock. The caller must Release a returned Lease.
//
// leaseTimeout (0 = unbounded) bounds the lock server-side: the session
// runs with idle_session_timeout = leaseTimeout, which Watch's pings keep
// from firing on a healthy node, so a frozen node loses the lock within
// leaseTimeout. idle_session_timeout needs PostgreSQL 14 or later.
func TryAcquire(ctx context.Context, url, schema, projection string, version int64, node string, leaseTimeout time.Duration) (*Lease, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse target url: %w", err)
	}
	for k, v := range sessionParams(leaseTimeout) {
		cfg.RuntimeParams[k] = v
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42704" { // undefined_object: unknown setting
			return nil, fmt.Errorf("connect lock session (lease_timeout needs idle_session_timeout, PostgreSQL 14 or later): %w", err)
		}
		return nil, fmt.Errorf("connect lock session: %w", err)
	}
	l := &Lease{conn: conn, key: Key(schema, projection, version), projection: projection, version: version}
	fail := func(err error) (*Lease, error) {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", l.key).Scan(&got); err != nil {
		return fail(fmt.Errorf("try advisory lock: %w", err))
	}
	if !got {
		return fail(nil)
	}
	// The bump must follow the lock: only the lock holder may move the
	// epoch, and every batch of a previous holder that started before it
	// has finished (the row lock) by the time it commits. acquired_at is
	// the time the row lock was had, not when the statement began waiting.
	leases := leasesTable(schema)
	l.leases = leases
	err = conn.QueryRow(ctx, `INSERT INTO `+leases+` AS l (projection, version, epoch, node, acquired_at)
		VALUES ($1, $2, 1, $3, clock_timestamp())
		ON CONFLICT (projection, version) DO UPDATE SET epoch = l.epoch + 1, node = EXCLUDED.node, acquired_at = clock_timestamp()
		RETURNING epoch, acquired_at`, projection, version, node).Scan(&l.Epoch, &l.Acquired)
	if err != nil {
		return fail(fmt.Errorf("bump lease epoch: %w", err))
	}
	l.checkSQL = `SELECT CASE WHEN count(*) = 1 AND bool_and(epoch = $3 AND acquired_at = $4) THEN 0
  ELSE ('` + fenceMark + `lease ' || CASE WHEN count(*) = 0 THEN 'row is gone'
    ELSE 'now epoch ' || max(epoch) || ' acquired ' || max(acquired_at) END)::int END
FROM (SELECT epoch, acquired_at FROM ` + leases + ` WHERE projection = $1 AND version = $2 FOR SHARE) AS l`
	return l, nil
}

// Check runs the check of CheckStatement in tx, which must not have run
// anything else yet; it returns an error wrapping event.ErrFenced when the
// lease is no longer ours, and the caller must roll back.
func (l *Lease) Check(ctx context.Context, tx pgx.Tx) error {
	sql, args := l.CheckStatement()
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return l.CheckFailed(err)
	}
	return nil
}

// fenceMark starts the text of a failed check.
const fenceMark = "pgscribe fence: "

// CheckStatement implements the apply package's Fence. The statement locks the lease row
// for share and checks it is still ours (same epoch and acquired_at), so
// that a takeover waits for this transaction and everything the
// transaction reads afterwards is at least as new as the previous owner's
// last commit. It fails when the lease changed or is gone, so that in a
// pipeline nothing after it runs: the failure is a cast of a text naming
// what it found to integer (SQL has no RAISE), evaluated only in that case.
func (l *Lease) CheckStatement() (string, []any) {
	return l.checkSQL, []any{l.projection, l.version, l.Epoch, l.Acquired}
}

// CheckAllStatement is CheckStatement for several leases of one engine
// schema in one statement (a group's watermark saves): it locks every lease
// row for share and fails, as CheckStatement does, when any of them is no
// longer as its lease acquired it or is gone. Its failure does not say
// which: CheckStatement of each does.
func CheckAllStatement(ls []*Lease) (string, []any) {
	projs, versions := make([]string, len(ls)), make([]int64, len(ls))
	epochs, acquired := make([]int64, len(ls)), make([]time.Time, len(ls))
	for i, l := range ls {
		projs[i], versions[i], epochs[i], acquired[i] = l.projection, l.version, l.Epoch, l.Acquired
	}
	return `SELECT CASE WHEN count(l.epoch) = count(*) AND bool_and(l.epoch = w.epoch AND l.acquired_at = w.acquired) THEN 0
  ELSE ('` + fenceMark + `' || (count(*) - count(l.epoch) + count(*) FILTER (WHERE l.epoch <> w.epoch OR l.acquired_at <> w.acquired))
    || ' of ' || count(*) || ' leases changed or are gone')::int END
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::timestamptz[]) AS w (projection, version, epoch, acquired)
LEFT JOIN LATERAL (SELECT epoch, acquired_at FROM ` + ls[0].leases + `
  WHERE projection = w.projection AND version = w.version FOR SHARE) AS l ON true`, []any{projs, versions, epochs, acquired}
}

// CheckFailed implements the apply package's Fence.
func (l *Lease) CheckFailed(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == pgerrcode.InvalidTextRepresentation {
		if i := strings.Index(pgErr.Message, fenceMark); i >= 0 {
			found := strings.TrimSuffix(pgErr.Message[i+len(fenceMark):], `"`)
			return fmt.Errorf("%w (ours epoch %d acquired %s; %s)", event.ErrFenced,
				l.Epoch, l.Acquired.UTC().Format(time.RFC3339Nano), found)
		}
	}
	return fmt.Errorf("check lease epoch: %w", err)
}

// Watch pings the lock session at once and then every interval, and returns
// an error wrapping ErrLost when a ping fails or takes longer than
// interval; it returns nil when ctx ends. The pings are what keep the
// session's idle_session_timeout from firing, so interval must be well
// below the lease timeout (the engine uses a third).
func (l *Lease) Watch(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := l.ping(ctx, interval); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%w: %w", ErrLost, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// ping runs an empty statement on the lock session. Its deadline does not
// follow ctx's cancellation: a graceful stop must not break the session in
// the middle of a ping, so that Release can still unlock it cleanly.
func (l *Lease) ping(ctx context.Context, timeout time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	return l.conn.Ping(pctx)
}

// Release unlocks and closes the lock session; it waits for a ping in
// progress. Closing alone would release the lock too, but an explicit
// unlock makes the handover to a standby immediate even where the close
// is slow to reach the server. Safe to call on a lost lease and more than
// once.
func (l *Lease) Release(ctx context.Context) {
	l.mu.Lock()
	defer l.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if !l.conn.IsClosed() {
		_, _ = l.conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", l.key)
	}
	_ = l.conn.Close(ctx)
}

// The rest of what leader/ owns besides taking the lock: the leases table
// (its halt columns and reading a row) and finding which backend holds a
// projection version's advisory lock.

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

// Forget deletes the lease row, if the lease is still this one: `pgscribe
// retire` runs it in the transaction that removes the version's state, so
// that nothing of a retired version stays behind. A later run of the
// version starts from epoch 1 again, which is safe: no node of the retired
// version can still hold its lock.
func (l *Lease) Forget(ctx context.Context, q event.Querier) error {
	if _, err := q.Exec(ctx, `DELETE FROM `+l.leases+` WHERE projection = $1 AND version = $2 AND epoch = $3`,
		l.projection, l.version, l.Epoch); err != nil {
		return fmt.Errorf("delete lease: %w", err)
	}
	return nil
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

// AdvisoryHolders returns, for each advisory lock key held in q's
// database (as Holder reads it), the backend holding it, in one read of
// pg_locks: status asks for every version at once. Look keys up with Key.
func AdvisoryHolders(ctx context.Context, q event.Querier) (map[int64]int32, error) {
	rows, err := q.Query(ctx, `SELECT classid::bigint, objid::bigint, min(pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
GROUP BY classid, objid`)
	if err != nil {
		return nil, fmt.Errorf("look up advisory locks: %w", err)
	}
	defer rows.Close()
	out := map[int64]int32{}
	for rows.Next() {
		var hi, lo int64
		var pid int32
		if err := rows.Scan(&hi, &lo, &pid); err != nil {
			return nil, fmt.Errorf("look up advisory locks: %w", err)
		}
		out[int64(uint64(hi)<<32|uint64(lo))] = pid
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("look up advisory locks: %w", err)
	}
	return out, nil
}

// keyParts splits a bigint advisory lock key the way pg_locks shows it.
func keyParts(key int64) (classid, objid int64) {
	k := uint64(key)
	return int64(k >> 32), int64(k & 0xFFFFFFFF)
}
