package integration

import (
	"context"
	"fmt"
	"testing"
)

// TestFaultInvalidatedSlot: a slot PostgreSQL invalidated because it
// retained more WAL than max_slot_wal_keep_size (wal_status = 'lost') while
// the engine was stopped, with events appended meanwhile, is resynced: the
// engine logs it, drops and recreates the slot with a new snapshot, re-reads
// the table, and the per-stream cursors skip what was applied — exact, no
// dead letters, no double apply, never a silent restart from zero.
//
// It changes a server-wide setting, so it is not parallel: Go runs it before
// any parallel test resumes, and it restores the setting before returning.
func TestFaultInvalidatedSlot(t *testing.T) {
	requireServer(t)
	inEveryFeed(t, false, func(t *testing.T) {
		if !srv().CanRestart() {
			t.Skip("changes a server-wide setting: only on a server the harness started")
		}
		proj := faultProjection{name: "lost", types: []string{"Tick"}}
		e, p := startFault(t, 5, "", rounds("l", 8, 10, "Tick", nil), proj)
		p.stop()
		slot := e.slot(proj.name)

		e.exec(t, `ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'`)
		e.exec(t, `SELECT pg_reload_conf()`)
		t.Cleanup(func() {
			if _, err := e.pool.Exec(context.Background(), `ALTER SYSTEM RESET max_slot_wal_keep_size`); err != nil {
				t.Errorf("reset max_slot_wal_keep_size: %v", err)
			}
			if _, err := e.pool.Exec(context.Background(), `SELECT pg_reload_conf()`); err != nil {
				t.Errorf("reload: %v", err)
			}
		})

		// Events the engine has not seen, then enough WAL and a checkpoint for
		// PostgreSQL to invalidate the idle slot.
		e.appendEvents(t, rounds("l", 8, 5, "Tick", nil)...)
		waitFor(t, waitLong, "slot "+slot+" to be invalidated", func() bool {
			if scalar[string](t, e.pool, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot) == "lost" {
				return true
			}
			e.exec(t, `SELECT pg_logical_emit_message(false, 'pgscribe-test', repeat('x', 1000000))`)
			e.exec(t, `SELECT pg_switch_wal()`)
			e.exec(t, `CHECKPOINT`)
			return false
		})

		p = e.start(t)
		p.waitLog(waitLong, "the resync", logMsg("slot was invalidated", proj.name))
		if rec := p.waitLog(waitLong, "the backfill", logMsg("backfill started", proj.name)); logString(rec, "events") != fmt.Sprint(e.events(t)) {
			t.Errorf("the resync re-read %s events, want the whole table (%d): %v", logString(rec, "events"), e.events(t), rec)
		}
		e.verifyClean(t, p, proj)
		// A group's slot comes back once its members caught up on their
		// own slots and join.
		e.joined(t, p, 0, proj)
		waitFor(t, waitLong, "slot "+slot+" to be live again", func() bool {
			got := scalar[string](t, e.pool, `SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1`, slot)
			return got != "lost" && got != ""
		})
		p.stop()
	})
}
