package integration

// Poison at batch speed: a batch with k events that fail an integrity check
// at commit is split, not replayed event by event, so isolation costs
// O(k·log n) segment attempts; the result stays exact, the circuit still
// halts on a schema mismatch, and a live poison event holds its partition
// back only briefly.

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// poisonNames is a projection that also inserts each Named event's name into
// a column of <name>_names of type column: a name longer than 8 characters
// is poison (varchar(8) or a CHECK of the length).
func poisonNames(name, column string) (faultProjection, string) {
	return faultProjection{name: name, types: []string{"Named"}, extra: []rule{
		{name: "name", on: "Named", op: "insert", table: name + "_names", set: `event_id = "id", name = "data.name"`}}}, fmt.Sprintf(`CREATE TABLE %s_names (event_id uuid PRIMARY KEY, name %s NOT NULL)`, name, column)
}

// named is a Named event carrying v and a name; a long name is poison
// that dead-letters as kind.
func named(v int64, kind string) faultEvent {
	x := faultEvent{typ: "Named", data: map[string]any{"v": v, "name": fmt.Sprintf("n%d", v)}}
	if kind != "" {
		x.data["name"] = strings.Repeat("x", 9) + fmt.Sprint(v)
		x.expect = kind
	}
	return x
}

// namedRange is the Named events v = from … to-1, round-robin over streams
// <prefix>-0 …; those for which bad says so are poison of that kind.
func namedRange(prefix string, streams, from, to int, kind string, bad func(int) bool) []faultEvent {
	out := make([]faultEvent, 0, to-from)
	for i := from; i < to; i++ {
		k := ""
		if bad != nil && bad(i) {
			k = kind
		}
		x := named(int64(i), k)
		x.stream = fmt.Sprintf("%s-%d", prefix, i%streams)
		out = append(out, x)
	}
	return out
}

const (
	checkKind   = "commit:23514 (check_violation)"
	varcharKind = "commit:22001 (string_data_right_truncation)"
)

// TestPoisonBisection: k = 6 poison events (a CHECK on the name's length,
// which only PostgreSQL knows) among n = 2,400 in the backfill (batches of
// 400) and 2 more live. Everything else applies exactly once, in
// stream order; the poison is dead-lettered with its kind; and finding it
// took a bounded number of segment attempts — far fewer than the n
// savepoints of an event-by-event replay.
func TestPoisonBisection(t *testing.T) {
	t.Parallel()
	proj, ddl := poisonNames("bisect", "text CHECK (length(name) <= 8)")
	const streams, n = 24, 2400
	bad := map[int]bool{17: true, 18: true, 700: true, 1203: true, 1999: true, 2398: true}
	backlog := namedRange("b", streams, 0, n, checkKind, func(i int) bool { return bad[i] })
	live := namedRange("b", streams, n, n+48, checkKind, func(i int) bool { return i == n+5 || i == n+30 })
	k := len(bad) + 2
	e, p := startFault(t, 5, ddl, backlog, proj)
	e.appendEvents(t, live...)
	waitAccounted(t, e.pool, waitLong, proj.name, 1, p.broken)
	proj.check(t, e)
	sameRows(t, e.pool, "bisect_names", `SELECT event_id::text, name FROM bisect_names`,
		`SELECT id::text, data->>'name' FROM events WHERE type = 'Named' AND metadata->>'expect' IS NULL`)
	if got := e.scalar(t, `SELECT count(*) FROM bisect_names`); got != int64(n+48-k) {
		t.Errorf("bisect_names has %d rows, want %d", got, n+48-k)
	}
	e.checkAccounting(t, proj.name)
	if got := p.metric("pgscribe_events_total", projLabels(proj.name, "outcome", "dead_lettered")); got != float64(k) {
		t.Errorf("pgscribe_events_total{outcome=dead_lettered} = %v, want %d", got, k)
	}
	// Each poison event costs at most two attempts per halving of its
	// batch (≤ 400 events: 9 halvings) plus the whole try of its batch;
	// an event-by-event replay would cost ≥ 400 per backfill batch.
	attempts := p.metric("pgscribe_isolation_attempts_total", projLabels(proj.name))
	if limit := float64(k * (2*9 + 2)); attempts < float64(k) || attempts > limit {
		t.Errorf("pgscribe_isolation_attempts_total = %v, want between %d and %v", attempts, k, limit)
	}
	t.Logf("%d poison events among %d: %v isolation attempts", k, n+48, attempts)
	if v := p.metric("pgscribe_halted", projLabels(proj.name)); v != 0 {
		t.Errorf("pgscribe_halted = %v, want 0: poison must not halt", v)
	}
	p.stop()
}

// TestPoisonCircuitVarchar: shrinking the column so that every new name
// fails 22001 is a schema mismatch: the projection halts instead of
// dead-lettering, and acknowledges none of the failing events, although
// isolation now splits batches instead of replaying them.
func TestPoisonCircuitVarchar(t *testing.T) {
	t.Parallel()
	proj, ddl := poisonNames("shrink", "varchar(8)")
	e, p := startFault(t, 5, ddl, namedRange("s", 4, 0, 40, "", nil), proj)
	before := e.accounted(t, proj.name)

	// Emptied first: the existing names do not fit either.
	e.exec(t, `TRUNCATE shrink_names; ALTER TABLE shrink_names ALTER COLUMN name TYPE varchar(1)`)
	e.appendEvents(t, namedRange("s", 4, 40, 240, "", nil)...)
	p.waitHalted(proj.name, "22001")
	e.checkNoDeadLetters(t, proj.name)
	if got := e.accounted(t, proj.name); got != before {
		t.Errorf("after the halt %d events are accounted for, want the %d from before the change", got, before)
	}
	p.stop()
}

// TestPoisonLiveLatency: live, one poison event among good ones of the
// same partition does not hold the good ones back: a good event appended
// right after a poison event is applied well within the time the engine
// would wait for more events (1 s) before dead-lettering a lone failure.
func TestPoisonLiveLatency(t *testing.T) {
	t.Parallel()
	proj, ddl := poisonNames("latency", "text CHECK (length(name) <= 8)")
	e, p := startFault(t, 5, ddl, namedRange("l", 2, 0, 20, "", nil), proj)
	var worst time.Duration
	for r := 0; r < 5; r++ {
		bad := named(int64(100+2*r), checkKind)
		bad.stream = "l-0"
		e.appendEvents(t, bad)
		good := named(int64(101+2*r), "")
		good.stream = "l-0"
		start := time.Now()
		e.appendEvents(t, good)
		waitAccounted(t, e.pool, waitLong, proj.name, 1, p.broken)
		worst = max(worst, time.Since(start))
	}
	t.Logf("worst time from a good event after a poison one to both accounted for: %v", worst)
	if worst > 900*time.Millisecond {
		t.Errorf("a good event after a poison one took %v to apply, want well under the 1 s wait", worst)
	}
	proj.check(t, e)
	e.checkAccounting(t, proj.name)
	p.stop()
}

// TestPoisonPrecheck: names too long for a varchar(8) column are found from
// the catalog before the commit: they dead-letter as
// commit:22001 (string_data_right_truncation) without any failed
// transaction or isolation, and the rest applies exactly. Widening the
// column then lets the same names apply: the cached length is read again.
func TestPoisonPrecheck(t *testing.T) {
	t.Parallel()
	proj, ddl := poisonNames("pre", "varchar(8)")
	backlog := namedRange("p", 8, 0, 800, varcharKind, func(i int) bool { return i%97 == 5 })
	e, p := startFault(t, 5, ddl, backlog, proj)
	e.appendEvents(t, namedRange("p", 8, 800, 840, varcharKind, func(i int) bool { return i == 811 })...)
	waitAccounted(t, e.pool, waitLong, proj.name, 1, p.broken)
	proj.check(t, e)
	e.checkAccounting(t, proj.name)
	for _, m := range []string{"pgscribe_isolation_attempts_total"} {
		if got := p.metric(m, projLabels(proj.name)); got != 0 {
			t.Errorf("%s = %v, want 0: the catalog tells these failures", m, got)
		}
	}
	if got := p.metric("pgscribe_batches_total", projLabels(proj.name, "result", "isolated")); got != 0 {
		t.Errorf("pgscribe_batches_total{result=isolated} = %v, want 0", got)
	}

	e.exec(t, `ALTER TABLE pre_names ALTER COLUMN name TYPE varchar(40)`)
	long := named(900, "")
	long.stream, long.data["name"] = "p-0", strings.Repeat("y", 20)
	e.appendEvents(t, long)
	waitAccounted(t, e.pool, waitLong, proj.name, 1, p.broken)
	if got := e.scalar(t, `SELECT count(*) FROM pre_names WHERE name = $1`, strings.Repeat("y", 20)); got != 1 {
		t.Errorf("a 20-character name after widening to varchar(40): %d rows, want 1", got)
	}
	e.checkAccounting(t, proj.name)
	p.stop()
}
