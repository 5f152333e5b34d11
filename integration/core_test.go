package integration

// Core guarantees of pgscribe against a real PostgreSQL: backfill then live
// under concurrent writers, exactness of several projections over the same
// events, dead letters, idle slot confirmation, confirmation never ahead of
// what is applied, and graceful stop.

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

// TestBackfillThenLive: events exist before pgscribe first starts, writers
// keep appending while it backfills and after it went live, and their
// global positions commit out of order. Once the writers stop, both demo
// projections are exact and conserve every event.
func TestBackfillThenLive(t *testing.T) {
	r := newRig(t, []coreProjection{balancesProjection(), activityProjection()}, nil)
	seed := seedFromEnv(t)
	r.seed(400, 50)
	a := newAppender(r, 600, 2*time.Millisecond)
	a.start(6, seed)
	r.waitUntil(time.Minute, "writers to append", func(context.Context) (bool, error) { return a.events.Load() > 200, nil })

	s := r.start()
	r.waitLog(s, time.Minute, `msg="backfill started"`, 2)
	atStart := a.events.Load()
	r.waitLog(s, 3*time.Minute, `msg="backfill complete"`, 2)
	atLive := a.events.Load()
	if atLive <= atStart {
		t.Errorf("no event appended while backfilling (%d before, %d after)", atStart, atLive)
	}
	r.waitUntil(time.Minute, "writers to append while live", func(context.Context) (bool, error) {
		return a.events.Load() > atLive+3000, nil
	})
	a.stop()
	a.checkErrors()
	t.Logf("appended %d events during the run (%d during backfill), %d conflicts retried",
		a.events.Load(), atLive-atStart, a.retries.Load())

	r.waitCaughtUp(2 * time.Minute)
	r.verify()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if n := r.outOfOrderCommits(ctx); n == 0 {
		t.Error("no event committed before an event of lower position: the workload did not exercise out-of-order commits")
	} else {
		t.Logf("%d events committed before an event of lower position", n)
	}
	s.terminate(time.Minute)
	// A graceful stop records the watermark: everything was applied, so its
	// position is the highest in the table.
	for _, p := range r.projs {
		var wm, top int64
		err := r.pool.QueryRow(ctx, `SELECT coalesce(w.position, 0), (SELECT max(position) FROM events)
			FROM pgscribe.watermarks w WHERE w.projection = $1 AND w.version = $2`, p.name, p.version).Scan(&wm, &top)
		if err != nil {
			t.Fatal(err)
		}
		if wm != top {
			t.Errorf("%s: watermarks.position %d after a graceful stop, want the highest position %d", p.name, wm, top)
		}
	}
}

// TestTwoProjectionsExact runs two projections over the same events, the
// second added while the first is live: one resumes from its slot while
// the other backfills into its own, writers appending all along; then both
// join their group's shared slot. Both end exact, both on the group's
// slot, and neither own slot is left.
func TestTwoProjectionsExact(t *testing.T) {
	bal, stats := balancesProjection(), streamStatsProjection()
	r := newRig(t, []coreProjection{bal}, nil)
	seed := seedFromEnv(t)
	r.seed(300, 20)
	a := newAppender(r, 400, 2*time.Millisecond)
	a.start(4, seed)

	s := r.start()
	r.waitLog(s, time.Minute, `msg="backfill complete" projection=balances`, 1)
	mark := a.events.Load()
	r.waitUntil(time.Minute, "writers to append while balances is live", func(context.Context) (bool, error) {
		return a.events.Load() > mark+1000, nil
	})
	s.terminate(time.Minute)

	r.setProjections(bal, stats)
	s = r.start()
	r.waitLog(s, time.Minute, `msg="resuming from slot" projection=balances`, 1)
	r.waitLog(s, time.Minute, `msg="backfill complete" projection=stream_stats`, 1)
	mark = a.events.Load()
	r.waitUntil(time.Minute, "writers to append while both are live", func(context.Context) (bool, error) {
		return a.events.Load() > mark+1000, nil
	})
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(2 * time.Minute)
	r.verify()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	group := r.prefix + "_group_default"
	for _, p := range []coreProjection{bal, stats} {
		if _, ok, err := r.slotConfirmed(ctx, r.slot(p)); err != nil || ok {
			t.Errorf("own slot %s: exists=%t, err=%v; want it dropped after the join", r.slot(p), ok, err)
		}
		var on string
		if err := r.pool.QueryRow(ctx, `SELECT slot_name FROM pgscribe.watermarks WHERE projection = $1 AND version = $2`,
			p.name, p.version).Scan(&on); err != nil || on != group {
			t.Errorf("%s: watermark on slot %q (err %v), want the group's %q", p.name, on, err, group)
		}
	}
	var slots []string
	if err := r.pool.QueryRow(ctx, `SELECT coalesce(array_agg(slot_name::text ORDER BY slot_name), '{}') FROM pg_replication_slots WHERE slot_name LIKE $1 || '%'`,
		r.prefix).Scan(&slots); err != nil || len(slots) != 1 || slots[0] != group {
		t.Errorf("slots of the run: %v (err %v), want only the group's %s", slots, err, group)
	}
	s.terminate(time.Minute)
}

// TestPoisonEventDeadLettered: events a rule rejects (a fail rule, or an
// expression that cannot be evaluated) are dead-lettered with the rule's
// name, a readable message and the event as it was, in the backfill and
// while streaming; the rest of their stream still applies, and
// conservation counts them as dead-lettered. A projection without such a
// rule applies the same events.
func TestPoisonEventDeadLettered(t *testing.T) {
	bal, act := balancesProjection(), activityProjection()
	r := newRig(t, []coreProjection{bal, act}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r.seed(50, 10)

	type poison struct {
		ev      appended
		kind    string
		message string // a substring of error_message
	}
	var poisons []poison
	// In the backfill: a zero withdrawal between two good events, and a
	// negative opening whose later deposit finds no account.
	r.appendEvent(ctx, nil, "acct-p1", typeOpened, map[string]any{"account_id": "acct-p1", "owner": "p1", "initial": 100})
	poisons = append(poisons, poison{r.appendEvent(ctx, nil, "acct-p1", typeWithdrawn, map[string]any{"account_id": "acct-p1", "amount": 0}),
		"rule:non_positive_amount", "non-positive amount in Withdrawn: 0"})
	r.appendEvent(ctx, nil, "acct-p1", typeDeposited, map[string]any{"account_id": "acct-p1", "amount": 7})
	poisons = append(poisons, poison{r.appendEvent(ctx, nil, "acct-p2", typeOpened, map[string]any{"account_id": "acct-p2", "owner": "p2", "initial": -5}),
		"rule:negative_opening", "negative initial balance: -5"})
	r.appendEvent(ctx, nil, "acct-p2", typeDeposited, map[string]any{"account_id": "acct-p2", "amount": 10})

	s := r.start()
	r.waitCaughtUp(2 * time.Minute)
	r.verify()

	// While streaming: a negative withdrawal, a deposit without an amount
	// (the move rule cannot evaluate it), then a good deposit.
	poisons = append(poisons, poison{r.appendEvent(ctx, nil, "acct-p1", typeWithdrawn, map[string]any{"account_id": "acct-p1", "amount": -3}),
		"rule:non_positive_amount", "non-positive amount in Withdrawn: -3"})
	poisons = append(poisons, poison{r.appendEvent(ctx, nil, "acct-p1", typeDeposited, map[string]any{"account_id": "acct-p1"}),
		"rule:move", ""})
	last := r.appendEvent(ctx, nil, "acct-p1", typeDeposited, map[string]any{"account_id": "acct-p1", "amount": 11})
	r.waitCaughtUp(time.Minute)
	r.verify()

	for _, p := range poisons {
		var kind, message, typ, stream, data string
		var position, streamPosition int64
		err := r.pool.QueryRow(ctx, `SELECT error_kind, error_message, event_type, stream_id, stream_position, position, event_data::text
			FROM pgscribe.dead_letters WHERE projection = 'balances' AND version = 1 AND event_id = $1`, p.ev.id).
			Scan(&kind, &message, &typ, &stream, &streamPosition, &position, &data)
		if err != nil {
			t.Errorf("dead letter of %s %s/%d: %v", p.ev.typ, p.ev.stream, p.ev.streamPosition, err)
			continue
		}
		if kind != p.kind {
			t.Errorf("%s/%d: error_kind %q, want %q", p.ev.stream, p.ev.streamPosition, kind, p.kind)
		}
		if p.message != "" && !strings.Contains(message, p.message) {
			t.Errorf("%s/%d: error_message %q, want it to contain %q", p.ev.stream, p.ev.streamPosition, message, p.message)
		}
		if message == "" {
			t.Errorf("%s/%d: empty error_message", p.ev.stream, p.ev.streamPosition)
		}
		if typ != p.ev.typ || stream != p.ev.stream || streamPosition != p.ev.streamPosition || position != p.ev.position {
			t.Errorf("dead letter says %s %s/%d at %d, the event is %s %s/%d at %d",
				typ, stream, streamPosition, position, p.ev.typ, p.ev.stream, p.ev.streamPosition, p.ev.position)
		}
		if !sameJSON(t, data, string(p.ev.data)) {
			t.Errorf("%s/%d: event_data %s, want %s", p.ev.stream, p.ev.streamPosition, data, p.ev.data)
		}
		t.Logf("dead letter %s/%d: %s: %s", stream, streamPosition, kind, message)
	}

	// The stream went on past its poison: opening 100 + 7 + 11.
	r.checkAccount(ctx, "acct-p1", 118, last.streamPosition, 3, 3)
	if n := r.queryInt(ctx, `SELECT count(*) FROM balances WHERE account_id = 'acct-p2'`); n != 0 {
		t.Errorf("acct-p2, whose opening was dead-lettered, has %d balances rows", n)
	}
	if n := r.queryInt(ctx, `SELECT coalesce(sum(dead_lettered), 0)::bigint FROM pgscribe.cursors WHERE projection = 'balances' AND version = 1`); n != int64(len(poisons)) {
		t.Errorf("balances cursors count %d dead-lettered events, want %d", n, len(poisons))
	}
	s.terminate(time.Minute)
}

// TestDecodeErrorDeadLettered: with a text events.data column (possible
// with json or text), an event whose data is not JSON is dead-lettered as
// "decode" with a readable reason and its text, in the backfill and live,
// and its stream goes on past it.
func TestDecodeErrorDeadLettered(t *testing.T) {
	bal := balancesProjection()
	r := newRig(t, []coreProjection{bal}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r.exec(ctx, "ALTER TABLE events ALTER COLUMN data TYPE text USING data::text")
	type bad struct {
		ev   appended
		text string
	}
	appendText := func(typ, text string) bad {
		t.Helper()
		e := appended{stream: "acct-d1", typ: typ, data: []byte(text)}
		err := r.pool.QueryRow(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
			SELECT $1, coalesce(max(stream_position), 0) + 1, $2, $3::text FROM events WHERE stream_id = $1
			RETURNING id::text, position, stream_position`, e.stream, typ, text).Scan(&e.id, &e.position, &e.streamPosition)
		if err != nil {
			t.Fatalf("append %s: %v", typ, err)
		}
		return bad{e, text}
	}
	r.appendEvent(ctx, nil, "acct-d1", typeOpened, map[string]any{"account_id": "acct-d1", "owner": "d1", "initial": 100})
	bads := []bad{appendText(typeDeposited, `{"account_id": "acct-d1", "amount": 5`)}
	r.appendEvent(ctx, nil, "acct-d1", typeDeposited, map[string]any{"account_id": "acct-d1", "amount": 7})

	s := r.start()
	r.waitCaughtUp(2 * time.Minute)
	bads = append(bads, appendText(typeWithdrawn, "not JSON at all: \\u0000 \"quoted\""))
	last := r.appendEvent(ctx, nil, "acct-d1", typeDeposited, map[string]any{"account_id": "acct-d1", "amount": 11})
	r.waitCaughtUp(time.Minute)

	for _, b := range bads {
		var kind, message, text string
		err := r.pool.QueryRow(ctx, `SELECT error_kind, error_message, event_data #>> '{}'
			FROM pgscribe.dead_letters WHERE projection = 'balances' AND version = 1 AND event_id = $1`, b.ev.id).
			Scan(&kind, &message, &text)
		if err != nil {
			t.Errorf("dead letter of %s/%d: %v", b.ev.stream, b.ev.streamPosition, err)
			continue
		}
		if kind != "decode" || !strings.Contains(message, b.ev.id+" data:") {
			t.Errorf("%s/%d: error_kind %q, error_message %q; want decode, naming the event's data",
				b.ev.stream, b.ev.streamPosition, kind, message)
		}
		if text != b.text {
			t.Errorf("%s/%d: event_data holds %q, want the event's text %q", b.ev.stream, b.ev.streamPosition, text, b.text)
		}
		t.Logf("dead letter %s/%d: %s: %s", b.ev.stream, b.ev.streamPosition, kind, message)
	}
	// The stream went on past what it could not decode: 100 + 7 + 11.
	r.checkAccount(ctx, "acct-d1", 118, last.streamPosition, 3, 2)
	s.terminate(time.Minute)
}

// checkAccount compares an account's balance and its stream's balances v1
// cursor (position reached, events applied and dead-lettered) with what
// the test expects.
func (r *rig) checkAccount(ctx context.Context, account string, balance, cursorPos, applied, dead int64) {
	r.t.Helper()
	var b, c, a, d int64
	err := r.pool.QueryRow(ctx, `SELECT b.balance, c.stream_position, c.applied, c.dead_lettered
		FROM balances b, pgscribe.cursors c
		WHERE b.account_id = $1 AND c.projection = 'balances' AND c.version = 1 AND c.stream_id = $1`, account).
		Scan(&b, &c, &a, &d)
	if err != nil {
		r.t.Fatal(err)
	}
	if b != balance || c != cursorPos || a != applied || d != dead {
		r.t.Errorf("%s: balance %d, cursor at %d, %d applied, %d dead-lettered; want %d, %d, %d, %d",
			account, b, c, a, d, balance, cursorPos, applied, dead)
	}
}

func sameJSON(t *testing.T, a, b string) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal([]byte(a), &x); err != nil {
		t.Fatalf("%s: %v", a, err)
	}
	if err := json.Unmarshal([]byte(b), &y); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return reflect.DeepEqual(x, y)
}

// TestIdleSlotConfirmed: once caught up, with the events table idle, WAL
// written elsewhere on the server is confirmed by the slot within a few
// status intervals (1s here), so an idle projection retains no WAL. An
// events transaction that was open across that confirmation is not lost:
// committed after a SIGKILL of pgscribe, it is applied after the restart.
func TestIdleSlotConfirmed(t *testing.T) {
	bal := balancesProjection()
	r := newRig(t, []coreProjection{bal}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r.seed(20, 5)
	s := r.start()
	r.waitCaughtUp(time.Minute)
	r.waitUntil(time.Minute, "the balances phase to be live", func(ctx context.Context) (bool, error) {
		phase, err := r.phase(ctx, bal)
		return phase == "live", err
	})

	// An events transaction left open across the idle confirmation.
	open, err := r.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Rollback(context.WithoutCancel(ctx))
	held := r.appendEvent(ctx, open, "acct-1", typeDeposited, map[string]any{"account_id": "acct-1", "amount": 5})

	accounted, err := r.accounted(ctx, bal)
	if err != nil {
		t.Fatal(err)
	}
	var from, to string
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	r.exec(ctx, `CREATE TABLE filler (id int, pad text)`)
	r.exec(ctx, `INSERT INTO filler SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g`)
	r.exec(ctx, `SELECT pg_logical_emit_message(false, 'pgscribe-test', 'idle'), pg_logical_emit_message(true, 'pgscribe-test', 'idle')`)
	r.exec(ctx, `SELECT pg_switch_wal()`)
	if err := r.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&to); err != nil {
		t.Fatal(err)
	}
	generated := r.queryInt(ctx, `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, to, from)
	target, err := pglogrepl.ParseLSN(to)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r.waitUntil(10*time.Second, "the slot to confirm the unrelated WAL", func(ctx context.Context) (bool, error) {
		confirmed, _, err := r.slotState(ctx, bal)
		return confirmed >= target, err
	})
	retained := r.queryInt(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint
		FROM pg_replication_slots WHERE slot_name = $1`, r.slot(bal))
	t.Logf("%d bytes of unrelated WAL confirmed in %s; %d bytes behind the WAL end now",
		generated, time.Since(start).Round(time.Millisecond), retained)
	if retained > 1<<20 {
		t.Errorf("slot %s is %d bytes behind the WAL end while idle", r.slot(bal), retained)
	}
	if now, err := r.accounted(ctx, bal); err != nil || now != accounted {
		t.Errorf("accounted events changed from %d to %d (err %v) with no event committed", accounted, now, err)
	}

	s.kill()
	if err := open.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	s = r.start()
	r.waitCaughtUp(time.Minute)
	r.verify()
	cursors, err := r.cursorPositions(ctx, bal)
	if err != nil {
		t.Fatal(err)
	}
	if cursors[held.stream] < held.streamPosition {
		t.Errorf("event held open across the idle confirmation (%s/%d) not applied", held.stream, held.streamPosition)
	}
	s.terminate(time.Minute)
}

// TestSlotNeverConfirmedAhead samples, under live load, each slot's
// confirmed_flush_lsn and then the cursors: every appended transaction that
// committed at or below the confirmed LSN must already be accounted for
// (guarantee 7, "nothing runs ahead"). The check is sound while pgscribe
// runs (slot read before cursors; commit LSNs bounded from above), and
// exact after a SIGKILL, which it also does twice.
func TestSlotNeverConfirmedAhead(t *testing.T) {
	bal, act := balancesProjection(), activityProjection()
	r := newRig(t, []coreProjection{bal, act}, map[string]string{"batch_timeout": `"50ms"`})
	seed := seedFromEnv(t)
	r.seed(200, 10)
	a := newAppender(r, 400, time.Millisecond)
	a.start(4, seed)
	s := r.start()

	for round := range 2 {
		r.waitStreaming(s, 2*time.Minute)
		seen := map[pglogrepl.LSN]bool{}
		samples, covered := 0, 0
		r.waitUntil(time.Minute, "the slot to be confirmed at 5 distinct positions under load", func(ctx context.Context) (bool, error) {
			confirmed, _, err := r.slotState(ctx, bal)
			if err != nil {
				return false, err
			}
			seen[confirmed] = true
			samples++
			covered += r.checkNotAhead("sample", a)
			return len(seen) >= 5 || t.Failed(), nil
		})
		if t.Failed() {
			t.FailNow()
		}
		s.kill()
		after := r.checkNotAhead("after SIGKILL", a)
		t.Logf("round %d: %d samples at %d confirmed positions checked %d transactions (summed over samples); after SIGKILL %d transactions at or below the confirmed LSNs, all applied",
			round, samples, len(seen), covered, after)
		if after == 0 {
			t.Errorf("round %d: no transaction at or below the confirmed LSN after SIGKILL: the check proved nothing", round)
		}
		s = r.start()
	}
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(2 * time.Minute)
	r.verify()
	s.terminate(time.Minute)
}

// TestGracefulStopUnderLoad stops pgscribe with SIGTERM under load, once
// while it backfills and twice while it streams: each time it exits 0
// within the shutdown timeout, leaves no session behind, and has not
// confirmed the slot past what it applied. Restarted, it ends exact. The
// backfill it stops is a resumed one (after a SIGKILL, on the same slot
// from its recorded point): a stop there must not mark the projection
// live.
func TestGracefulStopUnderLoad(t *testing.T) {
	bal := balancesProjection()
	r, a, seed, rng := newLoadRig(t, 600, 50, 200, 2*time.Millisecond, 1)
	a.start(4, seed)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	const shutdownTimeout = 30 * time.Second // rigEngineDefaults
	backfillProgress := func(s *node, msg string) {
		t.Helper()
		r.waitLog(s, time.Minute, `msg="`+msg+`" projection=balances`, 1)
		r.waitApplied(ctx, bal, time.Minute, 0, "the backfill to apply something")
	}
	s := r.start()
	backfillProgress(s, "backfill started")
	s.kill()
	for i := range 3 {
		s := r.start()
		if i == 0 {
			// Killed in its backfill, it goes on with it on its slot.
			backfillProgress(s, "backfill resumed")
		} else {
			r.waitStreaming(s, 2*time.Minute)
		}
		// The random stop moment, not synchronisation; earlier in the
		// backfill, so that it is still running.
		maxDelay := time.Second
		if i == 0 {
			maxDelay = 300 * time.Millisecond
		}
		time.Sleep(time.Duration(rng.Int64N(int64(maxDelay))))
		took := s.terminate(shutdownTimeout + 5*time.Second)
		phase, err := r.phase(ctx, bal)
		if err != nil {
			t.Fatal(err)
		}
		if want := map[bool]string{true: "backfilling", false: "live"}[i == 0]; phase != want {
			t.Errorf("stop %d: balances phase %q after the stop, want %q", i+1, phase, want)
		}
		t.Logf("stop %d (balances %s): exit 0 after %s", i+1, phase, took.Round(time.Millisecond))
		r.waitUntil(10*time.Second, "pgscribe's sessions to end", func(ctx context.Context) (bool, error) {
			var n int64
			err := r.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = 'pgscribe'`).Scan(&n)
			return n == 0, err
		})
		r.checkNotAhead(fmt.Sprintf("stop %d", i+1), a)
	}
	s = r.start()
	a.stop()
	a.checkErrors()
	r.waitCaughtUp(3 * time.Minute)
	r.verify()
	s.terminate(shutdownTimeout + 5*time.Second)
}

// TestBigEventsUnderByteBound: events of 300 KB, every seventh of 1.5 MB,
// under buffer_mb = 1: a backfill page holds one event, the partitions
// hold about three, and an event bigger than the bound passes alone.
// Backfilled and streamed, the read models end exact.
func TestBigEventsUnderByteBound(t *testing.T) {
	inEveryFeed(t, false, func(t *testing.T) {
		projs := []coreProjection{balancesProjection(), activityProjection()}
		r := newRig(t, projs, map[string]string{"buffer_mb": "1"})
		r.bulkPadded("big-", 12, 8, 300_000)
		s := r.start()
		r.waitLog(s, 2*time.Minute, `msg="backfill complete"`, len(projs))
		r.bulkPadded("live-", 6, 6, 300_000)
		r.waitCaughtUp(3 * time.Minute)
		r.verify()
		s.terminate(time.Minute)
	})
}

// TestBackfillPagesAfterTheSnapshot: the backfill reads its pages in
// transactions of their own, not in the slot's snapshot, so a page can see
// events committed after the snapshot, which the stream delivers too. A
// writer commits, while the backfill waits a few pages in (its read
// models locked), streams whose first event has a position the backfill
// has read past and whose second one a position it has not (explicit
// positions in gaps of the sequence, as a cached sequence or a store
// choosing its own positions makes). Applying the second from the page
// would move the stream's cursor past the first, which the stream then
// brings: lost. None may be lost, and the pages must have seen them.
func TestBackfillPagesAfterTheSnapshot(t *testing.T) {
	inEveryFeed(t, false, func(t *testing.T) {
		projs := []coreProjection{balancesProjection(), activityProjection()}
		r := newRig(t, projs, map[string]string{"buffer_mb": "1", "backfill_batch_size": "200"})
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		r.exec(ctx, "SELECT setval('events_position_seq', 10)")   // positions 1–10 free
		r.seed(100, 20)                                           // 11–2010
		r.exec(ctx, "SELECT setval('events_position_seq', 3010)") // 2011–3010 free
		r.bulk("after-", 100, 20)                                 // 3011–5010
		// balances' read model locked: its backfill's first batches wait,
		// its byte bound fills, its reader stops a few pages in. Not
		// activity's: a batch waiting on a lock may hold a transaction id,
		// and a slot's creation waits for every such transaction, so
		// activity could not start its backfill until the lock went.
		lock, err := r.pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = lock.Rollback(context.WithoutCancel(ctx)) }()
		if _, err := lock.Exec(ctx, "LOCK TABLE balances IN EXCLUSIVE MODE"); err != nil {
			t.Fatal(err)
		}
		s := r.start()
		r.waitLog(s, time.Minute, `msg="backfill started" projection=balances`, 1)
		r.waitUntil(time.Minute, "balances' backfill to wait on its read model", func(ctx context.Context) (bool, error) {
			n := r.queryInt(ctx, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'balances'::regclass`)
			return n > 0, nil
		})
		r.exec(ctx, `INSERT INTO events (position, stream_id, stream_position, type, data)
SELECT CASE WHEN sp = 1 THEN 5 + s ELSE 2500 + s END, 'straddle-' || s, sp,
	CASE WHEN sp = 1 THEN 'AccountOpened' ELSE 'Deposited' END,
	CASE WHEN sp = 1 THEN jsonb_build_object('account_id', 'straddle-' || s, 'owner', 'owner ' || s, 'initial', 5)
		ELSE jsonb_build_object('account_id', 'straddle-' || s, 'amount', 7) END
FROM generate_series(1, 2) AS sp CROSS JOIN generate_series(0, 1) AS s ORDER BY sp, s`)
		if err := lock.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		r.waitLog(s, 3*time.Minute, `msg="backfill complete"`, len(projs))
		r.waitCaughtUp(2 * time.Minute)
		r.verify()
		// Alone, balances' scan logs it; as members, the group's one scan.
		if n := s.logText(`left to the stream"`); n == 0 {
			t.Error("no backfill page saw the events committed after the snapshot: the test did not exercise the scout")
		}
		s.terminate(time.Minute)
	})
}
