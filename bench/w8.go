package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// W8 is `pgscribe verify` on the account workload of issue 34 (the
// projection `account` of bench/projections.toml: 8 rules, a ledger row per
// event) at each size of -w8-events over 1,000 streams, with commit-time
// poison: the engine backfills it, then verify rebuilds it and compares,
// the idle database in between. Verify's wall time is set against the
// backfill's (the engine ÷ this column: at most 1× is as fast as the
// backfill) and its peak RSS is the kernel's (getrusage of the child).

// w8Tables is W8's read model.
const w8Tables = `
CREATE TABLE IF NOT EXISTS acct_open (
  account_id text    PRIMARY KEY,
  seen       boolean NOT NULL DEFAULT true
);
CREATE TABLE IF NOT EXISTS acct_balances (
  account_id text        PRIMARY KEY,
  owner      text        NOT NULL,
  balance    bigint      NOT NULL,
  closed     boolean     NOT NULL,
  last_ref   varchar(40)
);
CREATE TABLE IF NOT EXISTS acct_ledger (
  event_id    uuid        PRIMARY KEY,
  account_id  text        NOT NULL,
  type        text        NOT NULL,
  amount      bigint      NOT NULL,
  occurred_at timestamptz NOT NULL
);
CREATE TABLE IF NOT EXISTS acct_summary (
  account_id text   PRIMARY KEY,
  last_type  text   NOT NULL,
  events     bigint NOT NULL
);
CREATE TABLE IF NOT EXISTS acct_type_counts (
  type text   PRIMARY KEY,
  n    bigint NOT NULL
);`

// w8HotTables are the tables of W8 whose rows every batch updates: the
// account's per-stream rows and the engine's cursors.
var w8HotTables = []string{"acct_balances", "acct_summary", "pgscribe.cursors"}

// w8Streams is the number of accounts of W8's histories (the issue's).
const w8Streams = 1000

func (b *bench) w8(ctx context.Context) error {
	w := b.res.workload("W8", "verify on the account workload: memory and time against the backfill",
		fmt.Sprintf("the projection `account` (8 rules: key-only membership insert and delete, a ledger row per event keyed by "+
			"the event id, balances with insert, update + inc + set and update + set, a per-account upsert, a fail rule) over "+
			"%s streams with %d in 1,000 deposits and withdrawals commit-time poison; for each size, the engine's backfill "+
			"(`pgscribe run`, until every event is accounted for), then `pgscribe verify -json` on the idle database after "+
			"a CHECKPOINT; verify's peak RSS is the child's getrusage maximum, its *engine ÷ this* is its wall time over "+
			"the backfill's (at most 1× is as fast as the backfill)", thousands(w8Streams), b.opts.w8Poison), 0)
	for _, n := range b.opts.w8Events {
		if err := b.w8Run(ctx, w, b.opts.scaled(n)); err != nil {
			return err
		}
		if err := b.write(); err != nil {
			return err
		}
	}
	return nil
}

func (b *bench) w8Run(ctx context.Context, w *Workload, n int64) error {
	hist := newHistory(n, w8Streams, w8Streams)
	hist.poison = b.opts.w8Poison
	n = hist.events()
	id := fmt.Sprintf("W8-%d", n)
	targets := []target{{projection: "account", version: 1}}
	db, cfg, err := b.setupFilled(ctx, w, id, targets, hist, genTxEvents)
	if err != nil {
		return err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	w.Events = max(w.Events, n)
	w.Load = loadAverage()
	say("%s: engine backfill of %s events (load %s) …", id, thousands(n), w.Load)
	logPath := filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-engine.log")
	r, err := b.measure(ctx, db, func() (*engineProc, error) { return startBinary(b.opts.bin, cfg, logPath) }, targets, n, true)
	if err != nil {
		return err
	}
	rows := r.rows(fmt.Sprintf("backfill, %s events", thousands(n)))
	w.Rows = append(w.Rows, rows...)
	say("%s: engine %s", id, rows[0].summary())
	sizes, err := db.tableSizes(ctx, n, w8HotTables)
	if err != nil {
		return err
	}
	w.Sizes = append(w.Sizes, sizes...)
	if err := db.settle(ctx); err != nil {
		return err
	}
	v, err := b.verifyRun(ctx, id, cfg, n, rows[0])
	if err != nil {
		return err
	}
	w.Rows = append(w.Rows, v)
	return nil
}

// verifyResult is what W8 reads of `pgscribe verify -json`.
type verifyResult struct {
	Events int64 `json:"events"`
	Drift  int   `json:"drift"`
}

// verifyRun runs `pgscribe verify -json` on the account projection and
// returns its row: wall time, CPU and peak RSS of the process, PostgreSQL's
// CPU, and its time over the backfill's.
func (b *bench) verifyRun(ctx context.Context, id, cfg string, n int64, backfill Row) (Row, error) {
	say("%s: verify (load %s) …", id, loadAverage())
	logPath := filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-verify.log")
	lf, err := os.Create(logPath)
	if err != nil {
		return Row{}, err
	}
	defer lf.Close()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, b.opts.bin, "verify", "-config", cfg, "-projection", "account", "-version", "1", "-json")
	cmd.Stdout, cmd.Stderr = &out, lf
	pg0, pgOK := b.srv.cpu()
	busy0, busyOK := machineBusy()
	start := time.Now()
	runErr := cmd.Run()
	el := time.Since(start)
	pg1, pg1OK := b.srv.cpu()
	busy1, busy1OK := machineBusy()
	if cmd.ProcessState == nil {
		return Row{}, fmt.Errorf("pgscribe verify: %w", runErr)
	}
	var res verifyResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return Row{}, fmt.Errorf("pgscribe verify (%v): read its -json output: %w (log %s)", runErr, err, logPath)
	}
	if runErr != nil || res.Drift != 0 {
		say("%s: WARNING: verify reports %d differences (%v); see %s", id, res.Drift, runErr, logPath)
	}
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	// What else ran meanwhile, as for the engine rows (otherCores).
	other := otherCores(sample{at: start, busy: busy0, bOK: busyOK, pgCPU: pg0, pgOK: pgOK},
		sample{at: start.Add(el), cpu: cpu, busy: busy1, bOK: busy1OK, pgCPU: pg1, pgOK: pg1OK})
	row := Row{Kind: "verify", Label: fmt.Sprintf("verify, %s events (drift: %d)", thousands(res.Events), res.Drift),
		Projection: "account", Events: res.Events, Seconds: el.Seconds(), Rate: float64(res.Events) / el.Seconds(),
		CPUPerEvent: us(cpu) / float64(max(res.Events, 1)), PGCPUPerEvent: -1, OtherCores: other}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		row.PeakRSSMB = float64(ru.Maxrss) / 1024 // KiB on Linux
	}
	if pgOK && pg1OK {
		row.PGCPUPerEvent = us(pg1-pg0) / float64(max(res.Events, 1))
	}
	if backfill.Rate > 0 && row.Rate > 0 {
		row.EngineRatio = backfill.Rate / row.Rate
	}
	say("%s: verify %.1f s, peak RSS %.0f MB, %.2f× the backfill's %.1f s", id, row.Seconds, row.PeakRSSMB, row.EngineRatio, backfill.Seconds)
	return row, nil
}
