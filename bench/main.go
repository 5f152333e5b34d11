// Command bench is what `make bench` runs: it starts its own PostgreSQL
// through the test harness (fsync on), drives the real pgscribe binary
// through backfill, live and WAL catch-up workloads, measures its
// references in the same run (the set-based SQL ceiling, the
// one-transaction-per-event loop and logical decoding alone), and writes
// RESULTS.md, results.json and a chart (results.png, drawn by the nested
// module in chart/).
//
//	go run ./bench -bin bin/pgscribe [-scale 0.1] [-workloads W1,W4] [-rss-5m] [-profile]
//
// Quick runs (any size or workload flag) write to bench/out/ so that they
// never overwrite the published figures in bench/; -out overrides.
package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

// options are the command-line flags.
type options struct {
	bin, configPath, schemaPath  string
	workloads                    []string
	scale                        float64
	events, streams, active      int64
	loopEvents                   int64
	w4Seconds                    float64
	w4Paired                     bool
	w4Wait                       bool
	w4Rates                      []int
	w4Producers                  int
	w4Tick                       time.Duration
	w5TxEvents                   int64
	w7Events                     int64
	w7Counts, w7Live, w7Backfill []int
	w7Rate, w7Repeat             int
	w7Slow                       bool
	w7Rules                      bool
	w7Poison                     int64
	w7SlowMS                     float64
	w8Events                     []int64
	w8Poison                     int64
	w10CleanOnly                 bool
	rss5M, profile, refs         bool
	statements                   bool
	pgMode                       string
	pgSet, engineSet             map[string]string
	out, rawDir, chartDir, goCmd string
	chart                        bool
	baseline                     string
}

var allWorkloads = []string{"W1", "W2", "W3", "W4", "W5", "W6", "W7", "W4P", "W8", "W9", "W10"}

// defaultWorkloads run without -workloads: W8 (verify at 1M and 5M events,
// about a quarter of an hour more) and W9 (gigabytes of big events) only
// when asked for.
var defaultWorkloads = slices.DeleteFunc(slices.Clone(allWorkloads), func(w string) bool { return w == "W8" || w == "W9" })

// presentationFlags may be set without making a run "quick": they do not
// change what is measured.
var presentationFlags = map[string]bool{"bin": true, "config": true, "schema": true, "rss-5m": true,
	"profile": true, "statements": true, "go": true, "chart-dir": true, "chart": true, "raw": true, "out": true,
	"baseline": true}

func main() {
	o, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string) (options, error) {
	o := options{pgSet: map[string]string{}, engineSet: map[string]string{}}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.StringVar(&o.bin, "bin", "bin/pgscribe", "pgscribe binary to run")
	fs.StringVar(&o.configPath, "config", "config.toml.example", "configuration whose projections the workloads run")
	fs.StringVar(&o.schemaPath, "schema", "examples/demo/schema.sql", "read-model tables of those projections")
	workloads := fs.String("workloads", strings.Join(defaultWorkloads, ","), "workloads to run, comma separated (W1…W9, W4P)")
	fs.Float64Var(&o.scale, "scale", 1, "multiplies event counts, the loop slice and W4 durations (0.1 = smoke run)")
	fs.Int64Var(&o.events, "events", 1_000_000, "events of the backfill and catch-up workloads (before -scale)")
	fs.Int64Var(&o.streams, "streams", 10_000, "streams (accounts) the events spread over")
	fs.Int64Var(&o.active, "active-streams", 1_000, "streams whose events interleave at a time in position order")
	fs.Int64Var(&o.loopEvents, "loop-events", 20_000, "events of the per-event loop's slice (before -scale)")
	fs.BoolVar(&o.w4Paired, "w4-paired", true, "after W4's steps, run its rates again with a consumer that only receives attached, to split each event's latency into PostgreSQL's delivery and pgscribe's share")
	fs.BoolVar(&o.w4Wait, "w4-wait", false, "after W4's steps, one more at its first rate with read-your-writes waiters (wait_for_stream, wait_for_lsn), then the CPU of 50 idle waiters (bench/wait.go)")
	fs.Float64Var(&o.w4Seconds, "w4-seconds", 60, "seconds of each W4 load step (before -scale)")
	rates := fs.String("w4-rates", "1000,5000,10000", "W4 producer rates, events/s")
	fs.IntVar(&o.w4Producers, "w4-producers", 4, "W4 producer connections (each commits every -w4-tick)")
	fs.DurationVar(&o.w4Tick, "w4-tick", 10*time.Millisecond, "W4: each producer commits what is due every tick")
	fs.Int64Var(&o.w5TxEvents, "w5-tx-events", 100, "W5: events per appended transaction while the engine is stopped")
	fs.Int64Var(&o.w7Events, "w7-events", 200_000, "W7: events appended while the engine is stopped, caught up by N projections (before -scale)")
	fs.IntVar(&o.w7Repeat, "w7-repeat", 3, "W7: runs of each catch-up and live N (in rounds of every N); each N's figures are its median run")
	w7Counts := fs.String("w7-counts", "1,4,8", "W7: the numbers of projections whose WAL catch-up is measured")
	w7Live := fs.String("w7-live", "1,8", "W7: the numbers of projections whose live latency is measured")
	w7Backfill := fs.String("w7-backfill", "1,8", "W7: the numbers of projections whose backfill of the same events (appended before the first start) is measured; \"\" for none")
	fs.IntVar(&o.w7Rate, "w7-rate", 1000, "W7: producer rate of the live step, events/s")
	fs.BoolVar(&o.w7Slow, "w7-slow", true, "W7: when 8 is in -w7-live, one more live step of 8 projections of which one is slow (its sql rule sleeps in PostgreSQL per event)")
	fs.Int64Var(&o.w7Poison, "w7-poison", 5, "W7: per 1,000 deposits and withdrawals appended for the catch-up, how many carry a reference too long for the read models' varchar(40) (commit-time poison, dead-lettered by every projection)")
	fs.BoolVar(&o.w7Rules, "w7-rules", true, "W7: for each N > 1 in -w7-live, also one projection with N rules, one into each of the N tables: all N written in one transaction per batch, the reference for what N projections' own transactions cost")
	fs.Float64Var(&o.w7SlowMS, "w7-slow-ms", 1, "W7: how long the slow projection sleeps in PostgreSQL per event, mean ms (pg_sleep waits whole ms: a fraction is a share of the events, by position, that sleep one ms more)")
	w8Events := fs.String("w8-events", "1000000,5000000", "W8: sizes of the account workload whose backfill and verify are measured (before -scale)")
	fs.BoolVar(&o.w10CleanOnly, "w10-clean", false, "W10: only the clean pair (no poison run, no account-alone run), e.g. at -scale 5 and 25 for issue 35's sizes")
	fs.Int64Var(&o.w8Poison, "w8-poison", 3, "W8: per 1,000 deposits and withdrawals, how many carry a reference too long for acct_balances.last_ref (commit-time poison)")
	fs.BoolVar(&o.refs, "refs", true, "measure the references: SQL ceiling, per-event loop, W4's decode floor (false: engine only, for quick experiments)")
	fs.BoolVar(&o.statements, "statements", false, "load pg_stat_statements and report the engine's heaviest statements per workload")
	fs.BoolVar(&o.rss5M, "rss-5m", false, "also backfill 5M events (before -scale) to compare peak RSS with 1M")
	fs.BoolVar(&o.profile, "profile", false, "rerun W1 and W2 in-process with the CPU profiler; top functions go to RESULTS.md; W7's backfill and the clean backfills of W6 and W10 run in-process under it (raw/cpu-w7b<N>.pprof, cpu-w6.pprof, cpu-w10.pprof, cpu-w10a.pprof)")
	fs.StringVar(&o.pgMode, "pg-mode", "local", "harness mode: local (this machine's binaries), docker, external, or \"\" for the harness's choice")
	fs.Func("pg-set", "PostgreSQL setting name=value (repeatable), on top of the bench's", keyValue(o.pgSet))
	fs.Func("engine-set", "[engine] key=value of the generated configuration (repeatable)", keyValue(o.engineSet))
	fs.StringVar(&o.out, "out", "", "directory of RESULTS.md, results.json and results.png (default bench, or bench/out for quick runs)")
	fs.StringVar(&o.rawDir, "raw", "bench/out", "directory of engine logs, configurations and CPU profiles")
	fs.StringVar(&o.chartDir, "chart-dir", "bench/chart", "the chart generator's module")
	fs.BoolVar(&o.chart, "chart", true, "draw results.png")
	fs.StringVar(&o.goCmd, "go", "go", "go command (for the chart and `go tool pprof`)")
	fs.StringVar(&o.baseline, "baseline", "", "results.json of an earlier run (a file, or a git object such as COMMIT:bench/results.json): RESULTS.md compares the headline figures")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, w := range strings.Split(*workloads, ",") {
		w = strings.ToUpper(strings.TrimSpace(w))
		if !slices.Contains(allWorkloads, w) {
			return o, fmt.Errorf("-workloads: unknown workload %q (want some of %s)", w, strings.Join(allWorkloads, ","))
		}
		if !slices.Contains(o.workloads, w) {
			o.workloads = append(o.workloads, w)
		}
	}
	for _, r := range strings.Split(*rates, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(r), &n); err != nil || n <= 0 {
			return o, fmt.Errorf("-w4-rates: %q is not a positive rate", r)
		}
		o.w4Rates = append(o.w4Rates, n)
	}
	var err error
	if o.w7Repeat < 1 {
		return o, fmt.Errorf("-w7-repeat must be at least 1")
	}
	if o.w7Counts, err = positiveInts("w7-counts", *w7Counts); err != nil {
		return o, err
	}
	if o.w7Backfill, err = positiveInts("w7-backfill", *w7Backfill); err != nil {
		return o, err
	}
	if o.w7Live, err = positiveInts("w7-live", *w7Live); err != nil {
		return o, err
	}
	for _, f := range strings.Split(*w8Events, ",") {
		var n int64
		if _, err := fmt.Sscan(strings.TrimSpace(f), &n); err != nil || n <= 0 {
			return o, fmt.Errorf("-w8-events: %q is not a positive number of events", f)
		}
		o.w8Events = append(o.w8Events, n)
	}
	if o.w7Rate <= 0 {
		return o, fmt.Errorf("-w7-rate must be positive")
	}
	if o.w7SlowMS <= 0 {
		return o, fmt.Errorf("-w7-slow-ms must be positive")
	}
	if o.scale <= 0 {
		return o, fmt.Errorf("-scale must be positive")
	}
	quick := false
	fs.Visit(func(f *flag.Flag) { quick = quick || !presentationFlags[f.Name] })
	if o.out == "" {
		o.out = "bench"
		if quick {
			o.out = o.rawDir
		}
	}
	return o, nil
}

func keyValue(m map[string]string) func(string) error {
	return func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("want name=value, got %q", s)
		}
		m[k] = v
		return nil
	}
}

// scaled applies -scale to a count, keeping at least one.
func (o options) scaled(n int64) int64 { return max(int64(float64(n)*o.scale), 1) }

func (o options) has(w string) bool { return slices.Contains(o.workloads, w) }

// bench is one run.
type bench struct {
	opts options
	srv  *server
	tmpl *configTemplate
	res  *Results
	base *Results // with -baseline
}

func run(ctx context.Context, o options) error {
	for _, d := range []string{o.out, o.rawDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if _, err := os.Stat(o.bin); err != nil {
		return fmt.Errorf("engine binary: %w (run `make build`)", err)
	}
	tmpl, err := loadTemplate(o.configPath)
	if err != nil {
		return err
	}
	b := &bench{opts: o, tmpl: tmpl, res: newResults(o)}
	if o.baseline != "" {
		if b.base, err = loadBaseline(o.baseline); err != nil {
			return err
		}
		b.res.Baseline = &Baseline{File: o.baseline, Commit: b.base.Commit, Date: b.base.Date,
			LoadBefore: b.base.Machine.LoadBefore, LoadAfter: b.base.Machine.LoadAfter}
	}
	say("load average before the run: %s", b.res.Machine.LoadBefore)
	loads := sampleLoad(ctx, 5*time.Second)
	say("starting PostgreSQL through the test harness (mode %q, fsync on) …", o.pgMode)
	pgSet := o.pgSet
	if o.statements {
		pgSet = maps.Clone(o.pgSet)
		pgSet["shared_preload_libraries"] = "pg_stat_statements"
	}
	srv, err := startServer(ctx, o.pgMode, pgSet, func(f string, a ...any) {})
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop(context.WithoutCancel(ctx)) }()
	b.srv = srv
	b.res.setServer(srv)
	say("PostgreSQL %s (%s mode) ready", srv.version, srv.Mode())
	if o.refs {
		dir := os.TempDir()
		pgdata := srv.dataDirectory(ctx)
		if pgdata != "" && srv.Mode() == pgtest.ModeLocal {
			dir = filepath.Dir(pgdata)
		}
		say("timing 8 KiB write + fdatasync in %s for 10s …", dir)
		d, err := probeDisk(ctx, dir, 10*time.Second)
		if err != nil {
			return err
		}
		d.SameDevice = pgdata != "" && srv.Mode() == pgtest.ModeLocal && sameDevice(dir, pgdata)
		b.res.Machine.Disk = d
		say("disk: %s", d.line())
	}

	hist := newHistory(o.scaled(o.events), o.streams, o.active)
	steps := []struct {
		id  string
		run func(context.Context) error
	}{
		{"W1", func(ctx context.Context) error {
			return b.backfill(ctx, "W1", "balances: upsert + inc, one projection", []model{balancesModel}, hist, o.profile)
		}},
		{"W2", func(ctx context.Context) error {
			return b.backfill(ctx, "W2", "ledger: one insert per event (activity)", []model{activityModel}, hist, o.profile)
		}},
		{"W3", func(ctx context.Context) error {
			return b.backfill(ctx, "W3", "three projections over the same events", []model{balancesModel, activityModel, statsModel}, hist, false)
		}},
		{"W4", b.live},
		{"W5", func(ctx context.Context) error { return b.catchUp(ctx, hist) }},
		{"W6", func(ctx context.Context) error { return b.w6(ctx, hist) }},
		{"W7", b.w7},
		{"W4P", b.livePoison},
		{"W8", b.w8},
		{"W9", b.w9},
		{"W10", b.w10},
	}
	for _, s := range steps {
		if !o.has(s.id) {
			continue
		}
		if err := s.run(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.id, err)
		}
		if err := b.write(); err != nil { // keep what is done if a later step fails
			return err
		}
	}
	if o.rss5M {
		if err := b.memory(ctx, newHistory(o.scaled(5*o.events), o.streams, o.active)); err != nil {
			return fmt.Errorf("5M backfill: %w", err)
		}
	}
	b.res.Machine.LoadAfter = loadAverage()
	b.res.Machine.LoadDuring = loads()
	if err := b.write(); err != nil {
		return err
	}
	if o.chart {
		if err := b.drawChart(ctx); err != nil {
			say("chart not drawn: %v", err)
		}
	}
	say("wrote %s", filepath.Join(o.out, "RESULTS.md"))
	return nil
}

func say(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench %s: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}
