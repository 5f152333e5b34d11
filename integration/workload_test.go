package integration

// Workload helpers of the core and crash tests: a test deployment of
// pgscribe (rig), the projections it runs with their independent oracles, an
// appender of events with expected-version semantics, and the pgscribe
// process run as a child.
//
// The expected side of every oracle (read model, per-stream accounting,
// dead letters) is computed in SQL from the events table alone, never from
// what pgscribe reports, and compared row by row (EXCEPT both ways) with
// what pgscribe wrote.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The event types of the workload. Only projections with a rule for every
// type apply NoteAdded; the demo projections skip it.
const (
	typeOpened    = "AccountOpened"
	typeDeposited = "Deposited"
	typeWithdrawn = "Withdrawn"
	typeClosed    = "AccountClosed"
	typeNote      = "NoteAdded"
)

// coreProjection is one projection the rig configures, with its read-model
// DDL and its oracle. The SQL of expected, actual and outcome is independent of
// pgscribe: it reads the events table only.
type coreProjection struct {
	name    string
	version int
	rules   []rule
	ddl     string // read-model tables, idempotent
	// expected and actual return the same columns: the read model computed
	// from the events table, and the read model pgscribe wrote.
	expected, actual string
	// outcome is an SQL expression over a row of events: 'applied',
	// 'skipped' or 'dead', what the projection must do with that event.
	outcome string
}

// balancesDead says which balances events a rule must dead-letter: an
// opening whose initial balance is not a non-negative number
// (negative_opening, or an evaluation error of open), a movement whose
// amount is not a positive number (non_positive_amount, or an evaluation
// error of move).
const balancesDead = `(
	(type = 'AccountOpened' AND NOT coalesce(jsonb_typeof(data->'initial') = 'number' AND (data->>'initial')::numeric >= 0, false))
	OR (type IN ('Deposited', 'Withdrawn') AND NOT coalesce(jsonb_typeof(data->'amount') = 'number' AND (data->>'amount')::numeric > 0, false)))`

// balancesProjection is the demo's balances projection (config.toml.example):
// one row per account. Its oracle depends on per-stream order: a movement
// applied before its account's opening updates nothing, an opening applied
// late resets the balance, and updated_at must come from the stream's last
// event.
func balancesProjection() coreProjection {
	return coreProjection{
		name:    "balances",
		version: 1,
		rules: []rule{
			{name: "open", on: "AccountOpened", when: "data.initial >= 0", op: "upsert", table: "balances", key: accountKey,
				set: `owner = "data.owner", balance = "data.initial", closed = "false", updated_at = "occurred_at"`},
			{name: "negative_opening", on: "AccountOpened", when: "data.initial < 0", op: "fail",
				message: "'negative initial balance: ' + string(data.initial)"},
			{name: "move", on: "Deposited,Withdrawn", op: "update", table: "balances", key: accountKey,
				inc: balanceMove, set: `updated_at = "occurred_at"`},
			{name: "non_positive_amount", on: "Deposited,Withdrawn", when: "data.amount <= 0", op: "fail",
				message: "'non-positive amount in ' + type + ': ' + string(data.amount)"},
			{name: "close", on: "AccountClosed", op: "update", table: "balances", key: accountKey,
				set: `closed = "true", updated_at = "occurred_at"`},
		},
		// The workload opens each account once, at stream position 1, with
		// account_id = stream_id.
		expected: `SELECT data->>'account_id' AS account_id,
	max(data->>'owner') FILTER (WHERE type = 'AccountOpened') AS owner,
	sum(CASE type WHEN 'AccountOpened' THEN (data->>'initial')::bigint
		WHEN 'Deposited' THEN (data->>'amount')::bigint
		WHEN 'Withdrawn' THEN -(data->>'amount')::bigint
		ELSE 0 END)::bigint AS balance,
	bool_or(type = 'AccountClosed') AS closed,
	(array_agg(occurred_at ORDER BY stream_position DESC))[1] AS updated_at
FROM events
WHERE type IN ('AccountOpened', 'Deposited', 'Withdrawn', 'AccountClosed') AND NOT ` + balancesDead + `
GROUP BY 1
HAVING bool_or(type = 'AccountOpened')`,
		actual: `SELECT account_id, owner, balance, closed, updated_at FROM balances`,
		outcome: `CASE WHEN ` + balancesDead + ` THEN 'dead'
	WHEN type IN ('AccountOpened', 'Deposited', 'Withdrawn', 'AccountClosed') THEN 'applied'
	ELSE 'skipped' END`,
	}
}

// activityProjection is the demo's activity projection: one inserted row per
// account event. An event applied twice is a primary key violation, which
// pgscribe dead-letters: the oracle's "no dead letters" catches it.
func activityProjection() coreProjection {
	return coreProjection{
		name:    "activity",
		version: 1,
		rules: []rule{{name: "record", on: "AccountOpened,Deposited,Withdrawn,AccountClosed", op: "insert", table: "account_activity",
			set: `event_id = "id", account_id = "data.account_id", type = "type", amount = "data?.amount ?? data?.initial ?? 0", occurred_at = "occurred_at"`}},
		expected: `SELECT id AS event_id, data->>'account_id' AS account_id, type,
	coalesce((data->>'amount')::bigint, (data->>'initial')::bigint, 0) AS amount, occurred_at
FROM events WHERE type IN ('AccountOpened', 'Deposited', 'Withdrawn', 'AccountClosed')`,
		actual:  `SELECT event_id, account_id, type, amount, occurred_at FROM account_activity`,
		outcome: `CASE WHEN type IN ('AccountOpened', 'Deposited', 'Withdrawn', 'AccountClosed') THEN 'applied' ELSE 'skipped' END`,
	}
}

// streamStatsProjection is a custom projection with a rule for every event
// type: an upsert that counts a stream's events, sums their amounts and
// records the last event, so per-stream order and exactly-once both show in
// its rows.
func streamStatsProjection() coreProjection {
	return coreProjection{
		name:    "stream_stats",
		version: 2,
		rules: []rule{{name: "count", op: "upsert", table: "stream_stats", key: `stream_id = "stream_id"`,
			set: `last_type = "type", last_stream_position = "stream_position", last_position = "position"`,
			inc: `events = "1", total = "data?.amount ?? 0"`}},
		ddl: `CREATE TABLE IF NOT EXISTS stream_stats (
	stream_id            text   PRIMARY KEY,
	events               bigint NOT NULL,
	total                bigint NOT NULL,
	last_type            text   NOT NULL,
	last_stream_position bigint NOT NULL,
	last_position        bigint NOT NULL
)`,
		expected: `SELECT stream_id, count(*)::bigint AS events, coalesce(sum((data->>'amount')::bigint), 0)::bigint AS total,
	(array_agg(type ORDER BY stream_position DESC))[1] AS last_type,
	max(stream_position) AS last_stream_position,
	(array_agg(position ORDER BY stream_position DESC))[1] AS last_position
FROM events GROUP BY stream_id`,
		actual:  `SELECT stream_id, events, total, last_type, last_stream_position, last_position FROM stream_stats`,
		outcome: `'applied'`,
	}
}

func (p coreProjection) toml() string {
	return projectionTOML(p.name, p.version, "dead_letter", p.rules...)
}

// rig is one test's deployment of pgscribe: a fresh database with the events
// table, the engine schema and the publication (`pgscribe migrate`), the
// read-model tables, a config file, and the pgscribe processes started on it.
type rig struct {
	t      *testing.T
	dsn    string
	pool   *pgxpool.Pool // the test's own connections
	dir    string
	config string // path of the config file
	prefix string // slot_prefix, unique on the cluster
	engine map[string]string
	projs  []coreProjection

	mu    sync.Mutex
	procs []*node
}

var rigSeq atomic.Int64

// rigEngineDefaults are the [engine] settings of every rig: small batches
// (more commits, more crash points), fast status updates, lag ticks and
// standby polls so that tests wait less.
var rigEngineDefaults = map[string]string{
	"parallelism":         "4",
	"batch_size":          "200",
	"batch_timeout":       `"20ms"`,
	"backfill_batch_size": "1000",
	"standby_poll":        `"1s"`,
	"lag_interval":        `"1s"`,
	"status_interval":     `"1s"`,
	"shutdown_timeout":    `"30s"`,
}

// newRig migrates a fresh database (events table included) with the
// pgscribe binary, creates the read models of projs and writes a config
// that runs them. engine overrides [engine] settings (TOML values).
func newRig(t *testing.T, projs []coreProjection, engine map[string]string) *rig {
	t.Helper()
	dsn := newDatabase(t)
	r := &rig{
		t:      t,
		dsn:    dsn,
		dir:    t.TempDir(),
		prefix: fmt.Sprintf("core%d_%d", os.Getpid(), rigSeq.Add(1)),
		engine: maps.Clone(rigEngineDefaults),
		projs:  projs,
	}
	maps.Copy(r.engine, engine)
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 16
	r.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.pool.Close)
	r.writeConfig()
	migrate(t, r.config)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema, err := os.ReadFile("../examples/demo/schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	r.exec(ctx, string(schema))
	for _, p := range projs {
		if p.ddl != "" {
			r.exec(ctx, p.ddl)
		}
	}
	return r
}

// setProjections rewrites the config with projs; processes started from
// now on run them.
func (r *rig) setProjections(projs ...coreProjection) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range projs {
		if p.ddl != "" {
			r.exec(ctx, p.ddl)
		}
	}
	r.projs = projs
	r.writeConfig()
}

func (r *rig) writeConfig() {
	r.t.Helper()
	// Text logs: the tests wait for lines such as
	// msg="backfill started" projection=balances.
	c := newConfig(r.dsn, r.prefix).with("engine", r.engine).with("retry", map[string]string{
		"max_attempts": "5", "backoff": `"100ms"`, "max_backoff": `"2s"`,
	}).set("metrics", "listen", `"off"`).set("log", "format", `"text"`).set("log", "level", `"info"`)
	for _, p := range r.projs {
		toml := p.toml()
		if feedOf(r.t) == feedAlone {
			// Each projection alone in a group of its own, on its own
			// slot (the rig's projections share the default group
			// otherwise: mode feedMember).
			head := fmt.Sprintf("\nversion = %d\n", p.version)
			toml = strings.Replace(toml, head, head+fmt.Sprintf("group = %q\n", p.name), 1)
		}
		c.add(toml)
	}
	r.config = c.write(r.t, filepath.Join(r.dir, "pgscribe.toml"))
}

func (r *rig) exec(ctx context.Context, sql string, args ...any) {
	r.t.Helper()
	if _, err := r.pool.Exec(ctx, sql, args...); err != nil {
		r.t.Fatalf("%s: %v", sqlHead(sql), err)
	}
}

func (r *rig) queryInt(_ context.Context, sql string, args ...any) int64 {
	r.t.Helper()
	return scalar[int64](r.t, r.pool, sql, args...)
}

// slot returns the replication slot name of p.
func (r *rig) slot(p coreProjection) string { return slotName(r.prefix, p.name, p.version) }

// seed inserts streams × perStream events in one transaction, before
// pgscribe first starts: the backfill's material. Stream i is acct-<i>.
func (r *rig) seed(streams, perStream int) {
	r.t.Helper()
	r.bulk("acct-", streams, perStream)
}

// bulk inserts streams × perStream events in one transaction into new
// streams <prefix><i>: each stream's first event opens the account, the
// others are deposits, withdrawals and notes, interleaved across streams in
// position order.
func (r *rig) bulk(prefix string, streams, perStream int) {
	r.t.Helper()
	r.bulkPadded(prefix, streams, perStream, 0)
}

// bulkPadded is bulk with events of about pad bytes of JSON more (a
// "pad" field no rule reads), every seventh five times as big.
func (r *rig) bulkPadded(prefix string, streams, perStream, pad int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r.exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
SELECT $3 || s, sp,
	CASE WHEN sp = 1 THEN 'AccountOpened' WHEN h < 45 THEN 'Deposited' WHEN h < 85 THEN 'Withdrawn' ELSE 'NoteAdded' END,
	CASE WHEN sp = 1 THEN jsonb_build_object('account_id', $3 || s, 'owner', 'owner ' || s, 'initial', (s * 7919) % 1000)
		WHEN h < 85 THEN jsonb_build_object('account_id', $3 || s, 'amount', 1 + (s * 31 + sp * 17) % 100)
		ELSE jsonb_build_object('account_id', $3 || s, 'note', 'note ' || sp) END
	|| CASE WHEN $4::int > 0 THEN jsonb_build_object('pad', repeat(md5(s::text), $4::int / 32 * (1 + 4 * ((s + sp) % 7 = 0)::int))) ELSE '{}' END
FROM generate_series(1, $2::int) AS sp
CROSS JOIN generate_series(0, $1::int - 1) AS s
CROSS JOIN LATERAL (SELECT abs(hashint4(s * 100003 + sp)) % 100 AS h) AS x
ORDER BY sp, s`, streams, perStream, prefix, pad)
	// The dedup contract: within a stream, positions grow with
	// stream_position. A bulk insert that broke it would test nothing.
	if bad := r.queryInt(ctx, `SELECT count(*) FROM (
		SELECT position < lag(position) OVER (PARTITION BY stream_id ORDER BY stream_position) AS bad
		FROM events WHERE stream_id LIKE $1 || '%') s
		WHERE bad`, prefix); bad != 0 {
		r.t.Fatalf("bulk insert: %d events whose position is below their stream predecessor's", bad)
	}
}

// eventCount is the number of rows in the events table.
func (r *rig) eventCount(ctx context.Context) int64 {
	r.t.Helper()
	return r.queryInt(ctx, "SELECT count(*) FROM events")
}

// accounted is how many events p's cursors account for (applied + skipped
// + dead_lettered).
func (r *rig) accounted(ctx context.Context, p coreProjection) (int64, error) {
	return accounted(ctx, r.pool, p.name, p.version)
}

// waitApplied reads how many events p accounts for and waits until it
// accounts for more than that plus ahead; it returns the first count.
func (r *rig) waitApplied(ctx context.Context, p coreProjection, timeout time.Duration, ahead int64, what string) int64 {
	r.t.Helper()
	before, err := r.accounted(ctx, p)
	if err != nil {
		r.t.Fatal(err)
	}
	r.waitUntil(timeout, what, func(ctx context.Context) (bool, error) {
		n, err := r.accounted(ctx, p)
		return n > before+ahead, err
	})
	return before
}

// phase is p's watermark phase ("" before the first backfill starts).
func (r *rig) phase(ctx context.Context, p coreProjection) (string, error) {
	var phase string
	err := r.pool.QueryRow(ctx, `SELECT phase FROM pgscribe.watermarks WHERE projection = $1 AND version = $2`,
		p.name, p.version).Scan(&phase)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	return phase, err
}

// waitUntil is the harness's waitUntil that also fails as soon as a
// pgscribe process of the rig exits unasked or halts a projection.
func (r *rig) waitUntil(timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) {
	r.t.Helper()
	waitUntil(r.t, timeout, what, cond, r.brokenProcess)
}

// poll is waitUntil that reports a timeout instead of failing on it.
func (r *rig) poll(timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) bool {
	r.t.Helper()
	return poll(r.t, timeout, what, cond, r.brokenProcess)
}

// waitCaughtUp waits until every projection accounts for every event in
// the table: conservation by the counts. Writers must be stopped. A
// projection that accounts for more events than the table holds fails at
// once; on failure the differences per stream are shown.
func (r *rig) waitCaughtUp(timeout time.Duration) {
	r.t.Helper()
	var last string
	over := false
	ok := r.poll(timeout, "pgscribe to catch up", func(ctx context.Context) (bool, error) {
		var events int64
		if err := r.pool.QueryRow(ctx, "SELECT count(*) FROM events").Scan(&events); err != nil {
			return false, err
		}
		var parts []string
		done := true
		for _, p := range r.projs {
			n, err := r.accounted(ctx, p)
			if err != nil {
				return false, err
			}
			parts = append(parts, fmt.Sprintf("%s=%d", p.name, n))
			done = done && n == events
			over = over || n > events
		}
		last = fmt.Sprintf("events=%d %s", events, strings.Join(parts, " "))
		return done || over, nil
	})
	switch {
	case over:
		r.t.Errorf("more events accounted for than the table holds: %s", last)
	case !ok:
		r.t.Errorf("not caught up after %s: %s", timeout, last)
	default:
		r.t.Logf("caught up: %s", last)
		return
	}
	r.verify()
	r.t.FailNow()
}

// verify checks every projection of the rig exactly, against oracles
// computed from the events table:
//
//   - conservation: count(events) equals the sum of applied, skipped and
//     dead_lettered over the projection's cursors;
//   - per stream, the cursor sits on the stream's last event (stream
//     position and global position) and its applied, skipped and
//     dead_lettered counts are exactly what the rules say of the stream's
//     events;
//   - dead_letters holds exactly one row per event that must be
//     dead-lettered, and sum(dead_lettered) equals its row count;
//   - the read model equals the one computed from the events table.
func (r *rig) verify() {
	r.t.Helper()
	for _, p := range r.projs {
		verifyProjection(r.t, r.pool, p)
	}
}

// verifyCLI runs `pgscribe verify` on every projection of the rig: an
// oracle of its own, besides verify's SQL expectations.
func (r *rig) verifyCLI() {
	r.t.Helper()
	for _, p := range r.projs {
		requireNoDrift(r.t, pgscribeBinary(r.t), r.config, p.name, int64(p.version))
	}
}

// verifyProjection checks p exactly against its oracles (see rig.verify),
// through q, which sees the events table and pgscribe's schema.
func verifyProjection(t *testing.T, q querier, p coreProjection) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	events := scalar[int64](t, q, "SELECT count(*) FROM events")
	n, err := accounted(ctx, q, p.name, p.version)
	if err != nil {
		t.Fatal(err)
	}
	if n != events {
		t.Errorf("%s: conservation: %d events, cursors account for %d", p.name, events, n)
	}
	sameRows(t, q, p.name+": per-stream cursors and outcomes",
		`SELECT stream_id, stream_position, position, applied, skipped, dead_lettered
		FROM pgscribe.cursors WHERE projection = $1 AND version = $2`,
		`SELECT stream_id, max(stream_position) AS stream_position, max(position) AS position,
			count(*) FILTER (WHERE o = 'applied') AS applied,
			count(*) FILTER (WHERE o = 'skipped') AS skipped,
			count(*) FILTER (WHERE o = 'dead') AS dead_lettered
		FROM (SELECT stream_id, stream_position, position, `+p.outcome+` AS o FROM events) e
		GROUP BY stream_id`,
		p.name, p.version)
	sameRows(t, q, p.name+": dead letters",
		`SELECT event_id, position, stream_id, stream_position, event_type FROM pgscribe.dead_letters
		WHERE projection = $1 AND version = $2`,
		`SELECT id::text, position, stream_id, stream_position, type FROM events WHERE `+p.outcome+` = 'dead'`,
		p.name, p.version)
	var rows, counted int64
	err = q.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1 AND version = $2),
		(SELECT coalesce(sum(dead_lettered), 0)::bigint FROM pgscribe.cursors WHERE projection = $1 AND version = $2)`,
		p.name, p.version).Scan(&rows, &counted)
	if err != nil {
		t.Fatal(err)
	}
	if rows != counted {
		t.Errorf("%s: %d dead_letters rows, cursors count %d dead-lettered events", p.name, rows, counted)
	}
	sameRows(t, q, p.name+": read model", p.actual, p.expected)
	t.Logf("%s v%d exact: %d events accounted, %d dead letters", p.name, p.version, n, rows)
}

// outOfOrderCommits counts events committed before an event of lower
// position committed: what concurrent writers do and what pgscribe must
// cope with. Commit timestamps come from track_commit_timestamp.
func (r *rig) outOfOrderCommits(ctx context.Context) int64 {
	r.t.Helper()
	return r.queryInt(ctx, `SELECT count(*) FROM (
		SELECT pg_xact_commit_timestamp(xmin) AS committed,
			max(pg_xact_commit_timestamp(xmin)) OVER (ORDER BY position ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS lower_committed
		FROM events) e
	WHERE committed < lower_committed`)
}

// slotState returns the confirmed_flush_lsn of the slot p streams from
// (its group's when its watermark is there, else its own) and whether it
// exists.
func (r *rig) slotState(ctx context.Context, p coreProjection) (confirmed pglogrepl.LSN, exists bool, err error) {
	slot := r.slot(p)
	var on *string
	err = r.pool.QueryRow(ctx, `SELECT (SELECT slot_name FROM pgscribe.watermarks WHERE projection = $1 AND version = $2)`,
		p.name, p.version).Scan(&on)
	if err != nil {
		return 0, false, err
	}
	if on != nil && *on == r.prefix+"_group_default" {
		slot = *on
	}
	return r.slotConfirmed(ctx, slot)
}

// slotConfirmed returns the confirmed_flush_lsn of slot and whether it
// exists.
func (r *rig) slotConfirmed(ctx context.Context, slot string) (confirmed pglogrepl.LSN, exists bool, err error) {
	var s *string
	err = r.pool.QueryRow(ctx, `SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1`,
		slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil || s == nil {
		return 0, err == nil, err
	}
	confirmed, err = pglogrepl.ParseLSN(*s)
	return confirmed, true, err
}

// cursorPositions returns p's per-stream cursors: stream_id → the stream
// position accounted for.
func (r *rig) cursorPositions(ctx context.Context, p coreProjection) (map[string]int64, error) {
	rows, err := r.pool.Query(ctx, `SELECT stream_id, stream_position FROM pgscribe.cursors WHERE projection = $1 AND version = $2`,
		p.name, p.version)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	var id string
	var pos int64
	_, err = pgx.ForEachRow(rows, []any{&id, &pos}, func() error {
		out[id] = pos
		return nil
	})
	return out, err
}

// confirmedAhead checks guarantee 7 for p: every appended transaction that
// committed at or below the slot's confirmed_flush_lsn is accounted for by
// p's cursors. It reads the slot first and the cursors after, and a
// transaction counts as "at or below" only when an LSN read after its
// commit (an upper bound of its commit record's end) is, so it never
// reports a false violation, even while pgscribe runs. It returns how many
// transactions the check covered, and the violations it found.
func (r *rig) confirmedAhead(ctx context.Context, p coreProjection, a *appender) (covered int, violations []string, err error) {
	confirmed, exists, err := r.slotState(ctx, p)
	if err != nil || !exists {
		return 0, nil, err
	}
	phase, err := r.phase(ctx, p)
	if err != nil {
		return 0, nil, err
	}
	if phase != "live" {
		// While backfilling, the slot sits at its creation point, set by
		// the server; a restart rebuilds from a new snapshot.
		return 0, nil, nil
	}
	cursors, err := r.cursorPositions(ctx, p)
	if err != nil {
		return 0, nil, err
	}
	covered, violations = unappliedBelow(a.committedTxns(), cursors, confirmed)
	return covered, violations, nil
}

// unappliedBelow is guarantee 7's oracle: of the appended transactions
// known to have committed at or below confirmed (an LSN read after the
// commit is), how many there are, and each of their events the cursors
// (stream → stream_position) do not account for.
func unappliedBelow(txns []appendedTxn, cursors map[string]int64, confirmed pglogrepl.LSN) (covered int, violations []string) {
	for _, tx := range txns {
		if tx.upper > confirmed {
			continue
		}
		covered++
		for _, e := range tx.events {
			if cursors[e.stream] < e.position {
				violations = append(violations, fmt.Sprintf("%s/%d (committed by %s, slot confirmed at %s, cursor at %d)",
					e.stream, e.position, tx.upper, confirmed, cursors[e.stream]))
			}
		}
	}
	return covered, violations
}

// checkNotAhead runs confirmedAhead for every projection of the rig,
// failing t on a violation, and returns how many transactions it covered.
func (r *rig) checkNotAhead(what string, a *appender) (covered int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, p := range r.projs {
		n, violations, err := r.confirmedAhead(ctx, p, a)
		if err != nil {
			r.t.Fatal(err)
		}
		if len(violations) > 0 {
			r.t.Fatalf("%s: %s slot confirmed past %d unapplied events, first: %s", what, p.name, len(violations), violations[0])
		}
		covered += n
	}
	return covered
}

// waitStreaming waits until every projection of the rig is live: phase
// live in its watermark, and s logged the state (a restarted process
// resumes from the slot without changing the stored phase).
func (r *rig) waitStreaming(s *node, timeout time.Duration) {
	r.t.Helper()
	r.waitUntil(timeout, "every projection to stream", func(ctx context.Context) (bool, error) {
		for _, p := range r.projs {
			if phase, err := r.phase(ctx, p); err != nil || phase != "live" {
				return false, err
			}
		}
		return s.logText("state=live") >= len(r.projs), nil
	})
}

// appender appends events with expected-version semantics from several
// concurrent writers: each transaction reads its stream's last position and
// inserts the next one, retrying on a unique violation (another writer won
// the race) or a deadlock. Some transactions hold several events of one or
// more streams, and some linger a moment before committing, so global
// positions commit out of order.
type appender struct {
	t       *testing.T
	pool    *pgxpool.Pool
	streams int          // streams acct-0 … acct-<streams-1>; new ones are opened on first use
	pause   atomic.Int64 // nanoseconds between a writer's transactions
	// tolerateOutages: connection failures (a server restart) are retried
	// instead of being reported.
	tolerateOutages bool

	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	txns       []appendedTxn
	unexpected []error

	events  atomic.Int64 // events committed
	retries atomic.Int64 // transactions retried after a conflict
	outages atomic.Int64 // transactions retried after a connection failure
}

type appendedTxn struct {
	events []streamEvent
	// upper is pg_current_wal_insert_lsn() read after the commit returned:
	// at or above the end of the transaction's commit record.
	upper pglogrepl.LSN
}

type streamEvent struct {
	stream   string
	position int64
}

// newAppender returns an appender over streams streams for r's database.
// It has its own pool so that its connections survive nothing of r's.
func newAppender(r *rig, streams int, pause time.Duration) *appender {
	r.t.Helper()
	cfg, err := pgxpool.ParseConfig(r.dsn)
	if err != nil {
		r.t.Fatal(err)
	}
	cfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	a := &appender{t: r.t, pool: pool, streams: streams}
	a.pause.Store(int64(pause))
	r.t.Cleanup(func() {
		a.stop()
		pool.Close()
	})
	return a
}

// start launches writers goroutines appending until stop. seed makes the
// choice of streams, types and amounts reproducible (not the interleaving).
func (a *appender) start(writers int, seed uint64) {
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	for w := range writers {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			a.write(ctx, rand.New(rand.NewPCG(seed, uint64(w))))
		}()
	}
}

// stop stops the writers and waits for them. Idempotent.
func (a *appender) stop() {
	if a.cancel != nil {
		a.cancel()
	}
	a.wg.Wait()
}

// checkErrors fails t with the errors the writers did not expect.
func (a *appender) checkErrors() {
	a.t.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.unexpected) > 0 {
		a.t.Errorf("appender: %d unexpected errors, first: %v", len(a.unexpected), a.unexpected[0])
	}
}

func (a *appender) committedTxns() []appendedTxn {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.txns[:len(a.txns):len(a.txns)]
}

func (a *appender) write(ctx context.Context, rng *rand.Rand) {
	for ctx.Err() == nil {
		// 60% single-event transactions, the rest 2–4 events over one to
		// three streams; one in five lingers before committing.
		n := 1
		if rng.IntN(10) >= 6 {
			n = 2 + rng.IntN(3)
		}
		streams := make([]string, n)
		for i := range streams {
			if i > 0 && rng.IntN(3) == 0 {
				streams[i] = streams[i-1]
			} else {
				streams[i] = fmt.Sprintf("acct-%d", rng.IntN(a.streams))
			}
		}
		linger := time.Duration(0)
		if rng.IntN(5) == 0 {
			linger = time.Duration(rng.IntN(3000)) * time.Microsecond
		}
		kinds := make([]int, n)
		for i := range kinds {
			kinds[i] = rng.IntN(100)
		}
		amount := 1 + rng.IntN(100)
		for ctx.Err() == nil {
			err := a.appendTxn(ctx, streams, kinds, amount, linger)
			if err == nil {
				break
			}
			if !a.retryable(ctx, err) {
				break
			}
		}
		if pause := time.Duration(a.pause.Load()); pause > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(pause):
			}
		}
	}
}

// retryable classifies a failed append: a conflict with another writer is
// retried at once, a connection failure after a pause when outages are
// expected; anything else is recorded as unexpected and the transaction
// is given up.
func (a *appender) retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "23505", "40P01", "40001": // unique_violation, deadlock_detected, serialization_failure
			a.retries.Add(1)
			return true
		}
		if !a.tolerateOutages || !(strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")) {
			a.recordUnexpected(err)
			return false
		}
	} else if !a.tolerateOutages {
		a.recordUnexpected(err)
		return false
	}
	a.outages.Add(1)
	select {
	case <-ctx.Done():
		return false
	case <-time.After(100 * time.Millisecond):
		return true
	}
}

func (a *appender) recordUnexpected(err error) {
	a.mu.Lock()
	a.unexpected = append(a.unexpected, err)
	a.mu.Unlock()
}

// appendTxn appends one event per entry of streams in one transaction.
func (a *appender) appendTxn(ctx context.Context, streams []string, kinds []int, amount int, linger time.Duration) error {
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	txn := appendedTxn{events: make([]streamEvent, 0, len(streams))}
	for i, stream := range streams {
		var next int64
		err := tx.QueryRow(ctx, `SELECT coalesce(max(stream_position), 0) + 1 FROM events WHERE stream_id = $1`, stream).Scan(&next)
		if err != nil {
			return err
		}
		typ, data := workloadEvent(stream, next, kinds[i], amount+i)
		if _, err := tx.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data) VALUES ($1, $2, $3, $4)`,
			stream, next, typ, data); err != nil {
			return err
		}
		txn.events = append(txn.events, streamEvent{stream: stream, position: next})
	}
	if linger > 0 {
		time.Sleep(linger) // widen the window in which later positions commit first
	}
	// The commit is never cut short by stop: a COMMIT abandoned mid-flight
	// can still land after stop returned and the test counted the table.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return err
	}
	a.events.Add(int64(len(streams)))
	var upper string
	if err := conn.QueryRow(ctx, `SELECT pg_current_wal_insert_lsn()::text`).Scan(&upper); err != nil {
		return nil // committed; only the bound is unknown, so it is not recorded
	}
	if txn.upper, err = pglogrepl.ParseLSN(upper); err != nil {
		return nil
	}
	a.mu.Lock()
	a.txns = append(a.txns, txn)
	a.mu.Unlock()
	return nil
}

// workloadEvent returns the type and data of the event at position pos of
// stream: position 1 opens the account; later ones are deposits (45%),
// withdrawals (40%), notes (14%) or, rarely, a closing.
func workloadEvent(stream string, pos int64, kind, amount int) (string, []byte) {
	var typ string
	data := map[string]any{"account_id": stream}
	switch {
	case pos == 1:
		typ = typeOpened
		data["owner"] = "owner of " + stream
		data["initial"] = amount * 10
	case kind < 45:
		typ = typeDeposited
		data["amount"] = amount
	case kind < 85:
		typ = typeWithdrawn
		data["amount"] = amount
	case kind < 99:
		typ = typeNote
		data["note"] = fmt.Sprintf("note %d", pos)
	default:
		typ = typeClosed
	}
	b, _ := json.Marshal(data)
	return typ, b
}

// appended is an event appended by appendEvent.
type appended struct {
	id             string
	position       int64
	stream         string
	streamPosition int64
	typ            string
	data           []byte
}

// appendEvent appends one event with explicit data at the stream's next
// position, in a transaction of its own (or of q's, if q is a transaction).
func (r *rig) appendEvent(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, stream, typ string, data map[string]any) appended {
	r.t.Helper()
	b, err := json.Marshal(data)
	if err != nil {
		r.t.Fatal(err)
	}
	if q == nil {
		q = r.pool
	}
	e := appended{stream: stream, typ: typ, data: b}
	err = q.QueryRow(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
		SELECT $1, coalesce(max(stream_position), 0) + 1, $2, $3 FROM events WHERE stream_id = $1
		RETURNING id::text, position, stream_position`, stream, typ, b).Scan(&e.id, &e.position, &e.streamPosition)
	if err != nil {
		r.t.Fatalf("append %s to %s: %v", typ, stream, err)
	}
	return e
}

// start starts `pgscribe run` on the rig's config.
func (r *rig) start() *node {
	r.t.Helper()
	r.mu.Lock()
	name := fmt.Sprintf("pgscribe-%d", len(r.procs)+1)
	r.mu.Unlock()
	s := newNode(r.t, name, r.config)
	s.noListener = true // [metrics] listen = "off"
	s.start()
	r.mu.Lock()
	r.procs = append(r.procs, s)
	r.mu.Unlock()
	return s
}

// waitLog waits until s has logged substr k times.
func (r *rig) waitLog(s *node, timeout time.Duration, substr string, k int) {
	r.t.Helper()
	r.waitUntil(timeout, fmt.Sprintf("%s to log %q %d times", s.name, substr, k), func(context.Context) (bool, error) {
		return s.logText(substr) >= k, nil
	})
}

// brokenProcess describes the first pgscribe process of the rig that exited
// without being asked to, or that halted a projection; "" if none did.
func (r *rig) brokenProcess() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.procs {
		if why := s.brokenOrHalted(); why != "" {
			return why
		}
	}
	return ""
}

// newLoadRig is the start of the load tests: a rig running balances and
// activity, seeded with streams × perStream events, and an appender (not
// started) over streams+extra streams pausing pause between transactions.
// rng is the test's random source: stream k of the logged seed. more are
// projections run beside balances and activity.
func newLoadRig(t *testing.T, streams, perStream, extra int, pause time.Duration, k uint64, more ...coreProjection) (r *rig, a *appender, seed uint64, rng *rand.Rand) {
	t.Helper()
	r = newRig(t, append([]coreProjection{balancesProjection(), activityProjection()}, more...), nil)
	seed = seedFromEnv(t)
	r.seed(streams, perStream)
	return r, newAppender(r, streams+extra, pause), seed, rand.New(rand.NewPCG(seed, k))
}

// seedFromEnv returns the seed of a randomised test, from
// PGSCRIBE_TEST_SEED when set (to replay a failure), and logs it.
func seedFromEnv(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PGSCRIBE_TEST_SEED"); s != "" {
		if _, err := fmt.Sscan(s, &seed); err != nil {
			t.Fatalf("PGSCRIBE_TEST_SEED=%q: %v", s, err)
		}
	}
	t.Logf("seed %d (replay with PGSCRIBE_TEST_SEED=%d)", seed, seed)
	return seed
}
