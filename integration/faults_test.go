package integration

// Fault tests (guarantees 4–5 of docs/architecture.md, the lost slot and
// the failure classes of docs/failures.md):
// every failure ends in the response its class calls for — dead letter,
// halt, retry or resync — visibly (log, metric, health), and with nothing
// lost: each test ends with the read model equal to an independent SQL
// computation from the events table and with conservation
// (events == applied + skipped + dead_lettered, one dead-letter row per
// dead-lettered event).
//
// The engine runs as a child process (`pgscribe run`), exactly as users run
// it. Tests that restart the server do not run in parallel with the others.

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/apply"
)

// rounds returns n rounds of one event per stream (<prefix>-0 …), of type
// typ with v = round*streams + stream, in round order; at replaces the
// event of a {round, stream}.
func rounds(prefix string, streams, n int, typ string, at map[[2]int]faultEvent) []faultEvent {
	out := make([]faultEvent, 0, streams*n)
	for r := 0; r < n; r++ {
		for s := 0; s < streams; s++ {
			x, ok := at[[2]int{r, s}]
			if !ok {
				x = ev("", typ, int64(r*streams+s))
			}
			x.stream = fmt.Sprintf("%s-%d", prefix, s)
			out = append(out, x)
		}
	}
	return out
}

// poisonCase is a dead-letter scenario: a projection with extra rules and
// tables, a backlog applied by the backfill, then live transactions each
// of which mixes poison into good events.
type poisonCase struct {
	proj     faultProjection
	ddl      string // extra read-model tables
	backlog  []faultEvent
	live     [][]faultEvent
	isolated bool // poison fails at commit: the batch must have been isolated
	check    func(t *testing.T, e *faultEnv)
}

// runPoison runs a poisonCase to the end and checks everything a dead
// letter promises: the poison and nothing else is dead-lettered, with its
// kind, the rest of its batch and later events of its stream apply, in
// order, each exactly once.
func runPoison(t *testing.T, c poisonCase) (*faultEnv, *node) {
	t.Helper()
	e, p := startFault(t, 5, c.ddl, c.backlog, c.proj)
	for _, tx := range c.live {
		e.appendEvents(t, tx...)
	}
	waitAccounted(t, e.pool, waitLong, c.proj.name, 1, p.broken)

	c.proj.check(t, e)
	if c.check != nil {
		c.check(t, e)
	}
	e.checkAccounting(t, c.proj.name)
	wantDead := e.scalar(t, `SELECT count(*) FROM events WHERE metadata->>'expect' IS NOT NULL`)
	if wantDead == 0 {
		t.Fatal("the workload has no poison")
	}
	if got := p.metric("pgscribe_events_total", projLabels(c.proj.name, "outcome", "dead_lettered")); got != float64(wantDead) {
		t.Errorf("pgscribe_events_total{outcome=dead_lettered} = %v, want %d", got, wantDead)
	}
	if c.isolated {
		if got := p.metric("pgscribe_batches_total", projLabels(c.proj.name, "result", "isolated")); got < 1 {
			t.Errorf("pgscribe_batches_total{result=isolated} = %v: the poison never went through per-event isolation", got)
		}
	}
	if v := p.metric("pgscribe_halted", projLabels(c.proj.name)); v != 0 {
		t.Errorf("pgscribe_halted = %v, want 0: poison must not halt", v)
	}
	p.stop()
	return e, p
}

// TestFaultUniqueViolation: two events collide on a unique column of the
// read model. The second dead-letters as commit:23505 (unique_violation)
// while the rest of its batch commits, and later events of its stream still
// apply, in order. One collision is with a row applied earlier, one is
// inside the same transaction and stream.
func TestFaultUniqueViolation(t *testing.T) {
	t.Parallel()
	const kind = "commit:23505 (unique_violation)"
	reg := func(email string) faultEvent {
		return faultEvent{typ: "Registered", data: map[string]any{"v": 0, "email": email}}
	}
	dup := func(email string) faultEvent { x := reg(email); x.expect = kind; return x }
	c := poisonCase{
		proj: faultProjection{name: "uniq", types: []string{"Registered", "Noted"}, extra: []rule{
			{name: "email", on: "Registered", op: "insert", table: "uniq_emails", set: `email = "data.email", event_id = "id"`}}},
		ddl: `CREATE TABLE uniq_emails (email text NOT NULL UNIQUE, event_id uuid PRIMARY KEY)`,
		backlog: rounds("u", 8, 2, "Noted", map[[2]int]faultEvent{
			{0, 3}: reg("three@example.com"),
		}),
		live: [][]faultEvent{
			rounds("u", 8, 20, "Noted", map[[2]int]faultEvent{
				{5, 2}:  reg("two@example.com"),
				{9, 7}:  dup("three@example.com"), // taken by u-3 in the backlog
				{12, 2}: dup("two@example.com"),   // taken by u-2 earlier in this batch
				{15, 7}: reg("seven@example.com"),
			}),
			rounds("u", 8, 2, "Noted", nil),
		},
		isolated: true,
		check: func(t *testing.T, e *faultEnv) {
			sameRows(t, e.pool, "uniq_emails", `SELECT email, event_id::text FROM uniq_emails`,
				`SELECT data->>'email', id::text FROM events WHERE type = 'Registered' AND metadata->>'expect' IS NULL`)
		},
	}
	runPoison(t, c)
}

// TestFaultNotNullViolation: a sql rule inserts NULLIF(name, ”) into a NOT
// NULL column; events with an empty name dead-letter as
// commit:23502 (not_null_violation).
func TestFaultNotNullViolation(t *testing.T) {
	t.Parallel()
	named := func(name, expect string) faultEvent {
		return faultEvent{typ: "Named", data: map[string]any{"v": 1, "name": name}, expect: expect}
	}
	const kind = "commit:23502 (not_null_violation)"
	runPoison(t, poisonCase{
		proj: faultProjection{name: "notnull", types: []string{"Named", "Noted"}, extra: []rule{{name: "name", on: "Named", op: "sql",
			sql: "INSERT INTO notnull_names (event_id, name) VALUES ($1, NULLIF($2, ''))", args: `["id", "data.name"]`}}},
		ddl: `CREATE TABLE notnull_names (event_id uuid PRIMARY KEY, name text NOT NULL)`,
		backlog: rounds("n", 6, 3, "Noted", map[[2]int]faultEvent{
			{0, 0}: named("cat", ""),
			{1, 4}: named("", kind),
		}),
		live: [][]faultEvent{rounds("n", 6, 20, "Noted", map[[2]int]faultEvent{
			{3, 1}:  named("ann", ""),
			{8, 1}:  named("", kind),
			{9, 1}:  named("bob", ""),
			{14, 5}: named("", kind),
		})},
		isolated: true,
		check: func(t *testing.T, e *faultEnv) {
			sameRows(t, e.pool, "notnull_names", `SELECT event_id::text, name FROM notnull_names`,
				`SELECT id::text, data->>'name' FROM events WHERE type = 'Named' AND metadata->>'expect' IS NULL`)
		},
	})
}

// TestFaultNumericOverflow: points accumulate per stream in a smallint
// column. A value that cannot fit on its own, and one that makes the
// stream's sum overflow, both dead-letter as
// commit:22003 (numeric_value_out_of_range).
func TestFaultNumericOverflow(t *testing.T) {
	t.Parallel()
	const kind = "commit:22003 (numeric_value_out_of_range)"
	score := func(points int64, expect string) faultEvent {
		return faultEvent{typ: "Scored", data: map[string]any{"v": 2, "points": points}, expect: expect}
	}
	runPoison(t, poisonCase{
		proj: faultProjection{name: "overflow", types: []string{"Scored", "Noted"}, extra: []rule{
			{name: "score", on: "Scored", op: "upsert", table: "overflow_scores", key: `stream_id = "stream_id"`, inc: `points = "data.points"`}}},
		ddl: `CREATE TABLE overflow_scores (stream_id text PRIMARY KEY, points smallint NOT NULL)`,
		backlog: rounds("o", 6, 2, "Noted", map[[2]int]faultEvent{
			{0, 1}: score(3, ""),
			{1, 2}: score(20000, ""),
		}),
		live: [][]faultEvent{rounds("o", 6, 20, "Noted", map[[2]int]faultEvent{
			{2, 1}:  score(7, ""),
			{6, 1}:  score(40000, kind), // does not fit a smallint
			{7, 1}:  score(5, ""),
			{10, 2}: score(15000, kind), // 20000 + 15000 > 32767
			{11, 2}: score(100, ""),
		})},
		isolated: true,
		check: func(t *testing.T, e *faultEnv) {
			sameRows(t, e.pool, "overflow_scores", `SELECT stream_id, points::bigint FROM overflow_scores`,
				`SELECT stream_id, sum((data->>'points')::bigint)::bigint FROM events
WHERE type = 'Scored' AND metadata->>'expect' IS NULL GROUP BY stream_id`)
		},
	})
}

// TestFaultRuleError: a missing field (nil value) and a matching fail rule
// dead-letter their event as rule:<rule>, with a readable message and the
// event's data and metadata in the dead-letter row; none of the event's
// intents apply (its trail entry, written by an earlier rule, is absent).
func TestFaultRuleError(t *testing.T) {
	t.Parallel()
	missing := faultEvent{typ: "Noted", data: map[string]any{"note": "no v"}, expect: "rule:row"}
	blocked := faultEvent{typ: "Registered", data: map[string]any{"v": 3, "email": "eve@blocked.example"}, expect: "rule:blocked"}
	e, _ := runPoison(t, poisonCase{
		proj: faultProjection{name: "rules", types: []string{"Registered", "Noted"}, extra: []rule{{name: "blocked", on: "Registered", when: "data.email endsWith '@blocked.example'", op: "fail",
			message: "'blocked address: ' + data.email"}}},
		backlog: rounds("r", 5, 3, "Noted", map[[2]int]faultEvent{{1, 0}: missing}),
		live: [][]faultEvent{rounds("r", 5, 12, "Noted", map[[2]int]faultEvent{
			{2, 3}: blocked,
			{4, 3}: missing,
			{5, 1}: {typ: "Ignored", data: map[string]any{}}, // no rule: skipped
			{6, 3}: {typ: "Registered", data: map[string]any{"v": 4, "email": "ok@example.com"}},
		})},
	})
	rows, err := e.pool.Query(context.Background(), `SELECT error_kind, error_message, event_data::text, event_metadata->>'expect'
FROM pgscribe.dead_letters WHERE projection = 'rules'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind, msg, data, expect string
		if err := rows.Scan(&kind, &msg, &data, &expect); err != nil {
			t.Fatal(err)
		}
		// The rule is in error_kind; the message says what went wrong: the
		// fail rule's own message, or the field and its cause.
		switch kind {
		case "rule:row":
			if !strings.HasPrefix(msg, "set.v: ") || !strings.Contains(msg, "missing field") {
				t.Errorf("rule:row dead letter message %q does not name set.v and a missing field", msg)
			}
		case "rule:blocked":
			if msg != "blocked address: eve@blocked.example" {
				t.Errorf("rule:blocked dead letter message = %q, want the fail rule's message", msg)
			}
		}
		if expect != kind {
			t.Errorf("dead letter %s carries metadata.expect %q", kind, expect)
		}
		if kind == "rule:blocked" && !strings.Contains(data, "eve@blocked.example") {
			t.Errorf("rule:blocked dead letter data = %s", data)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
}

// TestFaultCircuit: a CHECK constraint that every new event violates is a
// schema mismatch, not poison. The projection halts (circuit) instead of
// draining the stream into dead letters — log with the SQLSTATE,
// pgscribe_halted 1, /healthz 503 — and acknowledges nothing of the failing
// events. Dropping the constraint and restarting gives the exact result.
func TestFaultCircuit(t *testing.T) {
	t.Parallel()
	proj := faultProjection{name: "circuit", types: []string{"Tick"}}
	e, p := startFault(t, 5, "", rounds("c", 10, 4, "Tick", nil), proj)
	before := e.accounted(t, proj.name)

	e.exec(t, `ALTER TABLE circuit_rows ADD CONSTRAINT circuit_rows_v_negative CHECK (v < 0) NOT VALID`)
	// Far more than the circuit threshold (20) per partition, in one
	// transaction.
	e.appendEvents(t, rounds("c", 10, 30, "Tick", nil)...)
	p.waitHalted(proj.name, "23514") // check_violation
	if got := p.metric("pgscribe_batches_total", projLabels(proj.name, "result", "halted")); got < 1 {
		t.Errorf("pgscribe_batches_total{result=halted} = %v, want ≥ 1", got)
	}
	e.checkNoDeadLetters(t, proj.name)
	if got := e.accounted(t, proj.name); got != before {
		t.Errorf("after the halt %d events are accounted for, want the %d from before the constraint", got, before)
	}
	p.stop()

	e.exec(t, `ALTER TABLE circuit_rows DROP CONSTRAINT circuit_rows_v_negative`)
	p = e.start(t)
	e.verifyClean(t, p, proj)
	p.stop()
}

// TestFaultRenamedColumn: renaming a read-model column under a running
// engine halts that projection (structural, 42703) — loudly, acknowledging
// nothing of its failing events — while a second projection on other
// tables keeps applying new events. Renaming back and restarting gives both
// projections the exact result.
func TestFaultRenamedColumn(t *testing.T) {
	t.Parallel()
	alpha := faultProjection{name: "alpha", types: []string{"A"}}
	beta := faultProjection{name: "beta", types: []string{"B"}}
	mixed := func(n int) []faultEvent {
		return append(rounds("a", 3, n, "A", nil), rounds("b", 3, n, "B", nil)...)
	}
	e, p := startFault(t, 5, "", mixed(4), alpha, beta)

	e.exec(t, `ALTER TABLE alpha_rows RENAME COLUMN v TO v_renamed`)
	e.appendEvents(t, mixed(5)...)
	rec := p.waitHalted("alpha", "42703") // undefined_column
	if !strings.Contains(logString(rec, "table")+" "+logString(rec, "err"), "alpha_rows") {
		t.Errorf("halt log does not name the table alpha_rows: %v", rec)
	}
	if got := logString(rec, "table"); got == "" {
		t.Errorf("halt log has no table attribute (only the error text names it): %v", rec)
	}
	for s := 0; s < 3; s++ {
		if got := e.cursor(t, "alpha", fmt.Sprintf("a-%d", s)); got != 4 {
			t.Errorf("alpha's cursor of a-%d = %d after the halt, want 4 (nothing after the rename acknowledged)", s, got)
		}
	}

	// The other projection keeps running: new events reach it.
	e.appendEvents(t, rounds("b", 3, 6, "B", nil)...)
	e.verifyClean(t, p, beta)
	p.stop()

	e.exec(t, `ALTER TABLE alpha_rows RENAME COLUMN v_renamed TO v`)
	p = e.start(t)
	e.verifyClean(t, p, alpha, beta)
	p.stop()
}

// TestFaultTerminatedBackends: the engine's batch connections are killed
// with pg_terminate_backend again and again under load. Batches retry
// (transient), nothing is lost or applied twice, the process never exits
// and the projection never halts.
func TestFaultTerminatedBackends(t *testing.T) {
	tickFaultTest(t, "kill", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 0, "", rounds("k", 10, 30, "Tick", nil), proj)
		// Kill under live load. During the backfill a killed connection ends
		// the whole session (its watermark and phase writes are not retried):
		// it restarts after a backoff instead of retrying a batch.
		p.waitLog(waitLong, "the live state", func(r map[string]any) bool {
			return r["msg"] == "state" && r["state"] == "live" && r["projection"] == proj.name
		})

		w := startWriter(e.dsn, 8, 5, 15*time.Millisecond)
		killed := 0
		start := time.Now()
		for time.Since(start) < 4*time.Second || w.transactions() < 40 {
			if time.Since(start) > time.Minute {
				t.Fatalf("the writer committed only %d transactions in a minute", w.transactions())
			}
			n, err := e.terminateBackends(context.Background(), `application_name = 'pgscribe' AND backend_type = 'client backend'`)
			if err != nil {
				t.Fatalf("terminate backends: %v", err)
			}
			killed += n
			time.Sleep(70 * time.Millisecond)
		}
		w.stop(t)
		t.Logf("terminated %d engine backends while %d transactions were written", killed, w.transactions())
		if killed == 0 {
			t.Fatal("no engine backend was terminated")
		}

		e.verifyClean(t, p, proj)
		retried := p.metric("pgscribe_batches_total", projLabels(proj.name, "result", "retried"))
		restarts := p.metric("pgscribe_restarts_total", projLabels(proj.name))
		t.Logf("batches retried: %v, pipeline restarts: %v", retried, restarts)
		if retried < 1 {
			t.Errorf("pgscribe_batches_total{result=retried} = %v: no batch went through a transient retry", retried)
		}
		p.stop()
	})
}

// TestFaultDroppedSlot: the projection's slot is dropped, first while the
// engine is stopped, then under the running engine. Each time the engine
// logs that it resyncs, creates the slot again, re-reads the table and lets
// the cursors skip what was applied: exact result, no dead letter (a double
// apply would be a unique violation on the rows' event id).
func TestFaultDroppedSlot(t *testing.T) {
	tickFaultTest(t, "slot", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 5, "", rounds("s", 8, 10, "Tick", nil), proj)
		p.stop()
		slot := e.slot(proj.name)
		slotExists := func() bool {
			return e.scalar(t, `SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1`, slot) == 1
		}
		// The session that finds the slot gone says so at its plan; one
		// whose stream starts just before the drop resyncs as for an
		// undecodable slot when START_REPLICATION fails.
		resync := func(r map[string]any) bool {
			return logMsg("slot is missing: resyncing", proj.name)(r) || logMsg("resyncing from a new snapshot as for a lost slot", proj.name)(r)
		}
		mark := 0 // where verify looks for the members' joins (mode feedMember)
		verify := func(p *node) {
			t.Helper()
			e.verifyClean(t, p, proj)
			// A group's slot comes back once its members caught up on
			// their own slots and join.
			e.joined(t, p, mark, proj)
			if !slotExists() {
				t.Errorf("slot %s was not created again", slot)
			}
		}

		// Dropped while the engine is stopped; events arrive meanwhile.
		e.dropSlot(t, slot)
		e.appendEvents(t, rounds("s", 8, 5, "Tick", nil)...)
		p = e.start(t)
		p.waitLog(waitLong, "the resync", resync)
		if rec := p.waitLog(waitLong, "the backfill", logMsg("backfill started", proj.name)); logString(rec, "events") != fmt.Sprint(e.events(t)) {
			t.Errorf("the resync re-read %s events, want the whole table (%d): %v", logString(rec, "events"), e.events(t), rec)
		}
		verify(p)

		// Dropped under the running engine, with events before and after.
		mark = p.mark()
		e.appendEvents(t, rounds("s", 8, 5, "Tick", nil)...)
		e.dropSlot(t, slot)
		e.appendEvents(t, rounds("s", 8, 5, "Tick", nil)...)
		waitFor(t, waitLong, "a second resync", func() bool { return p.countLog(resync) >= 2 })
		e.appendEvents(t, rounds("s", 8, 3, "Tick", nil)...)
		verify(p)
		p.stop()
	})
}

// TestFaultHaltOnError: with on_error = "halt" the first event that would
// be dead-lettered halts the projection instead: no dead-letter row, state
// halted, nothing after it in its partition acknowledged. Changing the rule
// so that it no longer fails and restarting resumes with the exact result.
func TestFaultHaltOnError(t *testing.T) {
	t.Parallel()
	inEveryFeed(t, true, func(t *testing.T) {
		const streams, parallelism = 6, 2 // parallelism as in writeConfig
		reject := func(when string) faultProjection {
			return faultProjection{name: "halting", onError: "halt", types: []string{"Tick"}, extra: []rule{
				{name: "reject", on: "Tick", when: when, op: "fail", message: "'negative v: ' + string(data.v)"}}}
		}
		proj := reject("data.v < 0")
		e, p := startFault(t, 5, "", rounds("h", streams, 5, "Tick", nil), proj)

		const poisonRound, poisonStream = 4, 2
		tx := rounds("h", streams, 10, "Tick", map[[2]int]faultEvent{{poisonRound, poisonStream}: ev("", "Tick", -1)})
		positions := e.appendEvents(t, tx...)
		rec := p.waitHalted(proj.name, "")
		if reason := logString(rec, "reason"); !strings.Contains(reason, "on_error = halt") || !strings.Contains(reason, "rule:reject") {
			t.Errorf("halt reason %q does not name on_error = halt and rule:reject", reason)
		}
		e.checkNoDeadLetters(t, proj.name)

		// In the poison's partition nothing at or after it (in commit order,
		// here the order of the transaction) is acknowledged.
		poison := poisonRound*streams + poisonStream
		part := apply.Partition(tx[poison].stream, parallelism)
		lastBefore := map[string]int64{}
		for i, x := range tx {
			if apply.Partition(x.stream, parallelism) != part {
				continue
			}
			if _, ok := lastBefore[x.stream]; !ok {
				lastBefore[x.stream] = positions[i] - 1
			}
			if i < poison {
				lastBefore[x.stream] = positions[i]
			}
		}
		for stream, limit := range lastBefore {
			if got := e.cursor(t, proj.name, stream); got > limit {
				t.Errorf("cursor of %s (poison's partition) = %d after the halt, want ≤ %d", stream, got, limit)
			}
		}
		p.stop()

		// Fix the data path: the rule no longer fails.
		e.writeConfig(t, 5, reject("data.v < -1000000"))
		p = e.start(t)
		e.verifyClean(t, p, proj)
		p.stop()
	})
}

// TestFaultServerRestart: PostgreSQL restarts (fast shutdown) under load.
// The engine retries and reconnects, keeps going once the server is back,
// and ends with the exact result; it never exits or halts. Not parallel:
// the restart breaks every connection to the shared server.
func TestFaultServerRestart(t *testing.T) {
	requireServer(t)
	inEveryFeed(t, false, func(t *testing.T) {
		if !srv().CanRestart() {
			t.Skipf("%s server cannot be restarted", srv().Mode())
		}
		proj := faultProjection{name: "restart", types: []string{"Tick"}}
		e, p := startFault(t, 5, "", rounds("r", 6, 10, "Tick", nil), proj)

		w := startWriter(e.dsn, 6, 5, 15*time.Millisecond)
		waitFor(t, waitLong, "load before the restart", func() bool { return w.transactions() >= 20 })
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := srv().Restart(ctx, false); err != nil {
			t.Fatalf("restart: %v", err)
		}
		e.pool.Reset() // the test's own connections did not survive either
		after := w.transactions()
		waitFor(t, waitLong, "load after the restart", func() bool { return w.transactions() >= after+20 })
		w.stop(t)

		e.verifyClean(t, p, proj)
		t.Logf("batches retried: %v, pipeline restarts: %v, lock re-acquired %d times",
			p.metric("pgscribe_batches_total", projLabels(proj.name, "result", "retried")),
			p.metric("pgscribe_restarts_total", projLabels(proj.name)),
			p.countLog(logMsg("acquired lock", proj.name))-1)
		p.stop()
	})
}
