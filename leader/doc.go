// Package leader makes one node active per projection version: a
// PostgreSQL advisory lock held on a dedicated session, plus a lease epoch
// in the engine schema that every batch transaction verifies (fencing).
//
// # Who is active
//
// TryAcquire opens a session of its own (application_name pgscribe-lock)
// and calls pg_try_advisory_lock with a key derived from the engine schema,
// the projection name and its version (Key). The node that gets the lock
// bumps leases.epoch for that projection version and is active; the others
// get (nil, nil) and poll again later. The lock lives exactly as long as
// the session: Release unlocks and closes it, a crash closes it, and the
// server itself ends it when it goes quiet for lease_timeout.
//
// # Fencing: why a lock alone is not enough
//
// The lock says who should be active; it cannot stop a node that believes
// it still is. A node whose lock session died (network cut of that one
// connection, the server ending it for idleness while the process was
// frozen) may still hold working batch connections. So every batch
// transaction starts with the check of CheckStatement, which reads SELECT
// epoch, acquired_at FROM leases … FOR SHARE and fails, in PostgreSQL,
// unless both are what this node wrote when it acquired: a batch pipelines
// its writes and COMMIT behind the check, and the server skips them after
// the failure (CheckFailed reads it as event.ErrFenced). (acquired_at makes the token unique even if
// a PostgreSQL failover loses the last bump with the WAL that carried it and
// the next holder bumps to the same epoch again.) The bump is an UPDATE of
// the same row, so the row lock orders every batch against every takeover:
//
//   - a batch that passed Check holds the row FOR SHARE until it commits or
//     rolls back, and the takeover's UPDATE waits for it. Its commit, if it
//     happens, precedes the bump, and every transaction of the new owner
//     (whose first statement is its own Check, after the bump) reads the
//     cursors that commit wrote: the event is deduplicated, not applied
//     twice;
//   - a batch whose Check runs after the bump reads the new epoch (a locking
//     read in READ COMMITTED sees the latest committed row version) and
//     rolls back.
//
// There is no third case, so there is no window, whatever the timing, in
// which a fenced node commits after the new owner read the cursors. Timing
// only decides how long a takeover waits, never whether it is safe.
//
// # Bounding the wait: lease_timeout, server-side
//
// A frozen node (SIGSTOP, a VM pause, a stuck disk) keeps its sockets open
// and cannot release anything. Three server-side settings, all equal to
// lease_timeout, bound what it can hold:
//
//   - the lock session runs with idle_session_timeout: Watch pings it every
//     lease_timeout/3, so a healthy node never trips it, and a frozen one
//     loses the session, hence the lock, within lease_timeout (PostgreSQL 14
//     or later);
//   - batch connections run with idle_in_transaction_session_timeout (set by
//     the engine): a batch frozen mid-transaction, holding the lease row FOR
//     SHARE, is ended by the server, so the takeover's bump proceeds;
//   - the bump itself runs with lock_timeout: if the lease row stays locked
//     longer (an old batch still busy inside a long statement), the attempt
//     fails, the lock is let go and a later poll tries again.
//
// A standby therefore takes over within about lease_timeout + standby_poll
// of a freeze, and within standby_poll of a crash or a graceful stop (the
// server sees the closed socket at once).
//
// Writes outside a fenced transaction are not protected and must stay
// harmless: a fenced node may still confirm its replication slot, but only
// up to its own durable watermark, which the new owner's cursors already
// cover.
package leader
