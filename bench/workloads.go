package main

import (
	"bytes"
	"context"
	"fmt"
	"github.com/pgscribe/pgscribe/config"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// genTxEvents is the transaction size of generated histories that the
// engine reads from a snapshot (where transaction boundaries do not matter).
const genTxEvents = 100_000

func targetsOf(models []model, version int) []target {
	out := make([]target, len(models))
	for i, m := range models {
		out[i] = target{projection: m.projection, version: version}
	}
	return out
}

// writeConfig renders the configuration of targets against db.
func (b *bench) writeConfig(id string, db *database, targets []target) (string, error) {
	text, err := b.tmpl.render(db.dsn, targets, b.opts.engineSet)
	if err != nil {
		return "", err
	}
	path := filepath.Join(b.opts.rawDir, fmt.Sprintf("%s-v%d.toml", strings.ToLower(id), targets[0].version))
	return path, os.WriteFile(path, []byte(text), 0o600)
}

// setup creates a workload's database: engine schema and events table
// (`pgscribe migrate -events-table`, the real binary), and the read models.
func (b *bench) setup(ctx context.Context, id string, targets []target) (*database, string, error) {
	db, err := b.srv.newDatabase(ctx, "bench_"+strings.ToLower(id))
	if err != nil {
		return nil, "", err
	}
	fail := func(err error) (*database, string, error) {
		b.srv.drop(context.WithoutCancel(ctx), db)
		return nil, "", err
	}
	cfg, err := b.writeConfig(id, db, targets)
	if err != nil {
		return fail(err)
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, b.opts.bin, "migrate", "-config", cfg, "-events-table")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fail(fmt.Errorf("pgscribe migrate: %w\n%s", err, out.String()))
	}
	ddl, err := os.ReadFile(b.opts.schemaPath)
	if err != nil {
		return fail(err)
	}
	if _, err := db.pool.Exec(ctx, string(ddl)+statsTable+w6Tables+w8Tables+activityRefTable+w7DDL(targets)); err != nil {
		return fail(fmt.Errorf("create read models: %w", err))
	}
	if b.opts.statements {
		if _, err := db.pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
			return fail(err)
		}
	}
	return db, cfg, nil
}

// engineRun is a measured engine run, from its start until every target
// accounted for every event.
type engineRun struct {
	events     int64
	targets    []target
	at         sample                   // when the last target caught up
	cpu        time.Duration            // engine CPU over the run
	otherCores float64                  // cores other processes used over the run (otherCores)
	reached    map[string]time.Duration // per projection, since the start
	pgCPU      time.Duration            // PostgreSQL's CPU over the run
	pgOK       bool
	logs       map[string]backfillLog
	inProc     bool
	duration   time.Duration // start to the last target caught up
	statements []Statement   // with -statements: PostgreSQL's heaviest statements of the run
	oldestXact time.Duration // the longest an engine transaction was seen open (sampled every second)
}

// measure starts an engine and waits until every target accounted for n
// events (and, when backfilling, finished its backfill), then stops it.
func (b *bench) measure(ctx context.Context, db *database, start func() (*engineProc, error), targets []target, n int64, backfilling bool) (engineRun, error) {
	if err := b.resetStatements(ctx, db); err != nil {
		return engineRun{}, err
	}
	pg0, pgOK := b.srv.cpu()
	busy0, busyOK := machineBusy()
	p, err := start()
	if err != nil {
		return engineRun{}, err
	}
	// Where the run started: the engine's CPU so far is nil for a new
	// process, the bench's own for an in-process run.
	s0 := sample{at: p.started, pgCPU: pg0, pgOK: pgOK, busy: busy0, bOK: busyOK}
	s0.cpu, _ = processCPU(p.pid)
	oldest := sampleOldestXact(ctx, db)
	at, reached, err := b.waitAccounted(ctx, db, p, targets, n, backfilling)
	p.stopProfile()
	if err != nil {
		_ = p.stop()
		return engineRun{}, err
	}
	r := engineRun{events: n, targets: targets, at: at, cpu: at.cpu - s0.cpu, otherCores: otherCores(s0, at),
		reached: reached, pgOK: pgOK && at.pgOK, logs: map[string]backfillLog{}, inProc: p.inProcess,
		duration: at.at.Sub(p.started), oldestXact: oldest()}
	if r.pgOK {
		r.pgCPU = at.pgCPU - pg0
	}
	for _, t := range targets {
		if l, ok := p.log.backfillOf(t.projection); ok {
			r.logs[t.projection] = l
		}
	}
	if err := p.stop(); err != nil {
		return r, fmt.Errorf("engine stop: %w", err)
	}
	r.statements, err = b.topStatements(ctx, db)
	return r, err
}

// firstStartEmpty starts the engine on the empty events table, waits until
// every target is live, and stops it: the slots exist, what is appended
// next is a WAL catch-up.
func (b *bench) firstStartEmpty(ctx context.Context, db *database, cfg, logPath string, targets []target) error {
	p, err := startBinary(b.opts.bin, cfg, logPath)
	if err != nil {
		return err
	}
	if err := b.waitLive(ctx, db, p, targets); err != nil {
		_ = p.stop()
		return err
	}
	if err := p.stop(); err != nil {
		return fmt.Errorf("stop after first start: %w", err)
	}
	return nil
}

// sampleOldestXact samples, every second until the returned function is
// called, how long the oldest open transaction of the database's client
// sessions but the bench's own (walsenders included; autovacuum's workers,
// which also open transactions on the database, not) has been open, and
// returns the longest seen: what the engine holds the cluster's xmin
// horizon back with while it runs.
func sampleOldestXact(ctx context.Context, db *database) func() time.Duration {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan time.Duration, 1)
	go func() {
		var worst time.Duration
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			var s float64
			err := db.pool.QueryRow(ctx, `SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0)::float8
FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
  AND backend_type IN ('client backend', 'walsender') AND application_name <> $1`, benchApplication).Scan(&s)
			if err == nil {
				worst = max(worst, time.Duration(s*float64(time.Second)))
			}
			select {
			case <-ctx.Done():
				done <- worst
				return
			case <-t.C:
			}
		}
	}()
	return func() time.Duration {
		cancel()
		return <-done
	}
}

// engineRows turns a run into result rows: one per projection, plus one
// for all of them when there are several.
func (r engineRun) rows(label string) []Row {
	k := int64(len(r.targets))
	per := float64(r.events * k)
	base := Row{Kind: "engine", Events: r.events, CPUPerEvent: us(r.cpu) / per, PGCPUPerEvent: -1,
		PeakRSSMB: mb(r.at.hwm), InProcess: r.inProc, OtherCores: r.otherCores, OldestXactS: r.oldestXact.Seconds()}
	if r.pgOK {
		base.PGCPUPerEvent = us(r.pgCPU) / per
	}
	var rows []Row
	for _, t := range r.targets {
		row := base
		row.Label, row.Projection = label+" "+t.projection, t.projection
		row.Seconds = r.reached[t.projection].Seconds()
		row.Rate = float64(r.events) / row.Seconds
		row.LogRate = r.logs[t.projection].rate
		rows = append(rows, row)
	}
	if k > 1 {
		row := base
		row.Label, row.Projection = fmt.Sprintf("%s, all %d projections", label, k), "*"
		row.Events = r.events * k
		row.Seconds = r.duration.Seconds()
		row.Rate = per / row.Seconds
		rows = append(rows, row)
	}
	return rows
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
func mb(b int64) float64         { return float64(b) / (1 << 20) }

// references measures the SQL ceiling and the per-event loop of each
// model, after the engine run (so that its slot never has to decode their
// writes), checks the engine's read model against the ceiling's, and adds
// the rows with their ratio to the engine.
func (b *bench) references(ctx context.Context, w *Workload, db *database, models []model, events int64) error {
	if !b.opts.refs {
		return nil
	}
	for _, m := range models {
		engineRate := w.engineRate(m.projection)
		if _, err := db.pool.Exec(ctx, "CHECKPOINT"); err != nil {
			return err
		}
		say("%s: SQL ceiling of %s …", w.ID, m.projection)
		c, err := b.sqlCeiling(ctx, db, m, events)
		if err != nil {
			return err
		}
		w.Rows = append(w.Rows, refRow("sql", "SQL ceiling "+m.projection, m.projection, c, engineRate))
		diff, err := sameAsCeiling(ctx, db, m)
		if err != nil {
			return err
		}
		w.Checks = append(w.Checks, Check{Projection: m.projection, DifferingRows: diff})
		if diff != 0 {
			say("%s: WARNING: %s differs from the SQL ceiling's read model in %d rows", w.ID, m.table, diff)
		}
		n := min(b.opts.scaled(b.opts.loopEvents), events)
		say("%s: per-event loop of %s on %d events …", w.ID, m.projection, n)
		l, err := b.perEventLoop(ctx, db, m, n)
		if err != nil {
			return err
		}
		w.Rows = append(w.Rows, refRow("loop", "per-event loop "+m.projection, m.projection, l, engineRate))
	}
	return nil
}

func refRow(kind, label, projection string, r refFigures, engineRate float64) Row {
	row := Row{Kind: kind, Label: label, Projection: projection, Events: r.events, Seconds: r.elapsed.Seconds(),
		Rate: r.rate(), CPUPerEvent: -1, PGCPUPerEvent: -1, PeakRSSMB: -1, OtherCores: -1}
	if r.pgOK {
		row.PGCPUPerEvent = us(r.pgCPU) / float64(r.events)
	}
	if row.Rate > 0 {
		row.EngineRatio = engineRate / row.Rate
	}
	return row
}

// backfill is W1–W3: a history in the table, then the engine's first start
// backfills it from its slot's snapshot.
func (b *bench) backfill(ctx context.Context, id, title string, models []model, hist history, profile bool) error {
	targets := targetsOf(models, 1)
	db, cfg, err := b.setup(ctx, id, targets)
	if err != nil {
		return err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	n := hist.events()
	w := b.res.workload(id, title, fmt.Sprintf("backfill of %s events over %s streams (%d interleaved at a time), %d projection(s)",
		thousands(n), thousands(hist.streams), hist.active, len(models)), n)
	if err := b.fill(ctx, w, db, hist, genTxEvents); err != nil {
		return err
	}
	w.Load = loadAverage()
	say("%s: engine backfill (load %s) …", id, w.Load)
	logPath := filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-engine.log")
	r, err := b.measure(ctx, db, func() (*engineProc, error) { return startBinary(b.opts.bin, cfg, logPath) }, targets, n, true)
	if err != nil {
		return err
	}
	w.Rows = append(w.Rows, r.rows("pgscribe")...)
	w.Statements = r.statements
	say("%s: engine %s", id, w.Rows[len(w.Rows)-1].summary())
	if id == "W1" {
		b.res.Memory = append(b.res.Memory, memoryRow("balances (W1)", r))
	}
	if err := b.references(ctx, w, db, models, n); err != nil {
		return err
	}
	if profile {
		return b.profileRun(ctx, w, db, models, n)
	}
	return nil
}

// fill generates the history and settles the database.
func (b *bench) fill(ctx context.Context, w *Workload, db *database, hist history, txEvents int64) error {
	say("%s: generating %s events (%d per transaction) …", w.ID, thousands(hist.events()), txEvents)
	start := time.Now()
	last := time.Now()
	err := hist.generate(ctx, db, txEvents, func(done int64) {
		if time.Since(last) > 10*time.Second {
			last = time.Now()
			say("%s: … %s events", w.ID, thousands(done))
		}
	})
	if err != nil {
		return err
	}
	if err := db.settle(ctx); err != nil {
		return err
	}
	w.GenerateSeconds = time.Since(start).Seconds()
	say("%s: generated in %.1f s", w.ID, w.GenerateSeconds)
	return nil
}

// setupFilled is setup, then fill: the workload's database, holding its
// history. The caller drops it.
func (b *bench) setupFilled(ctx context.Context, w *Workload, id string, targets []target, hist history, txEvents int64) (*database, string, error) {
	db, cfg, err := b.setup(ctx, id, targets)
	if err != nil {
		return nil, "", err
	}
	if err := b.fill(ctx, w, db, hist, txEvents); err != nil {
		b.srv.drop(context.WithoutCancel(ctx), db)
		return nil, "", err
	}
	return db, cfg, nil
}

// profileRun rebuilds the same read models as version 2 with the engine
// running inside this process under the CPU profiler.
func (b *bench) profileRun(ctx context.Context, w *Workload, db *database, models []model, n int64) error {
	for _, m := range models {
		if _, err := db.pool.Exec(ctx, "TRUNCATE "+pgx.Identifier{m.table}.Sanitize()); err != nil {
			return err
		}
	}
	// The first run's slot is not needed any more; drop it so it retains no WAL.
	if _, err := db.pool.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
		WHERE database = current_database() AND NOT active`); err != nil {
		return err
	}
	if _, err := db.pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return err
	}
	targets := targetsOf(models, 2)
	cfg, err := b.writeConfig(w.ID, db, targets)
	if err != nil {
		return err
	}
	id := strings.ToLower(w.ID)
	prof := filepath.Join(b.opts.rawDir, "cpu-"+id+".pprof")
	logPath := filepath.Join(b.opts.rawDir, id+"-inprocess.log")
	say("%s: in-process run under the CPU profiler …", w.ID)
	r, err := b.measure(ctx, db, func() (*engineProc, error) { return startInProcess(cfg, logPath, prof) }, targets, n, true)
	if err != nil {
		return err
	}
	rows := r.rows("pgscribe in-process, CPU-profiled,")
	w.Rows = append(w.Rows, rows...)
	p := Profile{Workload: w.ID, File: prof, Rate: rows[0].Rate}
	if p.Flat, err = b.pprofTop(ctx, prof, false); err != nil {
		return err
	}
	if p.Cum, err = b.pprofTop(ctx, prof, true); err != nil {
		return err
	}
	b.res.Profiles = append(b.res.Profiles, p)
	return nil
}

// pprofTop returns `go tool pprof -top` of a profile: the 20 heaviest
// functions by flat (or cumulative) time.
func (b *bench) pprofTop(ctx context.Context, path string, cum bool) (string, error) {
	args := []string{"tool", "pprof", "-top", "-nodecount=20"}
	if cum {
		args = append(args, "-cum")
	}
	out, err := exec.CommandContext(ctx, b.opts.goCmd, append(args, path)...).Output()
	if err != nil {
		return "", fmt.Errorf("go tool pprof %s: %w", path, err)
	}
	// Drop the header lines that name the file and build, keep the rest.
	var keep []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if !strings.HasPrefix(l, "File:") && !strings.HasPrefix(l, "Build ID:") && !strings.HasPrefix(l, "Type:") && !strings.HasPrefix(l, "Time:") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n"), nil
}

// catchUp is W5: the engine went live and stopped; events were appended
// meanwhile; on restart it streams the backlog from its slot.
func (b *bench) catchUp(ctx context.Context, hist history) error {
	models := []model{balancesModel}
	targets := targetsOf(models, 1)
	db, cfg, err := b.setup(ctx, "W5", targets)
	if err != nil {
		return err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	n := hist.events()
	w := b.res.workload("W5", "WAL catch-up: balances streamed from the slot after a stop",
		fmt.Sprintf("engine live on an empty table, stopped; %s events appended in transactions of %d; engine restarted",
			thousands(n), b.opts.w5TxEvents), n)
	if err := b.firstStartEmpty(ctx, db, cfg, filepath.Join(b.opts.rawDir, "w5-first-start.log"), targets); err != nil {
		return err
	}
	// The decode-only reference's slot must exist before the backlog is
	// written; it streams only after the engine's run.
	var slot *floorSlot
	if b.opts.refs {
		if slot, err = createFloorSlot(ctx, db.dsn, "pgscribe_bench_decode"); err != nil {
			return err
		}
		defer func() { slot.conn.Close(context.WithoutCancel(ctx)) }()
	}
	if err := b.fill(ctx, w, db, hist, b.opts.w5TxEvents); err != nil {
		return err
	}
	w.Load = loadAverage()
	say("W5: engine restart and catch-up (load %s) …", w.Load)
	logPath := filepath.Join(b.opts.rawDir, "w5-engine.log")
	r, err := b.measure(ctx, db, func() (*engineProc, error) { return startBinary(b.opts.bin, cfg, logPath) }, targets, n, false)
	if err != nil {
		return err
	}
	w.Rows = append(w.Rows, r.rows("pgscribe")...)
	w.Statements = r.statements
	say("W5: engine %s", w.Rows[0].summary())
	if slot != nil {
		c, err := config.Load(cfg)
		if err != nil {
			return err
		}
		if err := b.decodeOnly(ctx, w, slot, c.Source.Publication, n, w.Rows[0].Rate); err != nil {
			return err
		}
	}
	return b.references(ctx, w, db, models, n)
}

// memory backfills a larger history of W1's shape, engine only, to compare
// its peak RSS with W1's.
func (b *bench) memory(ctx context.Context, hist history) error {
	targets := targetsOf([]model{balancesModel}, 1)
	w := &Workload{ID: "M5"}
	db, cfg, err := b.setupFilled(ctx, w, "M5", targets, hist, genTxEvents)
	if err != nil {
		return err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	say("M5: engine backfill of %s events (load %s) …", thousands(hist.events()), loadAverage())
	logPath := filepath.Join(b.opts.rawDir, "m5-engine.log")
	r, err := b.measure(ctx, db, func() (*engineProc, error) { return startBinary(b.opts.bin, cfg, logPath) }, targets, hist.events(), true)
	if err != nil {
		return err
	}
	m := memoryRow("balances (-rss-5m)", r)
	b.res.Memory = append(b.res.Memory, m)
	say("M5: %.0f events/s, peak RSS %.1f MB", m.Rate, m.PeakRSSMB)
	return nil
}

func memoryRow(label string, r engineRun) MemoryRow {
	return MemoryRow{Label: label, Events: r.events, Rate: float64(r.events) / r.duration.Seconds(),
		PeakRSSMB: mb(r.at.hwm), Load: loadAverage()}
}

// resetStatements clears pg_stat_statements (with -statements) so that the
// next figures cover one engine run.
func (b *bench) resetStatements(ctx context.Context, db *database) error {
	if !b.opts.statements {
		return nil
	}
	_, err := db.pool.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err
}

// topStatements returns the heaviest statements run in db since the last
// reset, by total execution time (with -statements; nil otherwise). The
// bench's own polling shows up too, and is labelled as such by its text.
func (b *bench) topStatements(ctx context.Context, db *database) ([]Statement, error) {
	if !b.opts.statements {
		return nil, nil
	}
	rows, err := db.pool.Query(ctx, `SELECT calls, total_exec_time, rows, query FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
		ORDER BY total_exec_time DESC LIMIT 12`)
	if err != nil {
		return nil, fmt.Errorf("pg_stat_statements: %w", err)
	}
	defer rows.Close()
	var out []Statement
	for rows.Next() {
		var s Statement
		if err := rows.Scan(&s.Calls, &s.TotalMS, &s.Rows, &s.Query); err != nil {
			return nil, err
		}
		s.Query = strings.Join(strings.Fields(s.Query), " ")
		out = append(out, s)
	}
	return out, rows.Err()
}
