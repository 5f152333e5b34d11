package integration

// Crash tests: pgscribe killed with SIGKILL at random moments while it
// backfills and while it streams, and PostgreSQL crashed under it. After
// every fault the projections must end exact, with every event accounted
// for once.

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestKillDuringBackfillAndLive kills pgscribe with SIGKILL five times while
// it backfills a 50k-event table and five times while it streams under
// load, restarting it after each kill, with writers appending throughout.
// Kill moments are random (seeded, see the log) within the window that
// matters: after the backfill started, at a random share of the remaining
// backfill, or a random moment after streaming resumed and applied
// something and a 2000-event transaction committed (or once part of that
// transaction is applied). After each kill during streaming, the slot must not be
// confirmed past an unapplied transaction. At the end every projection is
// exact: balances and activity dead-letter nothing, w6 (the bench's W6
// shape, with rule and integrity poison) exactly its poison events.
func TestKillDuringBackfillAndLive(t *testing.T) {
	inEveryFeed(t, false, func(t *testing.T) {
		const (
			backfillKills = 5
			liveKills     = 5
			streams       = 1000
			perStream     = 50
		)
		bal, act := balancesProjection(), activityProjection()
		r, a, seed, rng := newLoadRig(t, streams, perStream, 200, 4*time.Millisecond, 0, w6Projection())
		a.start(4, seed)

		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		kills := 0
		for i := range backfillKills {
			s := r.start()
			// A start after a kill in the backfill goes on with it on the
			// same slot (backfill resumed); one after the first, early
			// kill may find a member of a group without a point yet
			// (a new snapshot), never one after a later kill.
			r.waitUntil(2*time.Minute, "balances to start or resume its backfill", func(context.Context) (bool, error) {
				return s.logText(`msg="backfill started" projection=balances`)+s.logText(`msg="backfill resumed" projection=balances`) >= 1, nil
			})
			if i >= 2 && s.logText(`msg="backfill resumed" projection=balances`) == 0 {
				t.Errorf("start %d after a kill in the backfill read a new snapshot; want the backfill resumed on its slot", i+1)
			}
			// The log line comes before the watermark row that records the
			// phase is committed: a kill in between would find no phase at
			// all. Wait for the row, so that every kill hits a backfill that
			// is durably under way.
			r.waitUntil(2*time.Minute, "balances to record phase backfilling", func(ctx context.Context) (bool, error) {
				phase, err := r.phase(ctx, bal)
				return phase == "backfilling", err
			})
			before, err := r.accounted(ctx, bal)
			if err != nil {
				t.Fatal(err)
			}
			var where string
			if i == 0 {
				// Early: slot just created, first batches in flight.
				d := time.Duration(rng.IntN(500)) * time.Millisecond
				time.Sleep(d) // the random kill moment itself, not synchronisation
				where = fmt.Sprintf("%s after the backfill started", d)
			} else {
				// A random share of what is left of the backfill's snapshot,
				// so that every kill falls inside the backfill and each one
				// gets further. A resumed backfill goes on with the same
				// snapshot (what the writers append meanwhile streams
				// after it), so what is left shrinks kill after kill: a
				// fifth at most, so that the last kill still finds most of
				// a third of the snapshot to read.
				var total int64
				if err := r.pool.QueryRow(ctx, `SELECT backfill_total FROM pgscribe.watermarks WHERE projection = $1 AND version = $2`,
					bal.name, bal.version).Scan(&total); err != nil {
					t.Fatal(err)
				}
				target := before + int64(float64(total-before)*(0.05+0.15*rng.Float64()))
				r.waitUntil(2*time.Minute, fmt.Sprintf("balances to account for %d events", target), func(ctx context.Context) (bool, error) {
					n, err := r.accounted(ctx, bal)
					return n >= target, err
				})
				where = fmt.Sprintf("at %d of %d events accounted", target, total)
			}
			s.kill()
			kills++
			for _, p := range []coreProjection{bal, act} {
				phase, err := r.phase(ctx, p)
				if err != nil {
					t.Fatal(err)
				}
				if p.name == bal.name && phase != "backfilling" {
					t.Fatalf("kill %d: %s phase is %q after a kill meant to hit the backfill", kills, p.name, phase)
				}
			}
			after, err := r.accounted(ctx, bal)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("kill %d (backfill) %s: balances accounted %d → %d", kills, where, before, after)
		}

		// Heavier load while streaming, so that kills find batches in flight
		// and a backlog between what was received and what was applied.
		a.pause.Store(int64(time.Millisecond))
		for i := range liveKills {
			s := r.start()
			r.waitStreaming(s, 3*time.Minute)
			before := r.waitApplied(ctx, bal, time.Minute, 0, "balances to apply streamed events")
			// A large source transaction (2000 events over 500 new streams),
			// applied in many batches over every partition: the kill may fall
			// while it is partly applied.
			bulk := fmt.Sprintf("bulk%d-", kills)
			r.bulk(bulk, 500, 4)
			bulkApplied := func(ctx context.Context) (int64, error) {
				var n int64
				err := r.pool.QueryRow(ctx, `SELECT coalesce(sum(applied + skipped + dead_lettered), 0)::bigint FROM pgscribe.cursors
					WHERE projection = $1 AND version = $2 AND stream_id LIKE $3 || '%'`, bal.name, bal.version, bulk).Scan(&n)
				return n, err
			}
			var d time.Duration
			where := "its commit"
			if i%2 == 1 {
				// Aim at the large transaction itself: once part of it is
				// applied.
				r.waitUntil(2*time.Minute, "balances to apply part of the large transaction", func(ctx context.Context) (bool, error) {
					n, err := bulkApplied(ctx)
					return n > 0, err
				})
				d = time.Duration(rng.IntN(200)) * time.Millisecond
				where = "part of it was applied"
			} else {
				d = time.Duration(rng.IntN(1500)) * time.Millisecond
			}
			time.Sleep(d) // the random kill moment itself, not synchronisation
			s.kill()
			kills++
			covered := r.checkNotAhead(fmt.Sprintf("kill %d", kills), a)
			after, err := r.accounted(ctx, bal)
			if err != nil {
				t.Fatal(err)
			}
			bulkDone, err := bulkApplied(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("kill %d (live) %s after %s, with %d of the large transaction's 2000 events applied: balances accounted %d → %d; checked %d transactions at or below the confirmed LSNs",
				kills, d, where, bulkDone, before, after, covered)
		}

		s := r.start()
		drainCrashed(t, r, a, s, 3*time.Minute)
		t.Logf("%d kills; %d events appended by writers, %d conflicts retried", kills, a.events.Load(), a.retries.Load())
	})
}

// TestPostgresCrashUnderLoad crashes PostgreSQL (immediate shutdown, then
// crash recovery) twice while pgscribe streams under load. pgscribe is not
// restarted: it must reconnect and resume by itself, replaying from the
// slot (whose confirmed position may step back to the last checkpoint) and
// deduplicating by cursor. Every projection (balances, activity and the W6
// shape) ends exact.
func TestPostgresCrashUnderLoad(t *testing.T) {
	requireServer(t)
	inEveryFeed(t, false, func(t *testing.T) {
		if !srv().CanRestart() {
			t.Skipf("the %s server cannot be restarted", srv().Mode())
		}
		bal := balancesProjection()
		r, a, seed, rng := newLoadRig(t, 300, 10, 100, 2*time.Millisecond, 2, w6Projection())
		a.tolerateOutages = true
		a.start(4, seed)
		s := r.start()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()

		for i := range 2 {
			// Not waitStreaming: the process is the same and logged "live"
			// already.
			r.waitUntil(2*time.Minute, "every projection to stream", func(ctx context.Context) (bool, error) {
				for _, p := range r.projs {
					if phase, err := r.phase(ctx, p); err != nil || phase != "live" {
						return false, err
					}
				}
				return true, nil
			})
			r.waitApplied(ctx, bal, time.Minute, 500, "balances to apply streamed events")
			time.Sleep(time.Duration(rng.IntN(1000)) * time.Millisecond) // the random crash moment, not synchronisation
			outages := a.outages.Load()
			if err := srv().Restart(ctx, true); err != nil {
				t.Fatalf("crash PostgreSQL: %v", err)
			}
			r.pool.Reset() // its connections died with the server
			atCrash := r.eventCount(ctx)
			// Writers resume, and pgscribe, by itself, applies what they write.
			r.waitUntil(2*time.Minute, "pgscribe to apply events written after the crash", func(ctx context.Context) (bool, error) {
				for _, p := range r.projs {
					n, err := r.accounted(ctx, p)
					if err != nil || n <= atCrash+200 {
						return false, err
					}
				}
				return true, nil
			})
			if !s.running() {
				t.Fatalf("pgscribe exited after PostgreSQL crashed")
			}
			t.Logf("crash %d at %d events: writers retried %d transactions, pgscribe resumed by itself",
				i+1, atCrash, a.outages.Load()-outages)
		}
		drainCrashed(t, r, a, s, 2*time.Minute)
	})
}

// drainCrashed ends a crash test: it stops the writers, waits up to catchUp
// for s to apply what they wrote, runs every oracle (the read models, the W6
// poison, the CLI's verify) and stops s.
func drainCrashed(t *testing.T, r *rig, a *appender, s *node, catchUp time.Duration) {
	t.Helper()
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(catchUp)
	r.verify()
	requireW6Poison(t, r.pool)
	r.verifyCLI()
	s.terminate(time.Minute)
}
