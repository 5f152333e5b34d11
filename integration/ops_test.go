package integration

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Tests of the ops' behaviour on shared rows, key-only writes and writes
// that match no row, against real PostgreSQL.

// orderTypes are the six event types of an order stream; every stream
// writes every one of them, so the type_counts rows are shared by all.
var orderTypes = []string{"OrderPlaced", "ItemAdded", "ItemRemoved", "OrderPaid", "OrderShipped", "OrderClosed"}

// customersProjection keys its rows by customer while the events come in
// per-order streams: rows written by many streams, in every partition.
func customersProjection() coreProjection {
	return coreProjection{
		name: "customers", version: 1,
		rules: []rule{
			{name: "total", op: "upsert", table: "customer_totals", key: `customer_id = "data.customer_id"`, set: `last_type = "type"`, inc: `events = "1", total = "data.amount"`},
		},
		ddl: `CREATE TABLE IF NOT EXISTS customer_totals (
	customer_id text   PRIMARY KEY,
	events      bigint NOT NULL,
	total       bigint NOT NULL,
	last_type   text   NOT NULL
)`,
		// last_type is the type of whichever stream's batch committed last:
		// not something an oracle can compute, so it is left out.
		expected: `SELECT data->>'customer_id', count(*)::bigint, sum((data->>'amount')::bigint)::bigint FROM events GROUP BY 1`,
		actual:   `SELECT customer_id, events, total FROM customer_totals`,
		outcome:  `'applied'`,
	}
}

// typeCountsProjection counts events by type: six rows written by every
// stream.
func typeCountsProjection() coreProjection {
	return coreProjection{
		name: "type_counts", version: 1,
		rules: []rule{
			{name: "count", op: "upsert", table: "type_counts", key: `type = "type"`, inc: `n = "1", amount = "data.amount"`},
		},
		ddl: `CREATE TABLE IF NOT EXISTS type_counts (
	type   text   PRIMARY KEY,
	n      bigint NOT NULL,
	amount bigint NOT NULL
)`,
		expected: `SELECT type, count(*)::bigint, sum((data->>'amount')::bigint)::bigint FROM events GROUP BY 1`,
		actual:   `SELECT type, n, amount FROM type_counts`,
		outcome:  `'applied'`,
	}
}

// ordersSQL inserts orders [$1, $2): six events per order stream, of the
// types $3, interleaved across the streams in position order; order o
// belongs to customer o % 25.
const ordersSQL = `INSERT INTO events (stream_id, stream_position, type, data)
SELECT 'order-' || o, sp, ($3::text[])[sp],
	jsonb_build_object('customer_id', 'cust-' || (o % 25), 'amount', 1 + (o * 37 + sp * 11) % 97)
FROM generate_series(1, 6) AS sp CROSS JOIN generate_series($1::int, $2::int - 1) AS o
ORDER BY sp, o`

// insertOrders inserts orders [from, to) in one transaction.
func (r *rig) insertOrders(ctx context.Context, from, to int) {
	r.t.Helper()
	r.exec(ctx, ordersSQL, from, to, orderTypes)
}

// TestSharedRowsWithoutDeadlocks runs, at parallelism 4, a projection
// keyed by customer over per-order streams and a counts-by-type projection
// (six rows written by every stream), through a backfill and a live phase
// with concurrent writers: batches of different partitions write the same
// rows at once. They must wait for each other, never deadlock (no 40P01
// retry at all), and the read models must equal the ones computed from
// the events table.
func TestSharedRowsWithoutDeadlocks(t *testing.T) {
	requireServer(t)
	r := newRig(t, []coreProjection{customersProjection(), typeCountsProjection()},
		map[string]string{"parallelism": "4", "batch_size": "100", "backfill_batch_size": "500"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	r.insertOrders(ctx, 0, 1500)
	s := r.start()
	r.waitCaughtUp(3 * time.Minute)

	// Live: eight writers, each committing transactions of a few orders.
	const writers, txns, perTxn = 8, 40, 4
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			for i := range txns {
				from := 1500 + (w*txns+i)*perTxn
				_, err := r.pool.Exec(ctx, ordersSQL, from, from+perTxn, orderTypes)
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range writers {
		if err := <-errs; err != nil {
			t.Fatalf("writer: %v", err)
		}
	}
	r.waitCaughtUp(3 * time.Minute)
	r.verify()

	if n := s.logText("40P01"); n != 0 {
		t.Errorf("%d deadlock (40P01) retries; the log's last lines:\n%s", n, s.tail(40))
	}
	t.Logf("%d events, %d transient retries of any kind", r.eventCount(ctx), s.logText("retrying batch"))
}

// membersProjection has key-only writes and writes that can miss.
func membersProjection() coreProjection {
	return coreProjection{
		name: "members", version: 1,
		rules: []rule{
			{name: "open", on: "AccountOpened", op: "insert", table: "open_accounts", key: `account_id = "stream_id"`},
			{name: "seen", op: "upsert", table: "seen_accounts", key: `account_id = "stream_id"`},
			{name: "deposit", on: "Deposited", op: "update", table: "open_accounts", key: `account_id = "stream_id"`, inc: `deposits = "1"`},
			{name: "close", on: "AccountClosed", op: "delete", table: "open_accounts", key: `account_id = "stream_id"`, ifMissing: "dead_letter"},
			{name: "close_log", on: "AccountClosed", op: "insert", table: "close_log", set: `event_id = "id", account_id = "stream_id"`},
		},
		ddl: `CREATE TABLE IF NOT EXISTS open_accounts (account_id text PRIMARY KEY, deposits bigint NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS seen_accounts (account_id text PRIMARY KEY);
CREATE TABLE IF NOT EXISTS close_log (event_id uuid PRIMARY KEY, account_id text NOT NULL)`,
		// Which closes dead-letter: a ghost stream's (never opened) and a
		// twice stream's second. Their events' other writes (seen, the
		// close_log row) must not apply either.
		outcome: `CASE WHEN type = 'AccountClosed' AND (stream_id LIKE '%ghost-%' OR (stream_id LIKE '%twice-%' AND stream_position = 3))
	THEN 'dead' ELSE 'applied' END`,
		expected: `SELECT 'open' AS t, stream_id AS account_id, count(*) FILTER (WHERE type = 'Deposited' AND stream_position > opened)::bigint AS n
FROM (SELECT *, min(stream_position) FILTER (WHERE type = 'AccountOpened') OVER (PARTITION BY stream_id) AS opened FROM events) e
GROUP BY stream_id HAVING bool_or(type = 'AccountOpened') AND NOT bool_or(type = 'AccountClosed')
UNION ALL
SELECT DISTINCT 'seen', stream_id, 0::bigint FROM events WHERE stream_id NOT LIKE '%ghost-%'
UNION ALL
SELECT 'log', id::text || ' ' || stream_id, 0::bigint FROM events
WHERE type = 'AccountClosed' AND NOT (stream_id LIKE '%ghost-%' OR (stream_id LIKE '%twice-%' AND stream_position = 3))`,
		actual: `SELECT 'open' AS t, account_id, deposits FROM open_accounts
UNION ALL SELECT 'seen', account_id, 0::bigint FROM seen_accounts
UNION ALL SELECT 'log', event_id::text || ' ' || account_id, 0::bigint FROM close_log`,
	}
}

// insertMembers inserts, in one transaction, streams of prefix p: ok-i
// (open, three deposits, and for even i a close), early-i (a deposit
// before the opening: counted as missing), ghost-i (a close of an account
// never opened) and twice-i (open, close, close again).
func (r *rig) insertMembers(ctx context.Context, p string) {
	r.t.Helper()
	r.exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
SELECT stream_id, sp, t, '{}' FROM (
	SELECT $1 || 'ok-' || i AS stream_id, sp, CASE WHEN sp = 1 THEN 'AccountOpened' WHEN sp <= 4 THEN 'Deposited' ELSE 'AccountClosed' END AS t
	FROM generate_series(0, 19) AS i CROSS JOIN generate_series(1, 5) AS sp WHERE sp <= 4 OR i % 2 = 0
	UNION ALL
	SELECT $1 || 'early-' || i, sp, (ARRAY['Deposited', 'AccountOpened', 'Deposited'])[sp]
	FROM generate_series(0, 4) AS i CROSS JOIN generate_series(1, 3) AS sp
	UNION ALL
	SELECT $1 || 'ghost-' || i, 1, 'AccountClosed' FROM generate_series(0, 3) AS i
	UNION ALL
	SELECT $1 || 'twice-' || i, sp, (ARRAY['AccountOpened', 'AccountClosed', 'AccountClosed'])[sp]
	FROM generate_series(0, 2) AS i CROSS JOIN generate_series(1, 3) AS sp
) s ORDER BY sp, stream_id`, p)
}

// TestKeyOnlyWritesAndMissingRows: insert and upsert with only a key
// write the key; an update that matches no row is counted; a delete with
// if_missing = "dead_letter" that matches no row dead-letters its event,
// none of whose other writes apply. Backfill and live both.
func TestKeyOnlyWritesAndMissingRows(t *testing.T) {
	requireServer(t)
	r := newRig(t, []coreProjection{membersProjection()}, nil)
	cfg, err := os.ReadFile(r.config)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.config, []byte(strings.Replace(string(cfg), `listen = "off"`, `listen = "127.0.0.1:0"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r.insertMembers(ctx, "b-")
	s := r.start()
	r.waitCaughtUp(2 * time.Minute)
	r.insertMembers(ctx, "l-")
	r.waitCaughtUp(2 * time.Minute)
	r.verify()

	var kinds []string
	rows, err := r.pool.Query(ctx, `SELECT DISTINCT error_kind || ': ' || error_message FROM pgscribe.dead_letters ORDER BY 1 LIMIT 3`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		kinds = append(kinds, k)
	}
	if len(kinds) == 0 || !strings.HasPrefix(kinds[0], `missing:close: delete matched no row of open_accounts where account_id = `) {
		t.Errorf("dead letters: %q, want missing:close with a readable reason", kinds)
	}

	addr := regexp.MustCompile(`msg="metrics listening" addr=(\S+)`).FindStringSubmatch(s.tail(1 << 20))
	if addr == nil {
		t.Fatalf("no metrics address in the log:\n%s", s.tail(40))
	}
	// Two rounds (backfill and live) of 5 early deposits and 7 closes.
	for rule, want := range map[string]float64{"deposit": 10, "close": 14, "open": 0} {
		if got := scrapeCounter(t, addr[1], "members", "pgscribe_rows_missing_total", "rule", rule); got != want {
			t.Errorf("pgscribe_rows_missing_total{rule=%q} = %v, want %v", rule, got, want)
		}
	}
}

// scrapeCounter reads the value of a counter series of the projection
// (extra labels as name, value pairs); 0 when there is none.
func scrapeCounter(t *testing.T, addr, projection, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"projection": projection}
	for i := 0; i+1 < len(labels); i += 2 {
		want[labels[i]] = labels[i+1]
	}
	v, _ := scrape(fams).value(name, want)
	return v
}

// TestMigrateIgnoresRules: migrate needs no rules, so a rule that does not
// validate does not stop it; run still refuses it, naming the rule.
func TestMigrateIgnoresRules(t *testing.T) {
	requireServer(t)
	broken := coreProjection{name: "broken", version: 1, rules: []rule{
		{name: "open-index", op: "insert", table: "t", key: `id = "id"`, set: `id = "id"`},
	}}
	r := newRig(t, []coreProjection{broken}, nil) // newRig migrates
	out, err := exec.Command(pgscribeBinary(t), "run", "-config", r.config).CombinedOutput()
	if err == nil || !strings.Contains(string(out), `projection "broken" v1, rule "open-index": set.id: column "id" is already in key`) {
		t.Errorf("run: %v\n%s", err, out)
	}
}

// w6Dead says which events of the rig's workload the w6 projection must
// dead-letter: rule poison (a withdrawal at a position divisible by 53
// fails its rule), commit-time integrity poison (a note at a position
// divisible by 97 is too long for its varchar(16) column, SQLSTATE 22001)
// and a delete that finds no row with if_missing = "dead_letter" (an
// account's second closing). Unqualified columns are those of the events
// row the predicate is about.
const w6Dead = `(
	(type = 'Withdrawn' AND position % 53 = 0)
	OR (type = 'NoteAdded' AND position % 97 = 0)
	OR (type = 'AccountClosed' AND EXISTS (SELECT 1 FROM events AS c
		WHERE c.stream_id = events.stream_id AND c.type = 'AccountClosed' AND c.stream_position < events.stream_position)))`

// w6Projection is the shape of the bench's W6 (issue 12) over the rig's
// workload: a key-only insert opens an account row, update+inc counts its
// movements, update+set keeps its last note, a delete (if_missing =
// "dead_letter") closes it, an insert logs each note in a varchar column,
// and an upsert with inc only counts events by type in a few rows that
// every stream writes. An event's writes apply all or none, so a dead
// event counts in no table. The counts by type use inc only: a set on a
// row of many streams has no single expected value.
func w6Projection() coreProjection {
	return coreProjection{
		name: "w6", version: 1,
		rules: []rule{
			{name: "open", on: "AccountOpened", op: "insert", table: "w6_accounts", key: `account_id = "stream_id"`},
			{name: "move", on: "Deposited,Withdrawn", op: "update", table: "w6_accounts", key: `account_id = "stream_id"`,
				inc: `moves = "1", total = "type == 'Deposited' ? data.amount : -data.amount"`},
			{name: "poison", on: "Withdrawn", when: "position % 53 == 0", op: "fail", message: "'rule poison at ' + string(position)"},
			{name: "note", on: "NoteAdded", op: "update", table: "w6_accounts", key: `account_id = "stream_id"`, set: `last_note = "data.note"`},
			{name: "note_log", on: "NoteAdded", op: "insert", table: "w6_notes",
				set: `event_id = "id", note = "position % 97 == 0 ? data.note + ' is far too long for its column' : data.note"`},
			{name: "close", on: "AccountClosed", op: "delete", table: "w6_accounts", key: `account_id = "stream_id"`, ifMissing: "dead_letter"},
			{name: "by_type", op: "upsert", table: "w6_type_counts", key: `type = "type"`, inc: `n = "1"`},
		},
		ddl: `CREATE TABLE IF NOT EXISTS w6_accounts (
	account_id text   PRIMARY KEY,
	moves      bigint NOT NULL DEFAULT 0,
	total      bigint NOT NULL DEFAULT 0,
	last_note  text
);
CREATE TABLE IF NOT EXISTS w6_notes (event_id uuid PRIMARY KEY, note varchar(16) NOT NULL);
CREATE TABLE IF NOT EXISTS w6_type_counts (type text PRIMARY KEY, n bigint NOT NULL)`,
		// Every stream opens at position 1 (never dead); its first closing
		// deletes the row, later movements and notes then miss it.
		expected: `SELECT 'account' AS t, stream_id AS k,
	count(*) FILTER (WHERE type IN ('Deposited', 'Withdrawn'))::bigint AS n,
	coalesce(sum(CASE type WHEN 'Deposited' THEN (data->>'amount')::bigint WHEN 'Withdrawn' THEN -(data->>'amount')::bigint END), 0)::bigint AS total,
	(array_agg(data->>'note' ORDER BY stream_position DESC) FILTER (WHERE type = 'NoteAdded'))[1] AS note
FROM events WHERE NOT ` + w6Dead + `
GROUP BY stream_id HAVING bool_or(type = 'AccountOpened') AND NOT bool_or(type = 'AccountClosed')
UNION ALL
SELECT 'note', id::text, 0, 0, data->>'note' FROM events WHERE type = 'NoteAdded' AND NOT ` + w6Dead + `
UNION ALL
SELECT 'type', type, count(*)::bigint, 0, NULL FROM events WHERE NOT ` + w6Dead + ` GROUP BY type`,
		actual: `SELECT 'account' AS t, account_id, moves, total, last_note FROM w6_accounts
UNION ALL SELECT 'note', event_id::text, 0, 0, note::text FROM w6_notes
UNION ALL SELECT 'type', type, n, 0, NULL FROM w6_type_counts`,
		outcome: `CASE WHEN ` + w6Dead + ` THEN 'dead' ELSE 'applied' END`,
	}
}

// requireW6Poison fails unless w6's exact dead letters (verifyProjection
// checked them event by event) include both kinds of poison: a rule's
// failure and a value too long for its varchar column (SQLSTATE 22001),
// so that an oracle passing over a workload without poison cannot hide.
func requireW6Poison(t *testing.T, q querier) {
	t.Helper()
	rule := scalar[int64](t, q, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = 'w6' AND event_type = 'Withdrawn'`)
	integrity := scalar[int64](t, q, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = 'w6' AND event_type = 'NoteAdded'
	AND (error_message LIKE '%22001%' OR error_message ILIKE '%too long%')`)
	missed := scalar[int64](t, q, `SELECT count(*) FROM pgscribe.dead_letters WHERE projection = 'w6' AND event_type = 'AccountClosed'`)
	t.Logf("w6 dead letters: %d rule poison, %d integrity poison (22001), %d deletes of a missing row", rule, integrity, missed)
	// Which events are poison depends on their global position, which the
	// server assigns: a short random workload can draw none of a kind. The
	// events table says how many of each there must be; a test that would
	// draw none of both proves nothing about poison and fails.
	wantRule := scalar[int64](t, q, `SELECT count(*) FROM events WHERE type = 'Withdrawn' AND position % 53 = 0`)
	wantIntegrity := scalar[int64](t, q, `SELECT count(*) FROM events WHERE type = 'NoteAdded' AND position % 97 = 0`)
	if rule != wantRule || integrity != wantIntegrity {
		t.Errorf("w6: %d rule and %d integrity poison dead letters, want %d and %d", rule, integrity, wantRule, wantIntegrity)
	}
	if wantRule+wantIntegrity == 0 {
		t.Errorf("w6: the workload drew no poison event at all")
	}
}
