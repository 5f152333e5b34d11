package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// W6 is the real shape of a bank-style stream: one projection with mixed
// ops over the generated history — a membership table kept with key-only
// inserts and deletes, balances with update + inc + set and update + set,
// and counts by event type in four rows that every stream writes — run
// twice in the same run: on the clean history, and with poison mixed in
// (0.5% of the events carry a reference too long for its varchar(40) and
// fail at commit, 1% fail a rule: a zero or missing amount).

// w6Tables is W6's read model.
const w6Tables = `
CREATE TABLE IF NOT EXISTS w6_open (
  account_id text    PRIMARY KEY,
  seen       boolean NOT NULL DEFAULT true
);
CREATE TABLE IF NOT EXISTS w6_balances (
  account_id text        PRIMARY KEY,
  owner      text        NOT NULL,
  balance    bigint      NOT NULL,
  closed     boolean     NOT NULL,
  last_ref   varchar(40)
);
CREATE TABLE IF NOT EXISTS w6_type_counts (
  type text   PRIMARY KEY,
  n    bigint NOT NULL
);`

// w6Poison turns 0.5% of the deposits and withdrawals into commit-time
// poison (a reference of 48 characters) and 1% into rule poison (half a
// zero amount, half no amount), chosen by a hash of the position.
const w6Poison = `
UPDATE events SET data = CASE
    WHEN (hashint8(position) & 2147483647) % 1000 < 5 THEN jsonb_set(data, '{reference}', to_jsonb(repeat('r', 40) || lpad(position::text, 8, '0')))
    WHEN (hashint8(position) & 2147483647) % 1000 < 10 THEN jsonb_set(data, '{amount}', '0')
    ELSE data - 'amount' END
WHERE type IN ('Deposited', 'Withdrawn') AND (hashint8(position) & 2147483647) % 1000 < 15`

// w6Bad is the predicate of an event that must be dead-lettered.
const w6Bad = `(type IN ('Deposited', 'Withdrawn') AND (data->'amount' IS NULL OR (data->>'amount')::bigint <= 0
  OR length(data->>'reference') > 40))`

// w6Models are W6's tables with their SQL ceilings: the same read model
// from the events that are not poison, one statement per table.
var w6Models = []model{
	openModel("w6", "w6_open"),
	lastRefBalancesModel("w6", "w6_balances", w6Bad),
	{projection: "w6", table: "w6_type_counts", ceiling: `
INSERT INTO %[1]s (type, n)
SELECT type, count(*) FROM events WHERE NOT ` + w6Bad + ` GROUP BY 1`},
}

// openModel is the membership table of an account projection (W6, W10):
// the accounts opened and not closed.
func openModel(projection, table string) model {
	return model{projection: projection, table: table, ceiling: `
INSERT INTO %[1]s (account_id)
SELECT data->>'account_id' FROM events o
WHERE type = 'AccountOpened'
  AND NOT EXISTS (SELECT 1 FROM events c WHERE c.stream_id = o.stream_id AND c.type = 'AccountClosed')`}
}

// lastRefBalancesModel is the balances table of an account projection
// (W6, W10) with the reference of its last deposit or withdrawal, from the
// events that are not bad.
func lastRefBalancesModel(projection, table, bad string) model {
	return model{projection: projection, table: table, ceiling: `
INSERT INTO %[1]s (account_id, owner, balance, closed, last_ref)
SELECT ` + balanceColumns + `,
  (array_agg(data->>'reference' ORDER BY position DESC) FILTER (WHERE type IN ('Deposited', 'Withdrawn')))[1]
FROM events
WHERE NOT ` + bad + `
GROUP BY 1`}
}

// poisonRun runs poisonSQL on db (when set), then the engine's backfill
// of targets (cfg) until every target accounted for n events, and adds
// its rows to w, the last one with what the engine log says of poison
// and the dead letters against the events that bad selects.
func (b *bench) poisonRun(ctx context.Context, w *Workload, db *database, id, label, cfg string, targets []target, n int64, poisonSQL, bad string) (engineRun, error) {
	if poisonSQL != "" {
		if _, err := db.pool.Exec(ctx, poisonSQL); err != nil {
			return engineRun{}, fmt.Errorf("poison the history: %w", err)
		}
		if err := db.settle(ctx); err != nil {
			return engineRun{}, err
		}
	}
	var want int64
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE `+bad).Scan(&want); err != nil {
		return engineRun{}, err
	}
	w.Load = loadAverage()
	say("%s: engine backfill, %d poison events (load %s) …", id, want, w.Load)
	logPath := filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-engine.log")
	// -profile: the clean runs (no poisonSQL: W6, W10, W10a) run in-process
	// under the CPU profiler, to see where a backfill's time goes (issue 29).
	profiled := b.opts.profile && poisonSQL == ""
	if profiled {
		label += ", in-process, CPU-profiled"
	}
	r, err := b.measure(ctx, db, b.starter(id, cfg, logPath, profiled), targets, n, true)
	if err != nil {
		return engineRun{}, err
	}
	rows := r.rows(label)
	counts, err := countLog(logPath)
	if err != nil {
		return engineRun{}, err
	}
	last := &rows[len(rows)-1]
	last.Poison = &counts
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM pgscribe.dead_letters`).Scan(&last.Poison.DeadLettered); err != nil {
		return engineRun{}, err
	}
	last.Poison.Expected = want
	w.Rows = append(w.Rows, rows...)
	say("%s: engine %s; %+v", id, last.summary(), counts)
	return r, nil
}

// ceilingOf measures the SQL ceiling of every model whose projection
// keep says to, summed, and checks each engine table against its
// ceiling's (w.Checks).
func (b *bench) ceilingOf(ctx context.Context, w *Workload, db *database, id string, models []model, n int64, keep func(model) bool) (refFigures, error) {
	if _, err := db.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return refFigures{}, err
	}
	var c refFigures
	for _, m := range models {
		if !keep(m) {
			continue
		}
		f, err := b.sqlCeiling(ctx, db, m, n)
		if err != nil {
			return refFigures{}, err
		}
		c.events, c.elapsed, c.pgCPU, c.pgOK = f.events, c.elapsed+f.elapsed, c.pgCPU+f.pgCPU, f.pgOK
		diff, err := sameAsCeiling(ctx, db, m)
		if err != nil {
			return refFigures{}, err
		}
		w.Checks = append(w.Checks, Check{Projection: id + " " + m.table, DifferingRows: diff})
		if diff != 0 {
			say("%s: WARNING: %s differs from the SQL ceiling's read model in %d rows", id, m.table, diff)
		}
	}
	return c, nil
}

// w6 runs W6 on a clean history and then on a poisoned one, each in a
// database of its own, each beside its SQL ceiling.
func (b *bench) w6(ctx context.Context, hist history) error {
	n := hist.events()
	w := b.res.workload("W6", "the real shape: mixed ops, shared rows, poison",
		fmt.Sprintf("backfill of %s events over %s streams, one projection of 7 rules (membership key-only insert/delete, "+
			"insert, update + inc + set, update + set, counts by type in 4 rows written by every stream); "+
			"clean, then with 0.5%% commit-time poison (varchar(40) overflow) and 1%% rule poison",
			thousands(n), thousands(hist.streams)), n)
	for _, poison := range []bool{false, true} {
		if err := b.w6Run(ctx, w, hist, poison); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) w6Run(ctx context.Context, w *Workload, hist history, poison bool) error {
	id, label := "W6", "pgscribe, clean"
	if poison {
		id, label = "W6p", "pgscribe, with poison"
	}
	targets := []target{{projection: "w6", version: 1}}
	db, cfg, err := b.setupFilled(ctx, w, id, targets, hist, genTxEvents)
	if err != nil {
		return err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	n := hist.events()
	poisonSQL := ""
	if poison {
		poisonSQL = w6Poison
	}
	r, err := b.poisonRun(ctx, w, db, id, label, cfg, targets, n, poisonSQL, w6Bad)
	if err != nil {
		return err
	}
	if !poison {
		w.Statements = r.statements
	}
	if !b.opts.refs {
		return nil
	}
	c, err := b.ceilingOf(ctx, w, db, id, w6Models, n, func(model) bool { return true })
	if err != nil {
		return err
	}
	ceiling := "SQL ceiling, clean"
	if poison {
		ceiling = "SQL ceiling, with poison"
	}
	w.Rows = append(w.Rows, refRow("sql", ceiling, "w6", c, float64(n)/r.reached["w6"].Seconds()))
	return nil
}

// PoisonCounts is what an engine log says about a run's poison and shared
// rows.
type PoisonCounts struct {
	IsolatedBatches   int64 `json:"isolated_batches"`
	IsolationAttempts int64 `json:"isolation_attempts"`
	DeadlockRetries   int64 `json:"deadlock_retries"` // batches retried after 40P01
	DeadLettered      int64 `json:"dead_lettered"`
	Expected          int64 `json:"expected_dead_letters"`
}

var attemptsField = regexp.MustCompile(`\battempts=(\d+)`)

// countLog reads an engine log (text format) for isolated batches and
// deadlock retries.
func countLog(path string) (PoisonCounts, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return PoisonCounts{}, err
	}
	var c PoisonCounts
	for _, l := range strings.Split(string(b), "\n") {
		switch {
		case strings.Contains(l, `msg="isolated batch"`):
			c.IsolatedBatches++
			if m := attemptsField.FindStringSubmatch(l); m != nil {
				a, _ := strconv.ParseInt(m[1], 10, 64)
				c.IsolationAttempts += a
			}
		case strings.Contains(l, "retrying batch") && strings.Contains(l, "sqlstate=40P01"):
			c.DeadlockRetries++
		}
	}
	return c, nil
}
