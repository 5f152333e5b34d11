package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// model is a read model the bench builds three ways: through the engine
// (the projection of that name), with one set-based statement over the
// events table (the SQL ceiling), and with a loop committing one
// transaction per event (what most hand-written projectors do).
type model struct {
	projection string
	table      string
	// ceiling builds the whole read model into table %[1]s in one
	// INSERT … SELECT … ON CONFLICT, from the same events and with the
	// same meaning as the projection's rules.
	ceiling string
	// apply writes one event into the loop's copy of the table.
	apply func(ctx context.Context, tx pgx.Tx, table string, ev *loopEvent) error
}

// balanceColumns are the SQL ceilings' select list of an account's balance
// row, grouped by account (balances and W6's w6_balances): account, owner,
// balance and closed.
const balanceColumns = `data->>'account_id',
  max(data->>'owner') FILTER (WHERE type = 'AccountOpened'),
  sum(CASE type WHEN 'AccountOpened' THEN (data->>'initial')::bigint
                WHEN 'Deposited' THEN (data->>'amount')::bigint
                WHEN 'Withdrawn' THEN -(data->>'amount')::bigint ELSE 0 END),
  coalesce(bool_or(type = 'AccountClosed'), false)`

var (
	balancesModel = model{projection: "balances", table: "balances", ceiling: `
INSERT INTO %[1]s AS t (account_id, owner, balance, closed, updated_at)
SELECT ` + balanceColumns + `,
  max(occurred_at)
FROM events
WHERE type IN ('AccountOpened', 'Deposited', 'Withdrawn', 'AccountClosed')
GROUP BY 1
ON CONFLICT (account_id) DO UPDATE SET owner = excluded.owner, balance = t.balance + excluded.balance,
  closed = excluded.closed, updated_at = excluded.updated_at`,
		apply: applyBalance}

	activityModel = model{projection: "activity", table: "account_activity", ceiling: `
INSERT INTO %[1]s (event_id, account_id, type, amount, occurred_at)
SELECT id, data->>'account_id', type,
  coalesce((data->>'amount')::bigint, (data->>'initial')::bigint, 0), occurred_at
FROM events
WHERE type IN ('AccountOpened', 'Deposited', 'Withdrawn', 'AccountClosed')
ON CONFLICT (event_id) DO NOTHING`,
		apply: applyActivity}

	statsModel = model{projection: "account_stats", table: "account_stats", ceiling: `
INSERT INTO %[1]s AS t (account_id, events, deposited, withdrawn, last_type, last_event_at)
SELECT data->>'account_id', count(*),
  coalesce(sum((data->>'amount')::bigint) FILTER (WHERE type = 'Deposited'), 0),
  coalesce(sum((data->>'amount')::bigint) FILTER (WHERE type = 'Withdrawn'), 0),
  (array_agg(type ORDER BY position DESC))[1], max(occurred_at)
FROM events
WHERE type IN ('AccountOpened', 'Deposited', 'Withdrawn', 'AccountClosed')
GROUP BY 1
ON CONFLICT (account_id) DO UPDATE SET events = t.events + excluded.events,
  deposited = t.deposited + excluded.deposited, withdrawn = t.withdrawn + excluded.withdrawn,
  last_type = excluded.last_type, last_event_at = excluded.last_event_at`,
		apply: applyStats}
)

// loopEvent is an event as the per-event loop reads it.
type loopEvent struct {
	id                       string
	streamID, typ            string
	streamPosition, position int64
	data                     map[string]any
	occurredAt               time.Time
}

// num reads a JSON number of a decoded payload as an int64.
func num(v any) int64 {
	switch n := v.(type) {
	case float64:
		return int64(n)
	case int64:
		return n
	}
	return 0
}

func str(v any) string { s, _ := v.(string); return s }

func applyBalance(ctx context.Context, tx pgx.Tx, table string, ev *loopEvent) error {
	t := pgx.Identifier{table}.Sanitize()
	acct := str(ev.data["account_id"])
	var err error
	switch ev.typ {
	case "AccountOpened":
		_, err = tx.Exec(ctx, `INSERT INTO `+t+` (account_id, owner, balance, closed, updated_at)
			VALUES ($1, $2, $3, false, $4) ON CONFLICT (account_id) DO UPDATE SET owner = excluded.owner,
			balance = excluded.balance, closed = false, updated_at = excluded.updated_at`,
			acct, str(ev.data["owner"]), num(ev.data["initial"]), ev.occurredAt)
	case "Deposited", "Withdrawn":
		amount := num(ev.data["amount"])
		if ev.typ == "Withdrawn" {
			amount = -amount
		}
		_, err = tx.Exec(ctx, `UPDATE `+t+` SET balance = balance + $1, updated_at = $2 WHERE account_id = $3`,
			amount, ev.occurredAt, acct)
	case "AccountClosed":
		_, err = tx.Exec(ctx, `UPDATE `+t+` SET closed = true, updated_at = $1 WHERE account_id = $2`, ev.occurredAt, acct)
	}
	return err
}

func applyActivity(ctx context.Context, tx pgx.Tx, table string, ev *loopEvent) error {
	amount := num(ev.data["amount"])
	if _, ok := ev.data["amount"]; !ok {
		amount = num(ev.data["initial"])
	}
	_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{table}.Sanitize()+
		` (event_id, account_id, type, amount, occurred_at) VALUES ($1, $2, $3, $4, $5)`,
		ev.id, str(ev.data["account_id"]), ev.typ, amount, ev.occurredAt)
	return err
}

func applyStats(ctx context.Context, tx pgx.Tx, table string, ev *loopEvent) error {
	var dep, wd int64
	switch ev.typ {
	case "Deposited":
		dep = num(ev.data["amount"])
	case "Withdrawn":
		wd = num(ev.data["amount"])
	}
	t := pgx.Identifier{table}.Sanitize()
	_, err := tx.Exec(ctx, `INSERT INTO `+t+` AS t (account_id, events, deposited, withdrawn, last_type, last_event_at)
		VALUES ($1, 1, $2, $3, $4, $5) ON CONFLICT (account_id) DO UPDATE SET events = t.events + 1,
		deposited = t.deposited + excluded.deposited, withdrawn = t.withdrawn + excluded.withdrawn,
		last_type = excluded.last_type, last_event_at = excluded.last_event_at`,
		str(ev.data["account_id"]), dep, wd, ev.typ, ev.occurredAt)
	return err
}

// refFigures is one reference measurement.
type refFigures struct {
	events  int64
	elapsed time.Duration
	pgCPU   time.Duration
	pgOK    bool
}

func (r refFigures) rate() float64 { return float64(r.events) / r.elapsed.Seconds() }

// copyTable creates an empty copy of a read-model table (same columns,
// keys and indexes) for a reference to build.
func copyTable(ctx context.Context, db *database, table, suffix string) (string, error) {
	name := table + suffix
	_, err := db.pool.Exec(ctx, fmt.Sprintf("DROP TABLE IF EXISTS %[1]s; CREATE TABLE %[1]s (LIKE %[2]s INCLUDING ALL)",
		pgx.Identifier{name}.Sanitize(), pgx.Identifier{table}.Sanitize()))
	return name, err
}

// sqlCeiling builds m's read model into a copy with one statement, timed.
func (b *bench) sqlCeiling(ctx context.Context, db *database, m model, events int64) (refFigures, error) {
	table, err := copyTable(ctx, db, m.table, "_sql")
	if err != nil {
		return refFigures{}, err
	}
	pg0, ok := b.srv.cpu()
	start := time.Now()
	if _, err := db.pool.Exec(ctx, fmt.Sprintf(m.ceiling, pgx.Identifier{table}.Sanitize())); err != nil {
		return refFigures{}, fmt.Errorf("SQL ceiling of %s: %w", m.projection, err)
	}
	r := refFigures{events: events, elapsed: time.Since(start), pgOK: ok}
	if pg1, ok := b.srv.cpu(); ok && r.pgOK {
		r.pgCPU = pg1 - pg0
	}
	return r, nil
}

// perEventLoop applies the first n events (in position order) into a copy
// of m's table, one transaction per event holding the read-model write and
// a cursor upsert, on one connection: the shape of a typical hand-written
// projector. Reading the slice is not timed.
func (b *bench) perEventLoop(ctx context.Context, db *database, m model, n int64) (refFigures, error) {
	table, err := copyTable(ctx, db, m.table, "_loop")
	if err != nil {
		return refFigures{}, err
	}
	_, err = db.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS loop_cursors (
		projection text, stream_id text, stream_position bigint NOT NULL, position bigint NOT NULL,
		updated_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (projection, stream_id))`)
	if err != nil {
		return refFigures{}, err
	}
	evs, err := readSlice(ctx, db, n)
	if err != nil {
		return refFigures{}, err
	}
	conn, err := db.pool.Acquire(ctx)
	if err != nil {
		return refFigures{}, err
	}
	defer conn.Release()
	if _, err := db.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return refFigures{}, err
	}
	pg0, ok := b.srv.cpu()
	start := time.Now()
	for i := range evs {
		ev := &evs[i]
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if err := m.apply(ctx, tx, table, ev); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO loop_cursors (projection, stream_id, stream_position, position)
				VALUES ($1, $2, $3, $4) ON CONFLICT (projection, stream_id) DO UPDATE SET
				stream_position = excluded.stream_position, position = excluded.position, updated_at = now()`,
				m.projection, ev.streamID, ev.streamPosition, ev.position)
			return err
		})
		if err != nil {
			return refFigures{}, fmt.Errorf("per-event loop of %s, event %d: %w", m.projection, ev.position, err)
		}
	}
	r := refFigures{events: int64(len(evs)), elapsed: time.Since(start), pgOK: ok}
	if pg1, ok := b.srv.cpu(); ok && r.pgOK {
		r.pgCPU = pg1 - pg0
	}
	return r, nil
}

func readSlice(ctx context.Context, db *database, n int64) ([]loopEvent, error) {
	rows, err := db.pool.Query(ctx, `SELECT id::text, stream_id, stream_position, position, type, data, occurred_at
		FROM events ORDER BY position LIMIT $1`, n)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []loopEvent
	for rows.Next() {
		var ev loopEvent
		if err := rows.Scan(&ev.id, &ev.streamID, &ev.streamPosition, &ev.position, &ev.typ, &ev.data, &ev.occurredAt); err != nil {
			return nil, err
		}
		out = append(out, ev)
	}
	return out, rows.Err()
}

// sameAsCeiling reports how many rows differ between the engine's read
// model and the SQL ceiling's (both directions): 0 means identical.
func sameAsCeiling(ctx context.Context, db *database, m model) (int64, error) {
	t, c := pgx.Identifier{m.table}.Sanitize(), pgx.Identifier{m.table + "_sql"}.Sanitize()
	var n int64
	err := db.pool.QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM (TABLE %[1]s EXCEPT ALL TABLE %[2]s) a)
		+ (SELECT count(*) FROM (TABLE %[2]s EXCEPT ALL TABLE %[1]s) b)`, t, c)).Scan(&n)
	return n, err
}
