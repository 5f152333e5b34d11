package integration

// Tests of the operator controls (issue 14): pause and resume across a
// failover, pause during a backfill, resume after a halt without a restart,
// dead-letter retry after the cause is fixed, discard. They use the fault
// tests' helpers (faults_helpers_test.go: faultProjection and check,
// newFaultEnv, startFault, start, appendEvents, startWriter, checkAccounting,
// scalar, exec, waitHalted) and the harness's node, waitFor, waitAccounted
// and sameRows.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// operate runs a pgscribe command on the environment's configuration and
// returns its stdout; it fails t unless the exit code is code.
func (e *faultEnv) operate(t *testing.T, code int, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	args = append(args, "-config", e.config)
	cmd := exec.CommandContext(ctx, pgscribeBinary(t), args...)
	cmd.Env = append(os.Environ(), "PGSCRIBE_DATABASE_URL="+e.dsn)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	got := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		got = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("pgscribe %v: %v", args, err)
	}
	if got != code {
		t.Fatalf("pgscribe %v: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, got, code, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// opStatus is the part of `pgscribe status -json` these tests read.
type opStatus struct {
	Projection string `json:"projection"`
	State      string `json:"state"`
	Paused     *struct {
		Reason string `json:"reason"`
	} `json:"paused"`
	WALRetained *int64   `json:"wal_retained_bytes"`
	Notes       []string `json:"notes"`
}

func (e *faultEnv) opStatus(t *testing.T, projection string) opStatus {
	t.Helper()
	var rep struct {
		Projections []opStatus `json:"projections"`
	}
	if err := json.Unmarshal([]byte(e.operate(t, 0, "status", "-json")), &rep); err != nil {
		t.Fatalf("status -json: %v", err)
	}
	for _, p := range rep.Projections {
		if p.Projection == projection {
			return p
		}
	}
	t.Fatalf("status has no projection %s", projection)
	return opStatus{}
}

// waitMetric waits until the process reports the metric of projection at
// want.
func waitMetric(t *testing.T, p *node, name, projection string, want float64, timeout time.Duration) {
	t.Helper()
	waitFor(t, timeout, fmt.Sprintf("%s{projection=%q} = %v", name, projection, want), func() bool {
		return p.metric(name, projLabels(projection)) == want
	})
}

// holdsStill checks that the projection accounts for exactly n events for
// the whole of d while the writer (if any) keeps appending: nothing is
// applied.
func (e *faultEnv) holdsStill(t *testing.T, projection string, n int64, d time.Duration, w *faultWriter) {
	t.Helper()
	before := 0
	if w != nil {
		before = w.transactions()
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if got := e.accounted(t, projection); got != n {
			t.Fatalf("paused, yet %s went from %d to %d accounted events", projection, n, got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if w != nil && w.transactions() == before {
		t.Fatalf("the writer appended nothing meanwhile: the pause proved nothing")
	}
}

// TestOperatorPauseFailover: a pause under load stops the active node
// within a second, holds after a kill -9 of that node (the standby that
// takes over stays paused), and a resume ends with the exact read model.
func TestOperatorPauseFailover(t *testing.T) {
	tickFaultTest(t, "pz", func(t *testing.T, proj faultProjection) {
		backlog := make([]faultEvent, 0, 60)
		for i := range 60 {
			backlog = append(backlog, ev("b-"+string(rune('a'+i%6)), "Tick", int64(i)))
		}
		e, a := startFault(t, 10, "", backlog, proj)
		b := e.start(t)
		waitMetric(t, a, "pgscribe_active", "pz", 1, waitLong)
		w := startWriter(e.dsn, 8, 4, 5*time.Millisecond)
		defer func() {
			select {
			case <-w.stopc:
			default:
				w.stop(t)
			}
		}()
		base := e.accounted(t, "pz")
		waitFor(t, waitLong, "the writer's events applied", func() bool { return e.accounted(t, "pz") > base+200 })

		asked := time.Now()
		out := e.operate(t, 0, "pause", "-projection", "pz", "-version", "1", "-reason", "maintenance")
		if !strings.Contains(out, "paused pz v1") {
			t.Errorf("pause said %q", out)
		}
		waitMetric(t, a, "pgscribe_paused", "pz", 1, 10*time.Second)
		t.Logf("paused %.2fs after the command", time.Since(asked).Seconds())
		if v := a.metric("pgscribe_halted", projLabels("pz")); v != 0 {
			t.Errorf("pgscribe_halted = %v while paused, want 0", v)
		}
		if code, _ := a.get("/healthz"); code != http.StatusOK {
			t.Errorf("/healthz = %d while paused, want 200", code)
		}
		if code, _ := a.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz = %d while paused, want 503", code)
		}
		held := e.accounted(t, "pz")
		e.holdsStill(t, "pz", held, 1500*time.Millisecond, w)
		st := e.opStatus(t, "pz")
		if st.State != "paused" || st.Paused == nil || st.Paused.Reason != "maintenance" || st.WALRetained == nil {
			t.Errorf("status while paused = %+v, want state paused, reason maintenance, WAL retained shown", st)
		}
		if got := scalar[string](t, e.pool, `SELECT state FROM pgscribe.progress WHERE projection = 'pz' AND version = 1`); got != "paused" {
			t.Errorf("pgscribe.progress state = %q while paused, want paused", got)
		}

		// kill -9 the paused active node: the standby takes the lock, and stays
		// paused.
		a.kill()
		waitMetric(t, b, "pgscribe_paused", "pz", 1, waitLong)
		if v := b.metric("pgscribe_active", projLabels("pz")); v != 1 {
			t.Errorf("standby pgscribe_active = %v after the takeover, want 1", v)
		}
		e.holdsStill(t, "pz", held, 1500*time.Millisecond, w)
		if st := e.opStatus(t, "pz"); st.State != "paused" {
			t.Errorf("status after the takeover: state %s, want paused", st.State)
		}

		w.stop(t)
		out = e.operate(t, 0, "resume", "-projection", "pz", "-version", "1")
		if !strings.Contains(out, "resumed pz v1") {
			t.Errorf("resume said %q", out)
		}
		waitAccounted(t, e.pool, waitLong, "pz", 1, b.broken)
		waitMetric(t, b, "pgscribe_paused", "pz", 0, 10*time.Second)
		if got := scalar[string](t, e.pool, `SELECT state FROM pgscribe.progress WHERE projection = 'pz' AND version = 1`); got != "live" {
			t.Errorf("pgscribe.progress state = %q after the resume, want live", got)
		}
		proj.check(t, e)
		e.checkAccounting(t, "pz")
		e.checkNoDeadLetters(t, "pz")
	})
}

// TestOperatorPauseBackfill: a pause during a backfill holds the workers
// (the snapshot stays open) and the resume finishes it exactly.
func TestOperatorPauseBackfill(t *testing.T) {
	tickFaultTest(t, "pb", func(t *testing.T, proj faultProjection) {
		e := newFaultEnv(t, 10, proj)
		for round := range 6 {
			evs := make([]faultEvent, 0, 2000)
			for i := range 2000 {
				evs = append(evs, ev("s-"+string(rune('a'+i%20)), "Tick", int64(round*2000+i)))
			}
			e.appendEvents(t, evs...)
		}
		// Paused before it starts: the node takes the lock and waits.
		e.operate(t, 0, "pause", "-projection", "pb", "-version", "1")
		p := e.start(t)
		waitMetric(t, p, "pgscribe_paused", "pb", 1, waitLong)
		if n := e.accounted(t, "pb"); n != 0 {
			t.Fatalf("paused from the start, yet %d events accounted for", n)
		}
		e.operate(t, 0, "resume", "-projection", "pb", "-version", "1")
		waitFor(t, waitLong, "the backfill under way", func() bool { return e.accounted(t, "pb") > 2000 })
		e.operate(t, 0, "pause", "-projection", "pb", "-version", "1")
		waitMetric(t, p, "pgscribe_paused", "pb", 1, 10*time.Second)
		held := e.accounted(t, "pb")
		if held == e.events(t) {
			t.Skip("the backfill finished before the pause: nothing to test on this machine")
		}
		e.holdsStill(t, "pb", held, 1500*time.Millisecond, nil)
		if st := e.opStatus(t, "pb"); st.State != "paused" {
			t.Errorf("status: state %s during a paused backfill, want paused", st.State)
		}
		e.operate(t, 0, "resume", "-projection", "pb", "-version", "1")
		waitAccounted(t, e.pool, waitLong, "pb", 1, p.broken)
		if p.findLog(logMsg("backfill started", "pb")) == nil || p.countLog(logMsg("backfill started", "pb")) != 1 {
			t.Errorf("the backfill started %d times, want once (a pause keeps its snapshot)", p.countLog(logMsg("backfill started", "pb")))
		}
		proj.check(t, e)
		e.checkAccounting(t, "pb")
	})
}

// TestOperatorResumeAfterHalt: a renamed read-model column halts the
// projection; after the column is renamed back, `pgscribe resume` makes the
// same process retry at once, and the read model ends exact.
func TestOperatorResumeAfterHalt(t *testing.T) {
	tickFaultTest(t, "hz", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 10, "", []faultEvent{ev("a", "Tick", 1), ev("b", "Tick", 2)}, proj)
		e.exec(t, `ALTER TABLE hz_rows RENAME COLUMN v TO v_gone`)
		e.appendEvents(t, ev("a", "Tick", 3), ev("c", "Tick", 4))
		p.waitHalted("hz", "42703")
		if st := e.opStatus(t, "hz"); st.State != "halted" {
			t.Fatalf("status: state %s, want halted", st.State)
		}
		e.appendEvents(t, ev("c", "Tick", 5))
		e.exec(t, `ALTER TABLE hz_rows RENAME COLUMN v_gone TO v`)
		out := e.operate(t, 0, "resume", "-projection", "hz", "-version", "1")
		if !strings.Contains(out, "retries the halted work") {
			t.Errorf("resume said %q", out)
		}
		waitAccounted(t, e.pool, waitLong, "hz", 1, p.broken)
		if p.exited() {
			t.Fatalf("pgscribe exited: %v", p.err())
		}
		p.waitLog(10*time.Second, "the resume", logMsg("resume requested by an operator", "hz"))
		waitMetric(t, p, "pgscribe_halted", "hz", 0, 10*time.Second)
		proj.check(t, e)
		e.checkAccounting(t, "hz")
		e.checkNoDeadLetters(t, "hz")
	})
}

// TestOperatorRetryAfterWidening: names too long for a varchar(5) column
// dead-letter as 22001; a retry before the fix fails again (new reason), a
// discard drops one, and after ALTER … TYPE varchar(200) a retry applies
// the rest: the read model equals the one computed from the events with
// those events in (the discarded one out), conservation holds.
func TestOperatorRetryAfterWidening(t *testing.T) {
	t.Parallel()
	const kind = "commit:22001 (string_data_right_truncation)"
	proj := faultProjection{name: "rz", types: []string{"Tick", "Named"}, extra: []rule{
		{name: "name", on: "Named", op: "insert", table: "rz_names", set: `event_id = "id", name = "data.name"`},
	}}
	named := func(stream, name, expect string) faultEvent {
		return faultEvent{stream: stream, typ: "Named", data: map[string]any{"v": 9, "name": name}, expect: expect}
	}
	// Each poison event is the last of its stream, so that its late apply
	// keeps the stream's trail in order.
	var backlog []faultEvent
	for i := range 40 {
		backlog = append(backlog, ev("t-"+string(rune('a'+i%5)), "Tick", int64(i)))
	}
	backlog = append(backlog,
		ev("p1", "Tick", 1), named("p1", "ann", ""), named("p1", "bartholomew", kind),
		ev("p2", "Tick", 2), named("p2", "maximiliane", kind),
		named("p3", "christopher", kind),
		ev("p4", "Tick", 3), named("p4", "alexandria", kind))
	e, p := startFault(t, 10, `CREATE TABLE rz_names (event_id uuid PRIMARY KEY, name varchar(5) NOT NULL)`, backlog, proj)
	e.checkAccounting(t, "rz")
	id := func(stream string) string {
		return strconv.FormatInt(e.scalar(t, `SELECT id FROM pgscribe.dead_letters WHERE stream_id = $1`, stream), 10)
	}

	// Before the fix: a retry fails again and keeps the row, with its reason.
	out := e.operate(t, 0, "deadletters", "retry", "-projection", "rz", "-version", "1", "-id", id("p3"))
	if !strings.Contains(out, "0 applied, 1 failed again") {
		t.Errorf("retry before the fix said %q", out)
	}
	// Discard p4's: without -yes nothing happens (exit 2).
	e.operate(t, 2, "deadletters", "discard", "-id", id("p4"))
	out = e.operate(t, 0, "deadletters", "discard", "-id", id("p4"), "-yes")
	if !strings.Contains(out, "discarded 1 dead letter(s) of rz v1") {
		t.Errorf("discard said %q", out)
	}

	e.exec(t, `ALTER TABLE rz_names ALTER COLUMN name TYPE varchar(200)`)
	out = e.operate(t, 0, "deadletters", "retry", "-projection", "rz", "-version", "1", "-dry-run")
	if n := strings.Count(out, "would write"); n != 3 {
		t.Errorf("dry run: %d events would write, want 3:\n%s", n, out)
	}
	if n := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters`); n != 3 {
		t.Fatalf("the dry run changed the dead letters: %d left, want 3", n)
	}
	e.appendEvents(t, ev("t-a", "Tick", 100), ev("t-b", "Tick", 101))
	out = e.operate(t, 0, "deadletters", "retry")
	if !strings.Contains(out, "3 dead letter(s) retried") || !strings.Contains(out, "3 applied, 0 failed again") {
		t.Errorf("retry said %q", out)
	}
	waitAccounted(t, e.pool, waitLong, "rz", 1, p.broken)

	// The expectation: every event except the discarded one.
	keep := `metadata->>'expect' IS NULL OR stream_id <> 'p4'`
	sameRows(t, e.pool, "rz_rows", `SELECT event_id::text, stream_id, stream_position, v FROM rz_rows`,
		`SELECT id::text, stream_id, stream_position, (data->>'v')::bigint FROM events WHERE `+keep)
	sameRows(t, e.pool, "rz_trail", `SELECT stream_id, positions FROM rz_trail`,
		`SELECT stream_id, array_agg(stream_position ORDER BY stream_position) FROM events WHERE `+keep+` GROUP BY stream_id`)
	sameRows(t, e.pool, "rz_names", `SELECT event_id::text, name FROM rz_names`,
		`SELECT id::text, data->>'name' FROM events WHERE type = 'Named' AND (`+keep+`)`)
	if got, want := e.accounted(t, "rz"), e.events(t); got != want {
		t.Errorf("conservation: %d events, %d accounted", want, got)
	}
	if n := e.scalar(t, `SELECT coalesce(sum(dead_lettered), 0)::bigint + (SELECT count(*) FROM pgscribe.dead_letters) FROM pgscribe.cursors`); n != 0 {
		t.Errorf("dead letters left (counts + rows) = %d, want 0", n)
	}
	if got := e.scalar(t, `SELECT sum(skipped)::bigint FROM pgscribe.cursors WHERE projection = 'rz'`); got != 1 {
		t.Errorf("skipped = %d, want 1 (the discarded event)", got)
	}
}

// conserved is the projection's accounting with held events: applied +
// skipped + dead_lettered + parked, and parked alone.
func (e *faultEnv) conserved(t *testing.T, projection string) (all, parked int64) {
	t.Helper()
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(sum(applied + skipped + dead_lettered + parked), 0)::bigint,
  coalesce(sum(parked), 0)::bigint FROM pgscribe.cursors WHERE projection = $1 AND version = 1`, projection).Scan(&all, &parked); err != nil {
		t.Fatal(err)
	}
	return all, parked
}

func (e *faultEnv) waitConserved(t *testing.T, p *node, projection string) {
	t.Helper()
	waitFor(t, waitLong, projection+" accounting for every event", func() bool {
		if p.exited() {
			t.Fatalf("pgscribe exited: %v", p.err())
		}
		all, _ := e.conserved(t, projection)
		return all == e.events(t)
	})
}

// TestOperatorParkRetryInOrder: on_error = "park". A name too long for its
// column dead-letters an event and parks its stream: the stream's later
// events are held (in order, counted as parked) while the other streams go
// on under load, through a kill -9 of the engine. After the column is
// widened, a retry applies each parked stream in its original order (a
// `set` rule and an appended trail show any other order); a skip releases
// another stream without its bad event. The read model ends equal to the
// one computed from the events.
func TestOperatorParkRetryInOrder(t *testing.T) {
	t.Parallel()
	const kind = "commit:22001 (string_data_right_truncation)"
	proj := faultProjection{name: "pk", onError: "park", types: []string{"Tick", "Named"}, extra: []rule{
		{name: "last", on: "Tick,Named", op: "upsert", table: "pk_last", key: `stream_id = "stream_id"`, set: `v = "data.v"`},
		{name: "name", on: "Named", op: "upsert", table: "pk_names", key: `stream_id = "stream_id"`, set: `name = "data.name"`},
	}}
	named := func(stream, name string, v int64, expect string) faultEvent {
		return faultEvent{stream: stream, typ: "Named", data: map[string]any{"v": v, "name": name}, expect: expect}
	}
	ddl := `CREATE TABLE pk_last (stream_id text PRIMARY KEY, v bigint NOT NULL);
CREATE TABLE pk_names (stream_id text PRIMARY KEY, name varchar(5) NOT NULL)`
	backlog := []faultEvent{ev("pk-1", "Tick", 1), named("pk-1", "ann", 2, ""), ev("pk-2", "Tick", 3), ev("pk-3", "Tick", 4)}
	e, p := startFault(t, 10, ddl, backlog, proj)
	w := startWriter(e.dsn, 6, 4, 5*time.Millisecond)
	stopped := false
	defer func() {
		if !stopped {
			w.stop(t)
		}
	}()
	// The poison, then events behind it, in three streams.
	e.appendEvents(t, named("pk-1", "bartholomew", 5, kind), named("pk-2", "maximiliane", 6, kind), named("pk-3", "christopher", 7, kind))
	for i := range 5 {
		e.appendEvents(t, ev("pk-1", "Tick", int64(10+i)), named("pk-2", "bo", int64(20+i), ""), ev("pk-3", "Tick", int64(30+i)))
		if i == 2 {
			// Held behind pk-2's dead letter, and too long even for the
			// widened column: its release fails and parks pk-2 again.
			e.appendEvents(t, named("pk-2", strings.Repeat("x", 300), 99, kind))
		}
	}
	e.waitConserved(t, p, "pk")
	if _, parked := e.conserved(t, "pk"); parked != 16 {
		t.Fatalf("parked = %d, want 16 (5 events behind each of 3 dead letters, one more behind pk-2's)", parked)
	}
	// kill -9 in the middle of the load, with more events for the parked
	// streams arriving meanwhile.
	p.kill()
	for i := range 5 {
		e.appendEvents(t, ev("pk-1", "Tick", int64(40+i)), ev("pk-2", "Tick", int64(50+i)), ev("pk-3", "Tick", int64(60+i)))
	}
	p = e.start(t)
	e.waitConserved(t, p, "pk")
	if _, parked := e.conserved(t, "pk"); parked != 31 {
		t.Fatalf("parked = %d after the restart, want 31", parked)
	}
	// Held means not applied: the parked streams' trails stop before their
	// dead letters.
	sameRows(t, e.pool, "parked trails", `SELECT stream_id, positions FROM pk_trail WHERE stream_id LIKE 'pk-%'`,
		`SELECT stream_id, array_agg(stream_position ORDER BY stream_position) FROM events
WHERE stream_id LIKE 'pk-%' AND stream_position < (SELECT min(stream_position) FROM events x WHERE x.stream_id = events.stream_id AND x.metadata ? 'expect')
GROUP BY stream_id`)
	st := e.opStatus(t, "pk")
	if !strings.Contains(strings.Join(st.Notes, "\n"), "3 stream(s) parked") {
		t.Errorf("status notes %q do not tell of the 3 parked streams", st.Notes)
	}

	// Skip pk-3's bad event; retry the others once the column is wide
	// enough.
	out := e.operate(t, 0, "deadletters", "skip", "-projection", "pk", "-version", "1", "-stream", "pk-3")
	if !strings.Contains(out, "1 dead letter(s) skipped") {
		t.Errorf("skip said %q", out)
	}
	e.exec(t, `ALTER TABLE pk_names ALTER COLUMN name TYPE varchar(200)`)
	out = e.operate(t, 0, "deadletters", "retry", "-projection", "pk", "-version", "1")
	if !strings.Contains(out, "2 applied, 0 failed again") {
		t.Errorf("retry said %q", out)
	}
	// pk-2 released up to its over-long name, which is now its dead letter
	// and holds the rest of the stream (7 events behind it: 2, then 5 after the kill).
	if n := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters WHERE stream_id = 'pk-2' AND (event_data->>'v')::bigint = 99`); n != 1 {
		t.Errorf("pk-2's over-long name: %d dead letters, want 1", n)
	}
	waitFor(t, waitLong, "pk-1 released", func() bool {
		return e.scalar(t, `SELECT parked FROM pgscribe.cursors WHERE stream_id = 'pk-1'`) == 0
	})
	if got := e.scalar(t, `SELECT parked FROM pgscribe.cursors WHERE stream_id = 'pk-2'`); got != 7 {
		t.Errorf("pk-2 holds %d events after its release failed, want 7", got)
	}
	out = e.operate(t, 0, "deadletters", "skip", "-projection", "pk", "-version", "1", "-stream", "pk-2")
	if !strings.Contains(out, "1 dead letter(s) skipped") {
		t.Errorf("second skip said %q", out)
	}
	w.stop(t)
	stopped = true
	e.appendEvents(t, ev("pk-1", "Tick", 70), ev("pk-2", "Tick", 71), ev("pk-3", "Tick", 72))
	e.waitConserved(t, p, "pk")

	keep := `NOT (metadata ? 'expect' AND (stream_id = 'pk-3' OR (data->>'v')::bigint = 99))`
	sameRows(t, e.pool, "pk_rows", `SELECT event_id::text, stream_id, stream_position, v FROM pk_rows`,
		`SELECT id::text, stream_id, stream_position, (data->>'v')::bigint FROM events WHERE `+keep)
	sameRows(t, e.pool, "pk_trail (stream order)", `SELECT stream_id, positions FROM pk_trail`,
		`SELECT stream_id, array_agg(stream_position ORDER BY stream_position) FROM events WHERE `+keep+` GROUP BY stream_id`)
	sameRows(t, e.pool, "pk_last (set: the last event wins)", `SELECT stream_id, v FROM pk_last`,
		`SELECT DISTINCT ON (stream_id) stream_id, (data->>'v')::bigint FROM events WHERE `+keep+` ORDER BY stream_id, stream_position DESC`)
	sameRows(t, e.pool, "pk_names", `SELECT stream_id, name FROM pk_names`,
		`SELECT DISTINCT ON (stream_id) stream_id, data->>'name' FROM events WHERE type = 'Named' AND `+keep+` ORDER BY stream_id, stream_position DESC`)
	all, parked := e.conserved(t, "pk")
	if all != e.events(t) || parked != 0 {
		t.Errorf("conservation: %d events, %d accounted, %d still parked", e.events(t), all, parked)
	}
	if n := e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters`) + e.scalar(t, `SELECT count(*) FROM pgscribe.parked_events`) +
		e.scalar(t, `SELECT count(*) FROM pgscribe.cursors WHERE parked_since IS NOT NULL`); n != 0 {
		t.Errorf("dead letters, held events and parked streams left: %d, want none", n)
	}
	if got := e.scalar(t, `SELECT coalesce(sum(skipped), 0)::bigint FROM pgscribe.cursors WHERE projection = 'pk'`); got != 2 {
		t.Errorf("skipped = %d, want 2 (the skipped dead letters)", got)
	}
}

// TestOldestEngineTransactionVisible: a read model locked by someone else
// makes the engine's batch wait inside its transaction. That transaction's
// age shows in pgscribe_oldest_transaction_seconds and in `pgscribe status`
// (a long one holds vacuum back in the whole cluster); once the lock goes,
// both fall back and the read model ends exact.
func TestOldestEngineTransactionVisible(t *testing.T) {
	tickFaultTest(t, "oldest", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 5, "", rounds("o", 4, 10, "Tick", nil), proj)
		oldest := func() float64 { return p.metric("pgscribe_oldest_transaction_seconds", nil) }
		if v := oldest(); v < 0 || v > 2 {
			t.Errorf("idle: pgscribe_oldest_transaction_seconds = %v, want between 0 and 2", v)
		}
		hold := e.holdRows(t, proj)
		e.appendEvents(t, rounds("o", 4, 5, "Tick", nil)...)
		waitFor(t, waitLong, "the waiting batch's transaction in the metric", func() bool { return oldest() >= 3 })
		var rep struct {
			Oldest float64 `json:"oldest_engine_transaction_seconds"`
		}
		if err := json.Unmarshal([]byte(e.operate(t, 0, "status", "-json")), &rep); err != nil {
			t.Fatalf("status -json: %v", err)
		}
		if rep.Oldest < 3 {
			t.Errorf("status: oldest_engine_transaction_seconds = %v, want at least 3 (a batch waits on a lock)", rep.Oldest)
		}
		if out := e.operate(t, 0, "status"); !strings.Contains(out, "oldest engine transaction open ") {
			t.Errorf("status lacks the oldest engine transaction:\n%s", out)
		}
		if err := hold.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		waitFor(t, waitLong, "the metric to fall back", func() bool { v := oldest(); return v >= 0 && v < 2 })
		e.verifyClean(t, p, proj)
		p.stop()
	})
}

// TestCampaignSeed2032RetryOfAMiss: an update under if_missing = "dead_letter"
// that matches no row dead-letters its event as missing:<rule>. A retry
// while the row is still missing fails again and keeps that kind and a
// message naming the row (it was recorded as "commit:" with no SQLSTATE,
// which verify reported as drift: campaign seed 2032); once the row
// exists, a retry applies it. Under on_error = "park" too, where the
// stream's later event is held until then.
func TestCampaignSeed2032RetryOfAMiss(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"dead_letter", "park"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			name := "rm" + mode[:1]
			proj := faultProjection{name: name, types: []string{"Tick", "Seen"}, extra: []rule{
				{name: "touch", on: "Seen", op: "update", table: name + "_seen", key: `k = "stream_id"`, set: `n = "data.v"`, ifMissing: "dead_letter"},
			}}
			if mode == "park" {
				proj.onError = "park"
			}
			var backlog []faultEvent
			for i := range 20 {
				backlog = append(backlog, ev("t-"+string(rune('a'+i%4)), "Tick", int64(i)))
			}
			backlog = append(backlog, ev("m1", "Tick", 1),
				faultEvent{stream: "m1", typ: "Seen", data: map[string]any{"v": 7}, expect: "missing:touch"})
			e, p := startFault(t, 10, fmt.Sprintf(`CREATE TABLE %s_seen (k text PRIMARY KEY, n bigint NOT NULL)`, name), backlog, proj)
			if mode == "park" {
				e.appendEvents(t, ev("m1", "Tick", 2)) // held behind the dead letter
				e.waitConserved(t, p, name)
				if n := e.scalar(t, `SELECT coalesce(sum(parked), 0)::bigint FROM pgscribe.cursors WHERE projection = $1`, name); n != 1 {
					t.Fatalf("%d events held, want 1 (m1's Tick behind its dead letter)", n)
				}
			}
			kindAndMessage := func() (kind, msg string) {
				if err := e.pool.QueryRow(context.Background(), `SELECT error_kind, error_message FROM pgscribe.dead_letters WHERE projection = $1`, name).Scan(&kind, &msg); err != nil {
					t.Fatal(err)
				}
				return kind, msg
			}
			if kind, _ := kindAndMessage(); kind != "missing:touch" {
				t.Fatalf("dead letter kind %q, want missing:touch", kind)
			}
			out := e.operate(t, 0, "deadletters", "retry", "-projection", name, "-version", "1")
			if !strings.Contains(out, "0 applied, 1 failed again") {
				t.Errorf("retry with the row still missing said %q", out)
			}
			if kind, msg := kindAndMessage(); kind != "missing:touch" || !strings.Contains(msg, "matched no row of "+name+"_seen where k = m1") {
				t.Errorf("after a retry that failed again: kind %q, message %q; want missing:touch and the row it missed", kind, msg)
			}
			e.exec(t, fmt.Sprintf(`INSERT INTO %s_seen VALUES ('m1', 0)`, name))
			out = e.operate(t, 0, "deadletters", "retry", "-projection", name, "-version", "1")
			if !strings.Contains(out, "1 applied, 0 failed again") {
				t.Errorf("retry with the row there said %q", out)
			}
			waitFor(t, waitLong, "the retried event applied", func() bool {
				return e.scalar(t, fmt.Sprintf(`SELECT n FROM %s_seen WHERE k = 'm1'`, name)) == 7 &&
					e.scalar(t, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1`, name) == 0 &&
					e.scalar(t, `SELECT coalesce(sum(parked), 0)::bigint FROM pgscribe.cursors WHERE projection = $1`, name) == 0
			})
			if got, want := e.accounted(t, name), e.events(t); got != want {
				t.Errorf("conservation: %d events, %d accounted", want, got)
			}
			sameRows(t, e.pool, name+"_rows", fmt.Sprintf(`SELECT event_id::text, stream_id, stream_position, v FROM %s_rows`, name),
				`SELECT id::text, stream_id, stream_position, (data->>'v')::bigint FROM events`)
		})
	}
}
