package main

import (
	"context"
	"fmt"
)

// W10 is the two-projection account workload of issue 29: one events
// table split as users split it into an account projection (`account`: 8
// rules, a ledger row per event, balances, membership, a summary, a fail
// rule) and a count-by-type projection (`acct_counts`: a handful of rows
// every event updates), both in the default group, over 2,000 streams.
// Each run backfills them from the table and is set against its SQL
// ceiling: the same final rows written by one set-based statement per
// table. It runs clean, then with poison (per 1,000 deposits and
// withdrawals, 2 carry a reference too long for acct_balances.last_ref,
// which fails at commit, and 1 a zero amount, which the fail rule
// rejects), then the account projection alone on the clean history.

// w10Streams and w10Events are the size of W10's history (the issue's,
// before -scale).
const (
	w10Streams = 2000
	w10Events  = 200_000
)

// w10RulePoison makes 1 in 1,000 deposits and withdrawals carry a zero
// amount (the account projection's fail rule), apart from the positions
// the history gave a long reference.
const w10RulePoison = `
UPDATE events SET data = jsonb_set(data, '{amount}', '0')
WHERE type IN ('Deposited', 'Withdrawn') AND (hashint8(position) & 2147483647) % 1000 = 999
  AND length(data->>'reference') <= 40`

// w10Bad is the predicate of an event the account projection
// dead-letters.
const w10Bad = `(type IN ('Deposited', 'Withdrawn') AND ((data->>'amount')::bigint <= 0 OR length(data->>'reference') > 40))`

// w10Models are W10's tables with their SQL ceilings.
var w10Models = []model{
	openModel("account", "acct_open"),
	lastRefBalancesModel("account", "acct_balances", w10Bad),
	{projection: "account", table: "acct_ledger", ceiling: `
INSERT INTO %[1]s (event_id, account_id, type, amount, occurred_at)
SELECT id, data->>'account_id', type, coalesce((data->>'amount')::bigint, (data->>'initial')::bigint, 0), occurred_at
FROM events WHERE NOT ` + w10Bad},
	{projection: "account", table: "acct_summary", ceiling: `
INSERT INTO %[1]s (account_id, last_type, events)
SELECT data->>'account_id', (array_agg(type ORDER BY position DESC))[1], count(*)
FROM events WHERE NOT ` + w10Bad + `
GROUP BY 1`},
	{projection: "acct_counts", table: "acct_type_counts", ceiling: `
INSERT INTO %[1]s (type, n)
SELECT type, count(*) FROM events GROUP BY 1`},
}

// w10HotTables are the tables of W10 whose rows every batch updates, whose
// size the clean pair's run records (issue 35's churn figure): the
// account's per-account rows, the counts every event updates, the cursors.
var w10HotTables = []string{"acct_balances", "acct_summary", "acct_type_counts", "pgscribe.cursors"}

func (b *bench) w10(ctx context.Context) error {
	hist := newHistory(b.opts.scaled(w10Events), w10Streams, w10Streams)
	n := hist.events()
	w := b.res.workload("W10", "two projections split from one table: account and counts by type",
		fmt.Sprintf("backfill of %s events over %s streams by two projections in one group: `account` (8 rules: key-only "+
			"membership insert and delete, a ledger row per event, balances with insert, update + inc + set and update + set, "+
			"a per-account upsert, a fail rule) and `acct_counts` (counts by event type: a handful of rows every event updates); "+
			"clean, then with 3 in 1,000 deposits and withdrawals poison (2 fail at commit, 1 a rule), then `account` alone, "+
			"each beside the SQL ceiling of the same rows (one statement per table)",
			thousands(n), thousands(hist.streams)), n)
	both := []target{{projection: "account", version: 1}, {projection: "acct_counts", version: 1}}
	for _, run := range []struct {
		id, label string
		targets   []target
		poison    bool
	}{
		{"W10", "pgscribe, clean", both, false},
		{"W10p", "pgscribe, with poison", both, true},
		{"W10a", "pgscribe, account alone, clean", both[:1], false},
	} {
		if b.opts.w10CleanOnly && run.id != "W10" {
			continue
		}
		if err := b.w10Run(ctx, w, hist, run.id, run.label, run.targets, run.poison); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) w10Run(ctx context.Context, w *Workload, hist history, id, label string, targets []target, poison bool) error {
	if poison {
		hist.poison = 2
	}
	db, cfg, err := b.setupFilled(ctx, w, id, targets, hist, genTxEvents)
	if err != nil {
		return err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	n := hist.events()
	poisonSQL := ""
	if poison {
		poisonSQL = w10RulePoison
	}
	r, err := b.poisonRun(ctx, w, db, id, label, cfg, targets, n, poisonSQL, w10Bad)
	if err != nil {
		return err
	}
	if id == "W10" { // with -statements: the clean pair's, as W6 keeps its clean run's
		w.Statements = r.statements
		sizes, err := db.tableSizes(ctx, n, w10HotTables)
		if err != nil {
			return err
		}
		w.Sizes = append(w.Sizes, sizes...)
	}
	if !b.opts.refs {
		return nil
	}
	c, err := b.ceilingOf(ctx, w, db, id, w10Models, n, func(m model) bool { return hasTarget(targets, m.projection) })
	if err != nil {
		return err
	}
	// The engine's rate here is events (not events·projections) per
	// second until every projection accounted for them: *engine ÷ this*
	// is the ceiling's time over the engine's.
	w.Rows = append(w.Rows, refRow("sql", "SQL ceiling of "+label, "*", c, float64(n)/r.duration.Seconds()))
	return nil
}

// hasTarget says whether targets holds projection.
func hasTarget(targets []target, projection string) bool {
	for _, t := range targets {
		if t.projection == projection {
			return true
		}
	}
	return false
}
