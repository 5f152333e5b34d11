package integration

import (
	"context"
	"math"
	"strconv"
	"testing"
	"time"
)

// TestBackfillResumesAfterKill9: a kill -9 in the middle of a backfill,
// and the next start goes on with it on the same slot from where every
// event was accounted for, instead of a new snapshot that reads the whole
// table again: the log says "backfill resumed" (alone) or the group's scan
// "resumed" (member), never "backfill started", and names a point past a
// quarter of the table. The kill comes while one event's batch waits on a
// row lock and later pages were applied around it, after a point was saved:
// a point past the held event (the last page read, say) would skip it on
// resume, and the read model would miss it. Events committed after the
// snapshot, before the kill and while the node is down, come through the
// stream. At the end every version is exact: conservation, the read model
// equal to the events, no dead letter.
//
// Not parallel: the held row's transaction has an id, and while it is open
// no slot can be created anywhere on the server (a slot's creation waits
// for every transaction with an id running at its start).
func TestBackfillResumesAfterKill9(t *testing.T) {
	inEveryFeed(t, false, func(t *testing.T) {
		ctx := context.Background()
		proj := faultProjection{name: "resumed", types: []string{"Tick"}}
		e := newFaultEnv(t, 5, proj)
		e.appendEvents(t, rounds("r", 200, 300, "Tick", nil)...) // 60,000 events
		total := e.events(t)
		projs := e.withPeers([]faultProjection{proj})
		// The version under test inserts a row per event and nothing else
		// (no sql rule, whose table lock would hold every partition behind
		// the held one); eight partitions (four each in a group of two),
		// so that the others apply later pages while one waits. The held
		// partition's queue (queue_size, 2,500) takes about a third of
		// what is left after the held event: the reader goes on, saving
		// points, for the 200 pages of 100 events or so that fill it.
		c := faultConfig(e.dsn, e.slotPrefix, 5).with("engine", map[string]string{"parallelism": "8", "backfill_batch_size": "100"})
		c.add(projectionTOML(proj.name, 1, "dead_letter", rule{name: "row", on: "Tick", op: "insert", table: proj.name + "_rows",
			set: `event_id = "id", stream_id = "stream_id", stream_position = "stream_position", v = "data.v"`}))
		for _, pr := range projs[1:] {
			c.add(pr.toml())
		}
		c.write(t, e.config)

		p := e.start(t)
		p.waitLog(waitLong, "the backfill", logMsg("backfill started", proj.name))
		// The event the backfill will wait on: r-0's at stream position
		// 150, half way through the table, held once the slot exists
		// (its creation waits for transactions with an id). An uncommitted row with its id
		// makes the engine's insert of it wait for this transaction.
		hold, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = hold.Rollback(ctx) })
		var heldPos int64
		if err := hold.QueryRow(ctx, `INSERT INTO `+proj.name+`_rows (event_id, stream_id, stream_position, v)
			SELECT id, stream_id, stream_position, 0 FROM events WHERE stream_id = 'r-0' AND stream_position = 150
			RETURNING (SELECT position FROM events WHERE stream_id = 'r-0' AND stream_position = 150)`).Scan(&heldPos); err != nil {
			t.Fatalf("hold r-0's 150th event: %v", err)
		}

		var blocked time.Time
		waitFor(t, waitLong, "the backfill to wait on the held event", func() bool {
			return e.pool.QueryRow(ctx, `SELECT clock_timestamp() FROM pg_stat_activity
				WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'transactionid' LIMIT 1`).Scan(&blocked) == nil
		})
		e.appendEvents(t, rounds("r", 200, 1, "Tick", nil)...) // committed after the snapshot: the stream's
		saved := func() (n int) {
			for _, pr := range projs {
				if e.scalar(t, `SELECT count(*) FROM pgscribe.watermarks WHERE projection = $1 AND phase = 'backfilling'
					AND backfill_lsn IS NOT NULL AND backfill_after > $2 AND updated_at > $3`,
					pr.name, int64(math.MinInt64), blocked) == 1 {
					n++
				}
			}
			return n
		}
		waitFor(t, waitLong, "every version to save its backfill point while the held event's batch waits", func() bool { return saved() == len(projs) })
		p.kill()
		if err := hold.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if phase := e.scalar(t, `SELECT count(*) FROM pgscribe.watermarks WHERE projection = $1 AND phase = 'backfilling'`, proj.name); phase != 1 {
			t.Fatalf("the backfill finished before the kill (%d events); the test needs a longer one", total)
		}
		accounted := e.accounted(t, proj.name)
		after := e.scalar(t, `SELECT backfill_after FROM pgscribe.watermarks WHERE projection = $1`, proj.name)
		t.Logf("killed with %d of %d events accounted, the point after position %d, the held event at %d", accounted, total, after, heldPos)
		if after >= heldPos {
			t.Errorf("the point (after position %d) is at or past the held event (%d), which no batch committed", after, heldPos)
		}

		// Appended while down: they commit after the snapshot, and the
		// stream delivers them after the resumed backfill.
		e.appendEvents(t, rounds("r", 200, 2, "Tick", nil)...)
		e.appendEvents(t, rounds("late", 20, 3, "Tick", nil)...)

		p = e.start(t)
		var rec map[string]any
		if e.mode == feedMember {
			rec = p.waitLog(waitLong, "the group's scan resumed", logMsg("one scan of the group's slot for its members, resumed", ""))
		} else {
			rec = p.waitLog(waitLong, "the backfill resumed", logMsg("backfill resumed", proj.name))
		}
		if a, err := strconv.ParseInt(logString(rec, "after_position"), 10, 64); err != nil || a <= math.MinInt64 || a > after {
			t.Errorf("resumed after position %q, want one past the beginning and at most the point recorded for %s (%d): %v",
				logString(rec, "after_position"), proj.name, after, rec)
		}
		if d, err := strconv.ParseInt(logString(rec, "events_done"), 10, 64); err != nil || d < total/8 || d > accounted {
			t.Errorf("resumed with %q events done, want at least an eighth of %d and at most the %d accounted at the kill: %v",
				logString(rec, "events_done"), total, accounted, rec)
		}
		for _, pr := range projs {
			waitAccounted(t, e.pool, waitLong, pr.name, 1, p.broken)
			e.checkAccounting(t, pr.name)
			e.checkNoDeadLetters(t, pr.name)
			if n := p.countLog(logMsg("backfill started", pr.name)); n != 0 {
				t.Errorf("%s started a backfill from a new snapshot %d times after the kill, want it resumed", pr.name, n)
			}
			if n := p.countLog(logMsg("backfill resumed", pr.name)); n != 1 {
				t.Errorf("%s resumed its backfill %d times, want once", pr.name, n)
			}
		}
		sameRows(t, e.pool, proj.name+"_rows",
			`SELECT event_id::text, stream_id, stream_position, v FROM `+proj.name+`_rows`,
			`SELECT id::text, stream_id, stream_position, (data->>'v')::bigint FROM events WHERE type = ANY($1)`, proj.types)
		for _, pr := range projs[1:] {
			pr.check(t, e)
		}
		p.stop()
	})
}
