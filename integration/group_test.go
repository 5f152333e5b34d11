package integration

// Tests of projection groups: the versions of one group (by default every
// projection of a configuration) share one replication slot,
// <slot_prefix>_group_<group>, and one decode of the events table, on the
// node that holds the group's lock. A version that builds backfills and
// streams on a slot of its own, then joins the group's stream at a
// transaction boundary; a paused or halted one detaches and holds the
// group slot's confirmation back while the others go on.
//
// Oracles: each member's read model, cursors and dead letters against the
// events table (verifyProjection, faultProjection.check, checkAccounting),
// and the slots: one group slot, every member's watermark on it, no slot
// of a member's own left, one walsender.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
)

// groupSlot is the slot a group of two or more versions shares
// (config.GroupSlotName).
func groupSlot(prefix, group string) string { return prefix + "_group_" + group }

// prefixSlots returns the replication slots of the test's database that
// pgscribe made for prefix, each with whether a walsender holds it.
func prefixSlots(t testing.TB, q querier, prefix string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := q.Query(ctx, `SELECT slot_name::text, active FROM pg_replication_slots
		WHERE database = current_database() AND starts_with(slot_name::text, $1)`, prefix+"_")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	var name string
	var active bool
	if _, err := pgx.ForEachRow(rows, []any{&name, &active}, func() error {
		out[name] = active
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// gWatermark is a version's watermark row.
type gWatermark struct {
	slot, phase string
	lsn         pglogrepl.LSN
	ok          bool // the row exists
}

func loadWatermark(t testing.TB, q querier, projection string, version int) gWatermark {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var slot, lsn *string
	var w gWatermark
	err := q.QueryRow(ctx, `SELECT slot_name, lsn::text, phase FROM pgscribe.watermarks WHERE projection = $1 AND version = $2`,
		projection, version).Scan(&slot, &lsn, &w.phase)
	if errors.Is(err, pgx.ErrNoRows) {
		return w
	}
	if err != nil {
		t.Fatal(err)
	}
	w.ok = true
	if slot != nil {
		w.slot = *slot
	}
	if lsn != nil {
		if w.lsn, err = pglogrepl.ParseLSN(*lsn); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

// slotConfirmed is the slot's confirmed_flush_lsn (ok false without the
// slot).
func slotConfirmed(t testing.TB, q querier, slot string) (pglogrepl.LSN, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s *string
	err := q.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	if s == nil {
		return 0, true
	}
	l, err := pglogrepl.ParseLSN(*s)
	if err != nil {
		t.Fatal(err)
	}
	return l, true
}

// walsenders counts the walsender processes connected to the test's
// database.
func walsenders(ctx context.Context, q querier) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT count(*)::int FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = current_database()`).Scan(&n)
	return n, err
}

// gMember names a projection version of a group.
type gMember struct {
	name    string
	version int
}

// requireOnGroupSlot checks the steady state of a group whose members all
// run: the group's slot is the only slot of prefix, every member's
// watermark is on it (phase live), and one walsender streams it.
func requireOnGroupSlot(t *testing.T, q querier, prefix, group string, members ...gMember) {
	t.Helper()
	gslot := groupSlot(prefix, group)
	// A member logs its join once its watermark is on the group's slot,
	// and drops its own slot next; a member that is still catching up on a
	// slot of its own joins in a moment. Wait for that state, then check
	// that it holds.
	var why string
	state := func(ctx context.Context) (bool, error) {
		for _, m := range members {
			if w := loadWatermark(t, q, m.name, m.version); w.slot != gslot || w.phase != "live" {
				why = fmt.Sprintf("%s v%d watermark: slot %q phase %q, want slot %q phase live", m.name, m.version, w.slot, w.phase, gslot)
				return false, nil
			}
		}
		n, err := walsenders(ctx, q)
		if err != nil {
			return false, err
		}
		slots := prefixSlots(t, q, prefix)
		why = fmt.Sprintf("%d walsenders, slots of prefix %s %v (name: active): want one walsender, on %s, the only slot", n, prefix, slots, gslot)
		return n == 1 && len(slots) == 1 && slots[gslot], nil
	}
	if !poll(t, 30*time.Second, "every member on the group's slot, alone, one walsender", state) {
		t.Errorf("%s", why)
		return
	}
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ok, err := state(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			t.Errorf("after the group's steady state: %s", why)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// requireNoOwnSlotOnGroup fails when a member whose watermark is on the
// group's slot still has a slot of its own.
func requireNoOwnSlotOnGroup(t *testing.T, q querier, prefix, group string, members ...gMember) {
	t.Helper()
	slots := prefixSlots(t, q, prefix)
	for _, m := range members {
		w := loadWatermark(t, q, m.name, m.version)
		own := slotName(prefix, m.name, m.version)
		if _, left := slots[own]; w.slot == groupSlot(prefix, group) && left {
			t.Errorf("%s v%d is recorded on the group's slot, yet its own slot %s still exists", m.name, m.version, own)
		}
	}
}

// requireGroupConfirmed waits until the group's slot is confirmed up to the
// lowest watermark of its members (nothing else holds it back once they
// all caught up and the writers stopped): the shared slot does not retain
// WAL for ever.
func requireGroupConfirmed(t *testing.T, q querier, prefix, group string, members ...gMember) pglogrepl.LSN {
	t.Helper()
	gslot := groupSlot(prefix, group)
	var low, confirmed pglogrepl.LSN
	ok := poll(t, 30*time.Second, "the group's slot confirmed to its members' watermarks", func(context.Context) (bool, error) {
		low = 0
		for i, m := range members {
			if w := loadWatermark(t, q, m.name, m.version); i == 0 || w.lsn < low {
				low = w.lsn
			}
		}
		confirmed, _ = slotConfirmed(t, q, gslot)
		return confirmed > 0 && confirmed >= low, nil
	})
	if !ok {
		t.Errorf("the group's slot %s is confirmed at %s, below its members' lowest watermark %s", gslot, confirmed, low)
	}
	return confirmed
}

// linesWith counts n's output lines containing every one of subs.
func linesWith(n *node, subs ...string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
lines:
	for _, l := range n.lines {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue lines
			}
		}
		k++
	}
	return k
}

// openedProjection is key-only membership: an insert with only a key, one
// row per account opened.
func openedProjection() coreProjection {
	return coreProjection{
		name: "opened", version: 1,
		rules:    []rule{{name: "open", on: "AccountOpened", op: "insert", table: "g_opened", key: `account_id = "stream_id"`}},
		ddl:      `CREATE TABLE IF NOT EXISTS g_opened (account_id text PRIMARY KEY)`,
		expected: `SELECT stream_id FROM events WHERE type = 'AccountOpened'`,
		actual:   `SELECT account_id FROM g_opened`,
		outcome:  `CASE WHEN type = 'AccountOpened' THEN 'applied' ELSE 'skipped' END`,
	}
}

// streamUnderWriters is the start of several group tests: r seeded with
// streams × perStream events, writers appending to those streams and extra
// new ones (the seed their choices replay from is logged and returned),
// and pgscribe started and streaming.
func (r *rig) streamUnderWriters(streams, perStream, extra, writers int) (a *appender, s *node, seed uint64) {
	r.t.Helper()
	seed = seedFromEnv(r.t)
	r.seed(streams, perStream)
	a = newAppender(r, streams+extra, 3*time.Millisecond)
	a.start(writers, seed)
	s = r.start()
	r.waitStreaming(s, 3*time.Minute)
	return a, s, seed
}

// TestGroupShareOneSlot: three projections of the default group with
// different rules (a per-stream upsert with inc, a key-only insert, an
// insert per event) build from a backlog and stream under writers. They
// build from one scan of the group's slot (one snapshot, read once for the
// three), and end exact, each on the group's slot, the only slot of the
// configuration, streamed by one walsender.
func TestGroupShareOneSlot(t *testing.T) {
	stats, opened, act := streamStatsProjection(), openedProjection(), activityProjection()
	// A group counts as one against max_active_projections: all three run.
	r := newRig(t, []coreProjection{stats, opened, act}, map[string]string{"max_active_projections": "1"})
	a, s, _ := r.streamUnderWriters(300, 20, 50, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, p := range r.projs {
		r.waitApplied(ctx, p, time.Minute, 200, p.name+" to apply events written while it streams from the group")
	}
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(2 * time.Minute)
	r.verify()
	gm := []gMember{{stats.name, stats.version}, {opened.name, 1}, {act.name, 1}}
	requireOnGroupSlot(t, r.pool, r.prefix, "default", gm...)
	requireGroupConfirmed(t, r.pool, r.prefix, "default", gm...)
	if n := linesWith(s, `msg="one scan of the group's slot for its members"`, "members=3"); n != 1 {
		t.Errorf("%d scans of the group's slot for its three members, want one", n)
	}
	if n := linesWith(s, `msg="joined the group's stream"`, `after="its own slot"`) + linesWith(s, `msg="created the group's slot`); n != 0 {
		t.Errorf("%d joins from a slot of a member's own, or slots created beside the scan's, want none", n)
	}
	s.terminate(time.Minute)
	t.Logf("%d events appended by writers", a.events.Load())
}

// groupNotAhead checks guarantee 7 for members of a group after a kill:
// every appended transaction committed at or below the confirmed position
// of the slot a member's watermark is recorded on (the group's slot, or
// the member's own before it joined) is accounted for by that member's
// cursors. A member building (phase backfilling) is skipped: its slot sits
// at its creation point. It returns how many transactions it covered.
func groupNotAhead(t *testing.T, r *rig, a *appender, what string, projs ...coreProjection) (covered int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range projs {
		w := loadWatermark(t, r.pool, p.name, p.version)
		if !w.ok || w.phase != "live" || w.slot == "" {
			continue
		}
		confirmed, exists := slotConfirmed(t, r.pool, w.slot)
		if !exists {
			if w.slot == groupSlot(r.prefix, "default") {
				t.Fatalf("%s: %s is recorded on the group's slot %s, which does not exist", what, p.name, w.slot)
			}
			continue
		}
		cursors, err := r.cursorPositions(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		n, violations := unappliedBelow(a.committedTxns(), cursors, confirmed)
		covered += n
		if len(violations) > 0 {
			t.Fatalf("%s: %s's slot %s confirmed past %d unapplied events: %s", what, p.name, w.slot, len(violations), strings.Join(violations, "; "))
		}
	}
	return covered
}

// TestGroupKill9WhileJoining: activity runs alone on its own slot; then
// the configuration adds stream_stats, which makes them a group of two:
// activity moves from its own slot to the group's, stream_stats backfills
// on a slot of its own and joins. pgscribe is killed (SIGKILL) around the
// joins, several times, under writers; between kills one member is reset
// (its read model truncated), so that it builds and joins again. At the end
// both are exact, both on the group's slot, and no member recorded on the
// group's slot has a slot of its own left.
func TestGroupKill9WhileJoining(t *testing.T) {
	act, stats := activityProjection(), streamStatsProjection()
	members := []gMember{{act.name, act.version}, {stats.name, stats.version}}
	r := newRig(t, []coreProjection{act}, nil)
	// Alone in its group: the version's own slot, as before groups.
	a, s, seed := r.streamUnderWriters(500, 20, 60, 3)
	rng := rand.New(rand.NewPCG(seed, 7))
	// The group's stream opens the slot once the backfill is done, a
	// moment after the state is live.
	var slots map[string]bool
	if !poll(t, 30*time.Second, "the group of one streaming its own slot", func(context.Context) (bool, error) {
		slots = prefixSlots(t, r.pool, r.prefix)
		return len(slots) == 1 && slots[r.slot(act)], nil
	}, s.broken) {
		t.Errorf("a group of one: slots %v (name: active), want only %s, active", slots, r.slot(act))
	}
	s.kill()
	r.setProjections(act, stats)

	const rounds = 6
	joined := `msg="joined the group's stream"`
	for i := range rounds {
		s = r.start()
		var where string
		switch i % 3 {
		case 0:
			// While the builder's own stream runs after its backfill, until
			// it joins: a random moment after the backfill completed.
			r.waitLog(s, 3*time.Minute, `msg="backfill complete"`, 1)
			d := time.Duration(rng.IntN(1500)) * time.Millisecond
			time.Sleep(d) // the random kill moment itself, not synchronisation
			where = fmt.Sprintf("%s after a backfill completed", d)
		case 1:
			// At the first join: the watermark just moved to the group's
			// slot, the member's own slot is about to be dropped.
			r.waitLog(s, 3*time.Minute, joined, 1)
			where = "right after a join"
		case 2:
			// Around the group stream's start: members on a slot of their
			// own try to join it.
			r.waitLog(s, 3*time.Minute, `msg="group stream started"`, 1)
			d := time.Duration(rng.IntN(400)) * time.Millisecond
			time.Sleep(d) // the random kill moment itself, not synchronisation
			where = fmt.Sprintf("%s after the group stream started", d)
		}
		s.kill()
		var state []string
		for _, m := range members {
			w := loadWatermark(t, r.pool, m.name, m.version)
			state = append(state, fmt.Sprintf("%s: slot %s phase %s", m.name, w.slot, w.phase))
		}
		covered := groupNotAhead(t, r, a, fmt.Sprintf("kill %d", i+1), act, stats)
		t.Logf("kill %d %s (%d joins logged): %s; slots %v; %d transactions checked at or below the confirmed positions",
			i+1, where, linesWith(s, joined), strings.Join(state, ", "), prefixSlots(t, r.pool, r.prefix), covered)
		// The next round builds and joins again: reset a member that is
		// past its backfill (alternately activity and stream_stats).
		victim := []coreProjection{act, stats}[i%2]
		if w := loadWatermark(t, r.pool, victim.name, victim.version); w.ok && w.phase == "live" {
			res := runCLI(t, pgscribeBinary(t), "reset", "-config", r.config, "-projection", victim.name,
				"-version", fmt.Sprint(victim.version), "-yes", "-dead-letters")
			if res.code != 0 {
				t.Fatalf("reset %s: %s", victim.name, res)
			}
			table := map[string]string{act.name: "account_activity", stats.name: "stream_stats"}[victim.name]
			mustExec(t, r.pool, "TRUNCATE "+table)
			t.Logf("reset %s", victim.name)
		}
	}

	s = r.start()
	r.waitStreaming(s, 3*time.Minute)
	// A member reset in the last round builds and joins; the other resumes
	// from the group's slot.
	r.waitUntil(2*time.Minute, "every member's watermark on the group's slot", func(context.Context) (bool, error) {
		for _, m := range members {
			if w := loadWatermark(t, r.pool, m.name, m.version); w.slot != groupSlot(r.prefix, "default") || w.phase != "live" {
				return false, nil
			}
		}
		return true, nil
	})
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(3 * time.Minute)
	r.verify()
	requireOnGroupSlot(t, r.pool, r.prefix, "default", members...)
	requireNoOwnSlotOnGroup(t, r.pool, r.prefix, "default", members...)
	s.terminate(time.Minute)
	t.Logf("%d kills; %d events appended by writers", rounds+1, a.events.Load())
}

// gEnv is a fault environment of two projections of the default group.
func gEnv(t *testing.T) (*faultEnv, *node, faultProjection, faultProjection) {
	t.Helper()
	g1, g2 := faultProjection{name: "g1", types: []string{"Tick"}}, faultProjection{name: "g2", types: []string{"Tick"}}
	backlog := make([]faultEvent, 0, 200)
	for i := range 200 {
		backlog = append(backlog, ev(fmt.Sprintf("b-%d", i%10), "Tick", int64(i)))
	}
	e, p := startFault(t, 10, "", backlog, g1, g2)
	for _, g := range []string{"g1", "g2"} {
		p.waitLog(waitLong, g+" joining the group", logMsg("joined the group's stream", g))
	}
	requireOnGroupSlot(t, e.pool, e.slotPrefix, "default", gMember{"g1", 1}, gMember{"g2", 1})
	return e, p, g1, g2
}

// detachedHolds watches, for d under the writer's load, that the detached
// member's accounting and watermark stay where they are while the other
// member goes on applying, and that the group slot is never confirmed past
// the detached member's watermark. It returns that watermark.
func detachedHolds(t *testing.T, e *faultEnv, w *faultWriter, detached, other string, d time.Duration) pglogrepl.LSN {
	t.Helper()
	gslot := groupSlot(e.slotPrefix, "default")
	held := loadWatermark(t, e.pool, detached, 1)
	if held.slot != gslot {
		t.Fatalf("%s detached: watermark on %q, want the group's slot %s", detached, held.slot, gslot)
	}
	accounted := e.accounted(t, detached)
	otherBefore, txBefore := e.accounted(t, other), w.transactions()
	var confirmed pglogrepl.LSN
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if got := e.accounted(t, detached); got != accounted {
			t.Fatalf("%s is detached, yet went from %d to %d accounted events", detached, accounted, got)
		}
		if wm := loadWatermark(t, e.pool, detached, 1); wm.lsn != held.lsn || wm.slot != held.slot {
			t.Fatalf("%s is detached, yet its watermark moved from %s on %s to %s on %s", detached, held.lsn, held.slot, wm.lsn, wm.slot)
		}
		c, ok := slotConfirmed(t, e.pool, gslot)
		if !ok {
			t.Fatalf("the group's slot %s is gone while %s is detached", gslot, detached)
		}
		if c > held.lsn {
			t.Fatalf("the group's slot is confirmed to %s, past the detached %s's watermark %s: the WAL it needs is released", c, detached, held.lsn)
		}
		confirmed = c
		time.Sleep(100 * time.Millisecond)
	}
	otherAfter := e.accounted(t, other)
	if w.transactions() == txBefore || otherAfter <= otherBefore {
		t.Fatalf("while %s was detached the writer committed %d transactions and %s went from %d to %d: proved nothing",
			detached, w.transactions()-txBefore, other, otherBefore, otherAfter)
	}
	t.Logf("%s detached at %s (%d accounted); %s went on from %d to %d; group slot confirmed at %s",
		detached, held.lsn, accounted, other, otherBefore, otherAfter, confirmed)
	return held.lsn
}

// otherExact stops the writer and waits for the member still attached to
// account for every event, then checks it exactly while the detached one
// still accounts for n only.
func otherExact(t *testing.T, e *faultEnv, p *node, w *faultWriter, other faultProjection, detached string, n int64) {
	t.Helper()
	w.stop(t)
	waitAccounted(t, e.pool, waitLong, other.name, 1, p.broken)
	other.check(t, e)
	e.checkAccounting(t, other.name)
	if got := e.accounted(t, detached); got != n {
		t.Fatalf("%s is detached, yet accounts for %d events, was %d", detached, got, n)
	}
}

// rejoined checks, after mark, that member caught up on a copy of the
// group's slot and joined the group's stream again, and then the steady
// state of the group.
func rejoined(t *testing.T, e *faultEnv, p *node, mark int, member string, held pglogrepl.LSN) {
	t.Helper()
	waitUntil(t, waitLong, member+" to join the group's stream again", func(context.Context) (bool, error) {
		return p.countLogAfter(mark, logMsg("joined the group's stream", member)) > 0, nil
	}, p.broken)
	if p.countLogAfter(mark, logMsg("streaming from a copy of the group's slot", member)) == 0 {
		t.Errorf("%s rejoined without catching up on a copy of the group's slot", member)
	}
	gm := []gMember{{"g1", 1}, {"g2", 1}}
	requireOnGroupSlot(t, e.pool, e.slotPrefix, "default", gm...)
	if c := requireGroupConfirmed(t, e.pool, e.slotPrefix, "default", gm...); c <= held {
		t.Errorf("the group's slot is still confirmed at %s, at or below %s where %s detached", c, held, member)
	}
}

// TestGroupMemberHaltedOthersContinue: of a group of two, g2 halts (a
// renamed read-model column, SQLSTATE 42703). g1 goes on applying under
// load and ends exact; g2's watermark stays, and holds the group's slot
// back. After the column is renamed back, `pgscribe resume` has g2 catch
// up on a copy of the group's slot and join again; both end exact.
func TestGroupMemberHaltedOthersContinue(t *testing.T) {
	e, p, g1, g2 := gEnv(t)
	w := groupWriter(t, e.dsn, 4, 5*time.Millisecond)
	waitFor(t, waitLong, "g2 to apply the writer's events", func() bool { return e.accounted(t, "g2") > 400 })
	e.exec(t, `ALTER TABLE g2_rows RENAME COLUMN v TO v_gone`)
	p.waitHalted("g2", "42703")
	if v := p.metric("pgscribe_halted", projLabels("g1")); v != 0 {
		t.Errorf("g1 halted too: pgscribe_halted = %v", v)
	}
	held := detachedHolds(t, e, w, "g2", "g1", 3*time.Second)
	otherExact(t, e, p, w, g1, "g2", e.accounted(t, "g2"))

	e.exec(t, `ALTER TABLE g2_rows RENAME COLUMN v_gone TO v`)
	mark := p.mark()
	e.operate(t, 0, "resume", "-projection", "g2", "-version", "1")
	waitAccounted(t, e.pool, waitLong, "g2", 1, p.broken)
	rejoined(t, e, p, mark, "g2", held)
	// Both on the shared stream again: new events reach both.
	bothOnStream(t, e, p, g1, g2)
	waitMetric(t, p, "pgscribe_halted", "g2", 0, 10*time.Second)
	p.stop()
}

// bothOnStream appends 100 events over 7 streams once a detached member
// rejoined, and checks both members exact: new events reach both.
func bothOnStream(t *testing.T, e *faultEnv, p *node, g1, g2 faultProjection) {
	t.Helper()
	evs := make([]faultEvent, 0, 100)
	for i := range 100 {
		evs = append(evs, ev(fmt.Sprintf("x-%d", i%7), "Tick", int64(10000+i)))
	}
	e.appendEvents(t, evs...)
	e.verifyClean(t, p, g1, g2)
}

// TestGroupMemberPausedOthersContinue: `pgscribe pause` of g2 detaches it
// from the group's stream: g1 goes on under load and ends exact, g2's
// watermark holds the group's slot back, also after a kill -9 and restart
// of the node while g2 is paused. After `pgscribe resume` g2
// catches up on a copy of the group's slot, joins again, and both end
// exact.
func TestGroupMemberPausedOthersContinue(t *testing.T) {
	e, p, g1, g2 := gEnv(t)
	w := groupWriter(t, e.dsn, 4, 5*time.Millisecond)
	waitFor(t, waitLong, "g2 to apply the writer's events", func() bool { return e.accounted(t, "g2") > 400 })
	paused := p.mark()
	e.operate(t, 0, "pause", "-projection", "g2", "-version", "1", "-reason", "group test")
	waitMetric(t, p, "pgscribe_paused", "g2", 1, 10*time.Second)
	if v := p.metric("pgscribe_paused", projLabels("g1")); v != 0 {
		t.Errorf("g1 paused too: pgscribe_paused = %v", v)
	}
	// The pause ends the session the way a graceful stop does, with its
	// final watermark saved; the version logs that it holds paused after.
	waitUntil(t, waitLong, "g2's session ended by the pause", func(context.Context) (bool, error) {
		return p.countLogAfter(paused, logMsg("paused by an operator: holding the lock", "g2")) > 0, nil
	}, p.broken)
	held := detachedHolds(t, e, w, "g2", "g1", 3*time.Second)

	// kill -9 while g2 is paused: the restarted node runs g1 from the
	// group's slot, g2 waits paused, and its recorded watermark still holds
	// the group's slot back.
	p.kill()
	mark := p.mark()
	p.start()
	waitMetric(t, p, "pgscribe_paused", "g2", 1, waitLong)
	waitUntil(t, waitLong, "g1 resuming from the group's slot", func(context.Context) (bool, error) {
		return p.countLogAfter(mark, logMsg("resuming from the group's slot", "g1")) > 0, nil
	}, p.broken)
	if again := detachedHolds(t, e, w, "g2", "g1", 3*time.Second); again != held {
		t.Errorf("g2's watermark moved from %s to %s across the restart while paused", held, again)
	}
	otherExact(t, e, p, w, g1, "g2", e.accounted(t, "g2"))

	mark = p.mark()
	e.operate(t, 0, "resume", "-projection", "g2", "-version", "1")
	waitAccounted(t, e.pool, waitLong, "g2", 1, p.broken)
	waitMetric(t, p, "pgscribe_paused", "g2", 0, 10*time.Second)
	rejoined(t, e, p, mark, "g2", held)
	bothOnStream(t, e, p, g1, g2)
	p.stop()
}

// groupLease is the lease row of a group's lock.
func (c *foCluster) groupLease(group string) foLease {
	c.t.Helper()
	var l foLease
	err := c.admin.QueryRow(c.ctx, `SELECT node, epoch, acquired_at FROM pgscribe.leases WHERE projection = $1 AND version = 0`,
		"group:"+group).Scan(&l.node, &l.epoch, &l.acquired)
	if errors.Is(err, pgx.ErrNoRows) {
		return foLease{}
	}
	if err != nil {
		c.t.Fatal(err)
	}
	return l
}

// TestGroupFailoverUnderLoad: a group of three (two failover projections
// and the W6 shape) on n1, n2 standing by, a writer under load. kill -9 of
// n1: n2 takes the group's lock and every member's (the lease rows say
// n2, epochs bumped), applies, and every member ends exact, with
// `pgscribe verify` finding no drift, on the group's slot only.
func TestGroupFailoverUnderLoad(t *testing.T) {
	const pa, pb = "gfa", "gfb"
	c := newFailoverCluster(t, pa, pb)
	c.addProjection(w6Projection())
	members := []string{pa, pb, "w6"}
	n1, n2, w := c.livePair(pa)
	for _, m := range members[1:] {
		n1.waitState(m, "live", 60*time.Second)
		n2.waitState(m, "standby", 30*time.Second)
	}
	// Every member streams from the group's slot on n1 before the kill.
	for _, m := range members {
		n1.waitLog(60*time.Second, m+" joining the group", logMsg("joined the group's stream", m))
	}
	w.waitWritten(t, 400)
	if l := c.groupLease("default"); l.node != "n1" {
		t.Fatalf("group lease on %q before the kill, want n1", l.node)
	}
	before := map[string]foLease{}
	for _, m := range members {
		before[m] = c.lease(m)
		if before[m].node != "n1" {
			t.Fatalf("%s lease on %q before the kill, want n1 (all members on the group's node)", m, before[m].node)
		}
	}
	gBefore := c.groupLease("default")

	t0 := time.Now()
	n1.signal(syscall.SIGKILL)
	gl := waitGroupTakeover(c, gBefore, foStandbyPoll+foSlack+10*time.Second)
	for _, m := range members {
		l := c.waitTakeover(m, before[m], "n1", 30*time.Second)
		if l.node != "n2" {
			t.Errorf("%s taken over by %q, want n2", m, l.node)
		}
	}
	for _, m := range members {
		n2.waitState(m, "live", 60*time.Second)
		// The new node picks up the group's stream where n1 left it.
		n2.waitLog(60*time.Second, m+" resuming from the group's slot", logMsg("resuming from the group's slot", m))
	}
	c.waitProgress(pa, n2, 30*time.Second)
	c.waitProgress(pb, n2, 30*time.Second)
	t.Logf("kill -9: group lock taken by %s (epoch %d → %d) %s after the kill", gl.node, gBefore.epoch, gl.epoch, foSince(t0, gl.acquired))
	n1.wait(10 * time.Second)

	w.waitWritten(t, 400)
	c.drain(w, pa, pb)
	requireW6Poison(t, c.admin)
	if l := c.groupLease("default"); l.node != "n2" {
		t.Errorf("group lease on %q after the takeover, want n2", l.node)
	}
	gm := []gMember{{pa, 1}, {pb, 1}, {"w6", 1}}
	requireOnGroupSlot(t, c.admin, c.id, "default", gm...)
	requireNoOwnSlotOnGroup(t, c.admin, c.id, "default", gm...)
	verifyCfg := c.writeConfig("verify", c.dsn, foOptions{})
	for _, m := range members {
		requireNoDrift(t, c.bin, verifyCfg, m, 1)
	}
}

// waitGroupTakeover waits until a node other than n1 holds the group's
// lock with an epoch past before's.
func waitGroupTakeover(c *foCluster, before foLease, timeout time.Duration) foLease {
	c.t.Helper()
	var l foLease
	waitFor(c.t, timeout, "a takeover of the group's lock from n1", func() bool {
		l = c.groupLease("default")
		return l.epoch > before.epoch && l.node != "n1"
	})
	return l
}

// TestGroupStatus: `pgscribe status` of members that stream from the
// group's slot shows them live, with the WAL the group's slot retains,
// and tells the operator of no missing slot or rebuild.
func TestGroupStatus(t *testing.T) {
	e, p, g1, g2 := gEnv(t)
	e.appendEvents(t, ev("s-1", "Tick", 1), ev("s-2", "Tick", 2))
	e.verifyClean(t, p, g1, g2)
	for _, m := range []string{"g1", "g2"} {
		st := e.opStatus(t, m)
		if st.State != "live" || st.WALRetained == nil {
			t.Errorf("status of %s on the group's slot: state %q, WAL retained %v; want live, with the WAL retained shown", m, st.State, st.WALRetained)
		}
		for _, n := range st.Notes {
			if strings.Contains(n, "missing") || strings.Contains(n, "rebuild") || strings.Contains(n, "resync") {
				t.Errorf("status of %s on the group's slot notes %q", m, n)
			}
		}
	}
	t.Logf("status -json:\n%s", e.operate(t, 0, "status", "-json"))
	p.stop()
}

// TestGroupShrinkToOne: a group of two (activity, stream_stats) on the
// group's slot; the configuration then drops stream_stats, leaving
// activity alone in its group: it continues on a copy of the group's slot
// (its own slot, as a version alone runs), exact under writers, while
// stream_stats's recorded watermark keeps the group's slot. Once
// stream_stats is retired (`pgscribe retire`, its watermark gone), no
// version is recorded on the group's slot: it must not be left retaining
// WAL unseen — dropped, or at least listed by `pgscribe status` among the
// slots no configured version uses.
func TestGroupShrinkToOne(t *testing.T) {
	act, stats := activityProjection(), streamStatsProjection()
	r := newRig(t, []coreProjection{act, stats}, nil)
	a, s, _ := r.streamUnderWriters(200, 10, 40, 2)
	requireOnGroupSlot(t, r.pool, r.prefix, "default", gMember{act.name, act.version}, gMember{stats.name, stats.version})
	s.terminate(time.Minute)
	statsHeld := loadWatermark(t, r.pool, stats.name, stats.version)

	r.setProjections(act)
	s = r.start()
	r.waitLog(s, 2*time.Minute, `msg="streaming from a copy of the group's slot" projection=activity`, 1)
	r.waitStreaming(s, 3*time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r.waitApplied(ctx, act, time.Minute, 200, "activity to apply events on its own slot")
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(2 * time.Minute)
	r.verify()
	gslot := groupSlot(r.prefix, "default")
	if w := loadWatermark(t, r.pool, act.name, act.version); w.slot != r.slot(act) {
		t.Errorf("activity alone in its group: watermark on %q, want its own slot %s", w.slot, r.slot(act))
	}
	slots := prefixSlots(t, r.pool, r.prefix)
	if _, ok := slots[r.slot(act)]; !ok {
		t.Errorf("activity alone in its group: slots %v, want its own %s", slots, r.slot(act))
	}
	// stream_stats is still recorded on the group's slot: it holds there.
	if c, ok := slotConfirmed(t, r.pool, gslot); !ok || c > statsHeld.lsn {
		t.Errorf("the group's slot (exists %v) confirmed at %s, want it kept at or below stream_stats's watermark %s", ok, c, statsHeld.lsn)
	}

	// status names it: a version no longer configured that holds the
	// group's slot back, and the command that releases it.
	res := runCLI(t, pgscribeBinary(t), "status", "-config", r.config, "-json")
	var held struct {
		Members []struct {
			Projection string `json:"projection"`
			Version    int64  `json:"version"`
			Slot       string `json:"slot"`
		} `json:"unconfigured_members"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &held); err != nil {
		t.Fatalf("status -json: %v\n%s", err, res)
	}
	if len(held.Members) != 1 || held.Members[0].Projection != stats.name || held.Members[0].Version != int64(stats.version) || held.Members[0].Slot != gslot {
		t.Errorf("status -json unconfigured_members = %+v, want %s v%d on %s", held.Members, stats.name, stats.version, gslot)
	}
	res = runCLI(t, pgscribeBinary(t), "status", "-config", r.config)
	if want := fmt.Sprintf("%s v%d, which is not configured, is recorded on group slot %q", stats.name, stats.version, gslot); !strings.Contains(res.stdout, want) ||
		!strings.Contains(res.stdout, fmt.Sprintf("pgscribe retire -projection %s -version %d", stats.name, stats.version)) {
		t.Errorf("status does not name the unconfigured member holding the group's slot (want %q):\n%s", want, res.stdout)
	}

	s.terminate(time.Minute)
	res = runCLI(t, pgscribeBinary(t), "retire", "-config", r.config, "-projection", stats.name, "-version", fmt.Sprint(stats.version))
	if res.code != 0 {
		t.Fatalf("retire %s: %s", stats.name, res)
	}
	t.Logf("retire: %s", res.stdout)
	s = r.start()
	r.waitStreaming(s, 3*time.Minute)
	r.bulk("late-", 50, 4)
	r.waitCaughtUp(2 * time.Minute)
	r.verify()
	if poll(t, 30*time.Second, "the group's slot dropped", func(context.Context) (bool, error) {
		_, left := prefixSlots(t, r.pool, r.prefix)[gslot]
		return !left, nil
	}) {
		return
	}
	res = runCLI(t, pgscribeBinary(t), "status", "-config", r.config, "-json")
	var rep struct {
		Unconfigured []struct {
			Slot string `json:"slot"`
		} `json:"unconfigured_slots"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &rep); err != nil {
		t.Fatalf("status -json: %v\n%s", err, res)
	}
	for _, u := range rep.Unconfigured {
		if u.Slot == gslot {
			return
		}
	}
	retained := scalar[int64](t, r.pool, `SELECT (pg_current_wal_lsn() - restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = $1`, gslot)
	t.Errorf("no version is recorded on the group's slot %s any more, yet it still exists (retaining %d bytes of WAL), and status lists it nowhere: unconfigured_slots %+v; watermarks on it: %d",
		gslot, retained, rep.Unconfigured, scalar[int64](t, r.pool, `SELECT count(*) FROM pgscribe.watermarks WHERE slot_name = $1`, gslot))
}

// verifyGroup is verifyClean for members that end on the group's slot:
// both exact, both streaming from it, and it confirmed up to their
// watermarks.
func (e *faultEnv) verifyGroup(t *testing.T, p *node, g1, g2 faultProjection) {
	t.Helper()
	e.verifyClean(t, p, g1, g2)
	gm := []gMember{{g1.name, 1}, {g2.name, 1}}
	// A member that held the other back under load (a catch-up after a
	// restart, members at different positions) is detached and joins
	// again after its cooldown: wait for both to be back.
	gslot := groupSlot(e.slotPrefix, "default")
	waitFor(t, waitLong, "both members on the group's slot", func() bool {
		return e.scalar(t, `SELECT count(*) FROM pgscribe.watermarks WHERE projection = ANY($1) AND version = 1
AND slot_name = $2 AND phase = 'live'`, []string{g1.name, g2.name}, gslot) == 2
	})
	requireOnGroupSlot(t, e.pool, e.slotPrefix, "default", gm...)
	requireGroupConfirmed(t, e.pool, e.slotPrefix, "default", gm...)
}

// TestGroupKill9WhileCatchingUp: g2 is paused under load, so that the
// group's stream passes it; on resume it catches up on a copy of the
// group's slot before it joins again. pgscribe is killed (SIGKILL) during
// that catch-up, at a random moment, three times; after each restart g2
// catches up and joins again. Both end exact, on the group's slot only.
func TestGroupKill9WhileCatchingUp(t *testing.T) {
	e, p, g1, g2 := gEnv(t)
	seed := seedFromEnv(t)
	rng := rand.New(rand.NewPCG(seed, 11))
	// A load the engine keeps up with on a loaded 2-core machine under
	// -race: a member catching up on a slot of its own can only join once
	// it passes the group's stream, which it cannot while both trail the
	// writer.
	w := groupWriter(t, e.dsn, 2, 10*time.Millisecond)
	for round := range 3 {
		e.operate(t, 0, "pause", "-projection", "g2", "-version", "1")
		waitMetric(t, p, "pgscribe_paused", "g2", 1, waitLong)
		// A backlog of large transactions besides the writer's, so that
		// the catch-up lasts long enough for the kill to land in it.
		appendBacklog(t, e, "c", 40, 8, int64(round*100000))
		waitFor(t, waitLong, "g1 to pass the paused g2", func() bool { return e.accounted(t, "g1") >= e.events(t)-200 })
		mark := p.mark()
		e.operate(t, 0, "resume", "-projection", "g2", "-version", "1")
		waitUntil(t, waitLong, "g2 to catch up on a copy of the group's slot", func(context.Context) (bool, error) {
			return p.countLogAfter(mark, logMsg("streaming from a copy of the group's slot", "g2")) > 0, nil
		}, p.broken)
		d := time.Duration(rng.IntN(1000)) * time.Millisecond
		time.Sleep(d) // the random kill moment itself, not synchronisation
		joined := p.countLogAfter(mark, logMsg("joined the group's stream", "g2")) > 0
		p.kill()
		wm := loadWatermark(t, e.pool, "g2", 1)
		t.Logf("round %d: killed %s into g2's catch-up (joined already: %v): g2 watermark on %s at %s; slots %v",
			round, d, joined, wm.slot, wm.lsn, prefixSlots(t, e.pool, e.slotPrefix))
		mark = p.mark()
		p.start()
		if !poll(t, waitLong, "g2 on the group's stream again", func(context.Context) (bool, error) {
			return p.countLogAfter(mark, logMsg("joined the group's stream", "g2"))+
				p.countLogAfter(mark, logMsg("resuming from the group's slot", "g2")) > 0, nil
		}, p.broken) {
			wm := loadWatermark(t, e.pool, "g2", 1)
			gc, _ := slotConfirmed(t, e.pool, groupSlot(e.slotPrefix, "default"))
			oc, _ := slotConfirmed(t, e.pool, e.slot("g2"))
			t.Fatalf("round %d: g2 not on the group's stream %s after the restart: g2 accounts for %d, g1 for %d, of %d events (writer running); g2 watermark %s on %s; own slot confirmed %s, group slot %s; %d walsenders",
				round, waitLong, e.accounted(t, "g2"), e.accounted(t, "g1"), e.events(t), wm.lsn, wm.slot, oc, gc,
				scalar[int64](t, e.pool, `SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender' AND datname = current_database()`))
		}
	}
	w.stop(t)
	e.verifyGroup(t, p, g1, g2)
	p.stop()
}

// TestGroupJoinBelowConfirmed: g2 has a backlog of 30 large transactions
// that g1 applied while g2 was paused, and is killed while it catches up
// on a copy of the group's slot. The restarted node starts the group's
// stream for g1, which is at the end; g2, catching up on its own slot,
// joins the group's stream below g1's position. A kill -9 right after that
// join, before g2 passed g1's position, must not lose any of g2's events:
// the group's slot may not have been confirmed past g2's watermark.
func TestGroupJoinBelowConfirmed(t *testing.T) {
	e, p, g1, g2 := gEnv(t)
	e.operate(t, 0, "pause", "-projection", "g2", "-version", "1")
	waitMetric(t, p, "pgscribe_paused", "g2", 1, waitLong)
	appendBacklog(t, e, "j", 50, 30, 0)
	waitAccounted(t, e.pool, waitLong, "g1", 1, p.broken)
	mark := p.mark()
	e.operate(t, 0, "resume", "-projection", "g2", "-version", "1")
	waitUntil(t, waitLong, "g2 to catch up on a copy of the group's slot", func(context.Context) (bool, error) {
		return p.countLogAfter(mark, logMsg("streaming from a copy of the group's slot", "g2")) > 0, nil
	}, p.broken)
	p.kill()
	w2 := loadWatermark(t, e.pool, "g2", 1)
	t.Logf("killed in g2's catch-up: g2 watermark %s on %s, %d of %d events", w2.lsn, w2.slot, e.accounted(t, "g2"), e.events(t))

	mark = p.mark()
	p.start()
	waitUntil(t, waitLong, "g2 to join the group's stream", func(context.Context) (bool, error) {
		return p.countLogAfter(mark, logMsg("joined the group's stream", "g2"))+
			p.countLogAfter(mark, logMsg("resuming from the group's slot", "g2")) > 0, nil
	}, p.broken)
	p.kill()
	gslot := groupSlot(e.slotPrefix, "default")
	w2 = loadWatermark(t, e.pool, "g2", 1)
	gc, _ := slotConfirmed(t, e.pool, gslot)
	accounted, events := e.accounted(t, "g2"), e.events(t)
	t.Logf("killed after g2 joined: g2 watermark %s on %s (%d of %d events), group slot confirmed %s",
		w2.lsn, w2.slot, accounted, events, gc)
	// The slot may pass the saved watermark row by what g2 had committed
	// and not yet recorded (a keepalive's WAL end once it had every
	// event: the row is saved a few ms after): nothing lies between then.
	if w2.slot == gslot && gc > w2.lsn && accounted < events {
		t.Errorf("the group's slot is confirmed at %s, past g2's watermark %s on it: g2's next start resumes from %s and skips what lies between", gc, w2.lsn, gc)
	}
	p.start()
	e.verifyClean(t, p, g1, g2)
	p.stop()
}

// TestGroupJoinUnderSustainedLoad: under a writer the engine only just
// keeps up with, g2 is paused behind a backlog and resumed. It catches up
// on a copy of the group's slot, but alone it would never pass the group's
// stream, which moves as fast as the writer; once it has asked to join in
// vain for a while, the group's stream waits for it, and it joins while
// the writer still runs. Both end exact, on the group's slot only.
func TestGroupJoinUnderSustainedLoad(t *testing.T) {
	e, p, g1, g2 := gEnv(t)
	w := groupWriter(t, e.dsn, 4, 2*time.Millisecond)
	e.operate(t, 0, "pause", "-projection", "g2", "-version", "1")
	waitMetric(t, p, "pgscribe_paused", "g2", 1, waitLong)
	appendBacklog(t, e, "s", 40, 8, 0)
	waitFor(t, waitLong, "g1 to pass the paused g2", func() bool { return e.accounted(t, "g1") >= e.events(t)-2000 })
	mark := p.mark()
	e.operate(t, 0, "resume", "-projection", "g2", "-version", "1")
	if !poll(t, 2*time.Minute, "g2 to join the group's stream while the writer runs", func(context.Context) (bool, error) {
		return p.countLogAfter(mark, logMsg("joined the group's stream", "g2")) > 0, nil
	}, p.broken) {
		t.Fatalf("g2 never joined: g2 accounts for %d, g1 for %d, of %d events", e.accounted(t, "g2"), e.accounted(t, "g1"), e.events(t))
	}
	if p.countLogAfter(mark, logMsg("the group's stream waits for a member", "")) == 0 {
		t.Log("g2 joined without the group's stream waiting for it (the writer left it room)")
	}
	w.stop(t)
	e.verifyGroup(t, p, g1, g2)
	p.stop()
}

// groupWriter starts a writer on 8 streams (perTx events per transaction,
// pause between them) that the test's end stops unless the test did.
func groupWriter(t *testing.T, dsn string, perTx int, pause time.Duration) *faultWriter {
	t.Helper()
	w := startWriter(dsn, 8, perTx, pause)
	t.Cleanup(func() {
		select {
		case <-w.stopc:
		default:
			w.stop(t)
		}
	})
	return w
}

// appendBacklog appends txs transactions of 1,000 Tick events each over
// the streams <prefix>-0 … <prefix>-<streams-1>, their amounts from base.
func appendBacklog(t *testing.T, e *faultEnv, prefix string, streams, txs int, base int64) {
	t.Helper()
	for tx := range txs {
		evs := make([]faultEvent, 0, 1000)
		for i := range 1000 {
			evs = append(evs, ev(fmt.Sprintf("%s-%d", prefix, i%streams), "Tick", base+int64(tx*1000+i)))
		}
		e.appendEvents(t, evs...)
	}
}

// TestGroupSlowMemberDetached: of a group of two, g2's rule sleeps in
// PostgreSQL for every event, so that its queue stays full under a burst.
// After slow_member_timeout (5 s by default) the group's stream detaches
// it: g1 applies the whole burst without waiting for g2, g2's watermark
// holds the group's slot back meanwhile, g2 catches up on a copy of the
// group's slot, joins again, and both end exact.
func TestGroupSlowMemberDetached(t *testing.T) {
	t.Parallel()
	g1 := faultProjection{name: "g1", types: []string{"Tick"}}
	g2 := faultProjection{name: "g2", types: []string{"Tick"}, extra: []rule{
		{name: "slow", on: "Tick", op: "sql", args: `["stream_id"]`, sql: "SELECT pg_sleep(0.003) WHERE $1::text IS NOT NULL"}}}
	e, p := startFault(t, 10, "", []faultEvent{ev("b-0", "Tick", 1)}, g1, g2)
	for _, g := range []string{"g1", "g2"} {
		p.waitLog(waitLong, g+" joining the group", logMsg("joined the group's stream", g))
	}
	mark := p.mark()
	appendBacklog(t, e, "s", 20, 5, 0) // 5,000 events: about 15 s of g2's sleeps
	total := e.events(t)
	waitAccounted(t, e.pool, waitLong, "g1", 1, p.broken)
	if p.countLogAfter(mark, logMsg("a member's queue stayed full: detached", "")) == 0 {
		t.Errorf("g1 caught up, yet no member was detached for a full queue")
	}
	if got := e.accounted(t, "g2"); got >= total {
		t.Errorf("g2 accounts for all %d events as soon as g1: was it slow at all?", got)
	}
	waitUntil(t, waitLong, "g2 to join the group's stream again", func(context.Context) (bool, error) {
		return p.countLogAfter(mark, logMsg("joined the group's stream", "g2")) > 0, nil
	}, p.broken)
	if p.countLogAfter(mark, logMsg("streaming from a copy of the group's slot", "g2")) == 0 {
		t.Errorf("g2 rejoined without catching up on a copy of the group's slot")
	}
	bothOnStream(t, e, p, g1, g2)
	p.stop()
}

// TestGroupKill9DuringSharedScan: three members of the default group (w6's
// shape, with rule and commit-time poison and rows every stream writes;
// balances; activity) build together from one scan of the group's slot
// while writers append. pgscribe is killed (SIGKILL) during the scan at a
// random moment, three times; each restart scans again for all three (the
// interrupted backfill is recorded on the group's slot), and no slot but
// the group's is ever made. All end exact, with the dead letters w6's
// poison calls for, on the group's slot alone.
func TestGroupKill9DuringSharedScan(t *testing.T) {
	w6, bal, act := w6Projection(), balancesProjection(), activityProjection()
	members := []gMember{{w6.name, w6.version}, {bal.name, bal.version}, {act.name, act.version}}
	// w6 is the slowest member; on a loaded machine it may hold the
	// others back for half of the default slow_member_timeout and be
	// dropped from the scan (TestGroupScanDropsSlowMember tests that):
	// this test is about kills, so the scan waits for every member.
	r := newRig(t, []coreProjection{w6, bal, act}, map[string]string{"slow_member_timeout": `"10m"`})
	seed := seedFromEnv(t)
	rng := rand.New(rand.NewPCG(seed, 13))
	r.seed(1500, 30)
	a := newAppender(r, 1600, 3*time.Millisecond)
	a.start(2, seed)
	gslot := groupSlot(r.prefix, "default")
	scanned := `msg="one scan of the group's slot for its members"`
	for round := range 3 {
		s := r.start()
		live := false
		r.waitUntil(2*time.Minute, "the shared scan to begin", func(context.Context) (bool, error) {
			live = true
			for _, m := range members {
				live = live && loadWatermark(t, r.pool, m.name, m.version).phase == "live"
			}
			return live || linesWith(s, scanned) > 0, nil
		})
		if live && linesWith(s, scanned) == 0 {
			// The last kill came after the scan's end.
			t.Logf("round %d: every member live at the start, no scan to interrupt", round)
			s.kill()
			break
		}
		d := time.Duration(rng.IntN(1500)) * time.Millisecond
		time.Sleep(d) // the random kill moment itself, not synchronisation
		s.kill()
		if n := linesWith(s, scanned, "members=3"); n != 1 {
			t.Errorf("round %d: %d scans for the three members, want one", round, n)
		}
		var state []string
		for _, m := range members {
			w := loadWatermark(t, r.pool, m.name, m.version)
			state = append(state, fmt.Sprintf("%s: slot %s phase %s", m.name, w.slot, w.phase))
			if w.ok && w.slot != gslot {
				t.Errorf("round %d: %s's watermark is on %s, not on the group's slot", round, m.name, w.slot)
			}
		}
		slots := prefixSlots(t, r.pool, r.prefix)
		if len(slots) > 1 || (len(slots) == 1 && !has(slots, gslot)) {
			t.Errorf("round %d: slots %v, want the group's alone", round, slots)
		}
		covered := groupNotAhead(t, r, a, fmt.Sprintf("kill %d", round+1), w6, bal, act)
		t.Logf("round %d: killed %s after the scan began: %s; slots %v; %d transactions checked at or below the confirmed positions",
			round, d, strings.Join(state, ", "), slots, covered)
	}
	s := r.start()
	r.waitStreaming(s, 3*time.Minute)
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(3 * time.Minute)
	r.verify()
	requireW6Poison(t, r.pool)
	requireOnGroupSlot(t, r.pool, r.prefix, "default", members...)
	if n := linesWith(s, `msg="joined the group's stream"`, `after="its own slot"`) + linesWith(s, `msg="backfilling from a slot of its own`); n != 0 {
		t.Errorf("after the last restart: %d members backfilled or joined from a slot of their own, want none", n)
	}
	s.terminate(time.Minute)
	t.Logf("%d events appended by writers", a.events.Load())
}

func has(m map[string]bool, k string) bool { _, ok := m[k]; return ok }
