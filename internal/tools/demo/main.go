// Command demo is what `make demo` runs: a throwaway PostgreSQL through the
// test harness, the engine schema and demo read models, a background writer
// appending account events, and pgscribe itself on config.toml.example,
// with the read model printed as it changes. Ctrl-C (or SIGTERM) stops the
// engine gracefully, once, and removes the server; the demo exits 0 when
// the engine did.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/internal/pgtest"
)

func main() {
	bin := flag.String("bin", "bin/pgscribe", "pgscribe binary")
	cfgPath := flag.String("config", "config.toml.example", "configuration for the engine")
	schema := flag.String("schema", "examples/demo/schema.sql", "read-model tables")
	rate := flag.Int("rate", 50, "events appended per second once the backfill is done (0 = none)")
	duration := flag.Duration("duration", 0, "stop after this long (0 = until Ctrl-C)")
	flag.Parse()
	if err := run(*bin, *cfgPath, *schema, *rate, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(bin, cfgPath, schemaPath string, rate int, duration time.Duration) error {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	// The demo handles SIGINT and SIGTERM itself and passes each one on to
	// the engine once: the engine runs in a process group of its own, so a
	// Ctrl-C (sent to the terminal's whole foreground group) or a `timeout`
	// (which signals its whole group too) does not reach it a second time,
	// which it would take for "stop now".
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stopSig os.Signal = syscall.SIGTERM // what a -duration stop sends, like systemd
	var stopAt time.Time
	go func() {
		select {
		case stopSig = <-sigs:
		case <-ctx.Done():
			return
		case <-after(duration):
		}
		stopAt = time.Now()
		cancel()
	}()

	say("starting a throwaway PostgreSQL (wal_level=logical, track_commit_timestamp=on) through the test harness …")
	// The harness explains its choice of mode (why local binaries rather
	// than Docker, for one); the demo passes that on.
	srv, err := pgtest.Start(ctx, pgtest.Options{Logf: func(f string, a ...any) { say(f, a...) }})
	if err != nil {
		return err
	}
	defer func() {
		say("removing the throwaway PostgreSQL")
		if err := srv.Stop(context.Background()); err != nil {
			say("%v", err)
		}
	}()
	dsn, err := srv.CreateDatabase(ctx, "pgscribe_demo")
	if err != nil {
		return err
	}
	say("PostgreSQL (%s mode) ready: database pgscribe_demo", srv.Mode())
	env := append(os.Environ(), "PGSCRIBE_DATABASE_URL="+dsn)
	// A throwaway token turns the console's actions on for this demo only
	// (config.toml.example sets none: its console is read-only).
	token := os.Getenv(config.EnvConsoleToken)
	if token == "" {
		token = fmt.Sprintf("demo-%08x", rand.Uint32())
		env = append(env, config.EnvConsoleToken+"="+token)
	}

	say("$ pgscribe migrate -config %s -events-table", cfgPath)
	migrate := exec.CommandContext(ctx, bin, "migrate", "-config", cfgPath, "-events-table")
	migrate.Env, migrate.Stdout, migrate.Stderr = env, os.Stdout, os.Stderr
	if err := migrate.Run(); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	ddl, err := os.ReadFile(schemaPath)
	if err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, string(ddl)); err != nil {
		return fmt.Errorf("create read models: %w", err)
	}
	say("read-model tables created from %s", schemaPath)

	// Some history before the engine starts, so its first start backfills.
	w := &writer{pool: pool, versions: map[string]int64{}}
	for w.appended < historyEvents {
		if err := w.append(ctx); err != nil {
			return err
		}
	}
	say("appended %d events before the first start; the engine backfills them from its slot's snapshot", w.appended)
	say("every %dth event is poison on purpose: a Withdrawn of amount 0, which the balances rule %q (op = \"fail\") "+
		"dead-letters, so the dead-letter count climbs by one per %d events (pgscribe deadletters list shows them)",
		poisonEvery, "non_positive_amount", poisonEvery)

	say("$ pgscribe run -config %s", cfgPath)
	engine := exec.Command(bin, "run", "-config", cfgPath)
	engine.Env = env
	engine.SysProcAttr = engineProcAttr()
	logs, err := engine.StderrPipe()
	if err != nil {
		return err
	}
	if err := engine.Start(); err != nil {
		return err
	}
	say("engine started (pid %d)", engine.Process.Pid)
	logged := make(chan struct{})
	go func() { defer close(logged); prefix(logs, "  engine | ") }()
	exited := make(chan error, 1)
	go func() {
		<-logged // Wait closes the pipe: read it to the end first
		exited <- engine.Wait()
	}()

	engineErr := func() error {
		if err := waitBackfilled(ctx, pool, cfg, exited); err != nil {
			return err
		}
		if cfg.Metrics.Console && cfg.Metrics.Enabled() {
			say("console at http://%s/ — watch the projections, open a dead letter and retry it with the token %s", cfg.Metrics.Listen, token)
		}
		if rate > 0 {
			go w.live(ctx, rate)
			say("appending ~%d events/s; metrics at http://%s/metrics — Ctrl-C to stop", rate, cfg.Metrics.Listen)
		} else {
			say("appending nothing more (-rate 0); metrics at http://%s/metrics — Ctrl-C to stop", cfg.Metrics.Listen)
		}
		return whileRunning(ctx, 3*time.Second, exited, func() bool {
			show(ctx, pool, cfg)
			return false
		})
	}()
	if engineErr != nil {
		_ = engine.Process.Signal(syscall.SIGTERM)
		<-exited
		return engineErr
	}
	// stopSig and stopAt were set before cancel: ctx.Done orders the reads.
	if err := stopEngine(engine.Process, stopSig, stopAt, sigs, exited, cfg.Engine.ShutdownTimeout); err != nil {
		return err
	}
	// What the engine left, as an operator sees it.
	say("$ pgscribe status -config %s", cfgPath)
	sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer scancel()
	status := exec.CommandContext(sctx, bin, "status", "-config", cfgPath)
	status.Env, status.Stdout, status.Stderr = env, os.Stdout, os.Stderr
	if err := status.Run(); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	return nil
}

// dupWindow is how soon after a first signal a second one counts as the
// same stop delivered twice.
const dupWindow = time.Second

// historyEvents are appended before the engine's first start; poisonEvery
// makes every so many events one that the balances projection dead-letters.
const (
	historyEvents = 500
	poisonEvery   = 100
)

// stopEngine passes sig on to the engine and waits for it to exit. A
// further signal to the demo is passed on too (the engine's "stop now"),
// unless it came within dupWindow of the first: one stop often arrives
// twice (make passes SIGTERM on to its children, and `timeout` signals
// the whole group as well). After the engine's shutdown_timeout and a
// margin it is killed.
func stopEngine(p *os.Process, sig os.Signal, first time.Time, sigs <-chan os.Signal, exited <-chan error, shutdown time.Duration) error {
	say("stopping the engine gracefully (%s; another Ctrl-C stops it at once)", sig)
	_ = p.Signal(sig)
	deadline := time.After(shutdown + 10*time.Second)
	for {
		select {
		case s := <-sigs:
			if time.Since(first) < dupWindow {
				continue
			}
			say("second %s: the engine stops now", s)
			_ = p.Signal(s)
		case err := <-exited:
			if err != nil {
				return fmt.Errorf("engine: %w", err)
			}
			say("engine exited 0")
			return nil
		case <-deadline:
			_ = p.Kill()
			return fmt.Errorf("engine did not stop within shutdown_timeout (%s): killed", shutdown)
		}
	}
}

// waitBackfilled returns when every projection is live, so that the live
// appends start after the backfill: the engine then backfills exactly the
// history the demo reported.
func waitBackfilled(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config, exited <-chan error) error {
	q := `SELECT projection, version, coalesce(backfill_total, 0) FROM ` +
		pgx.Identifier{cfg.Engine.Schema, "watermarks"}.Sanitize() + ` WHERE phase = 'live' ORDER BY projection`
	return whileRunning(ctx, 100*time.Millisecond, exited, func() bool {
		rows, err := pool.Query(ctx, q)
		if err != nil {
			return false
		}
		var done []string
		for rows.Next() {
			var name string
			var version, total int64
			if rows.Scan(&name, &version, &total) == nil {
				done = append(done, fmt.Sprintf("%s v%d %d events", name, version, total))
			}
		}
		rows.Close()
		if len(done) == len(cfg.Projections) {
			say("backfill complete: %s", strings.Join(done, ", "))
			return true
		}
		return false
	})
}

// whileRunning calls step every period until step reports it is done or ctx
// ends (both nil), or the engine exits first, which is an error: the demo
// never expects the engine to stop on its own. A nil exited is never
// ready: only step or ctx end the wait.
func whileRunning(ctx context.Context, every time.Duration, exited <-chan error, step func() (done bool)) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-exited:
			return fmt.Errorf("engine stopped on its own: %w", errOrStatus(err))
		case <-t.C:
			if step() {
				return nil
			}
		}
	}
}

func errOrStatus(err error) error {
	if err == nil {
		return errors.New("exit status 0")
	}
	return err
}

// after is time.After, or a channel that never fires for d <= 0.
func after(d time.Duration) <-chan time.Time {
	if d <= 0 {
		return nil
	}
	return time.After(d)
}

// writer appends account events with expected-version semantics.
// It runs on one goroutine at a time: first the history, then live.
type writer struct {
	pool     *pgxpool.Pool
	versions map[string]int64
	accounts []string
	appended int
}

// live appends about rate events a second until ctx ends.
func (w *writer) live(ctx context.Context, rate int) {
	_ = whileRunning(ctx, time.Second/time.Duration(max(rate, 1)), nil, func() bool {
		_ = w.append(ctx)
		return false
	})
}

func (w *writer) append(ctx context.Context) error {
	var stream, typ string
	var data map[string]any
	switch {
	case (w.appended+1)%poisonEvery == 0:
		stream, typ = w.accounts[rand.IntN(len(w.accounts))], "Withdrawn"
		data = map[string]any{"account_id": stream, "amount": 0} // poison: see run
	case len(w.accounts) < 20 || rand.IntN(10) == 0:
		stream = fmt.Sprintf("acct-%03d", len(w.accounts)+1)
		w.accounts = append(w.accounts, stream)
		typ = "AccountOpened"
		data = map[string]any{"account_id": stream, "owner": fmt.Sprintf("owner %d", len(w.accounts)), "initial": rand.IntN(1000)}
	default:
		stream = w.accounts[rand.IntN(len(w.accounts))]
		typ = "Deposited"
		if rand.IntN(2) == 0 {
			typ = "Withdrawn"
		}
		data = map[string]any{"account_id": stream, "amount": 1 + rand.IntN(100)}
	}
	next := w.versions[stream] + 1
	_, err := w.pool.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data) VALUES ($1, $2, $3, $4)`,
		stream, next, typ, data)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" {
		return nil // lost an expected-version race; next append reads again
	}
	if err == nil {
		w.versions[stream] = next
		w.appended++
	}
	return err
}

func show(ctx context.Context, pool *pgxpool.Pool, cfg *config.Config) {
	schema := cfg.Engine.Schema
	var events, applied, dead int64
	_ = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM events),
		(SELECT COALESCE(sum(applied + skipped + dead_lettered), 0) FROM `+pgx.Identifier{schema, "cursors"}.Sanitize()+` WHERE projection = 'balances'),
		(SELECT count(*) FROM `+pgx.Identifier{schema, "dead_letters"}.Sanitize()+`)`).Scan(&events, &applied, &dead)
	fmt.Printf("\n  events %d · balances accounted %d · dead letters %d (1 in %d, on purpose) · lag %s\n",
		events, applied, dead, poisonEvery, lagLine(cfg.Metrics.Listen))
	rows, err := pool.Query(ctx, `SELECT account_id, owner, balance, closed FROM balances ORDER BY updated_at DESC LIMIT 5`)
	if err != nil {
		return
	}
	defer rows.Close()
	fmt.Println("  account_id | owner       | balance | closed   (most recently changed)")
	for rows.Next() {
		var id, owner string
		var bal int64
		var closed bool
		if rows.Scan(&id, &owner, &bal, &closed) == nil {
			fmt.Printf("  %-10s | %-11s | %7d | %v\n", id, owner, bal, closed)
		}
	}
}

func lagLine(listen string) string {
	resp, err := http.Get("http://" + listen + "/metrics")
	if err != nil {
		return "(metrics unavailable)"
	}
	defer resp.Body.Close()
	var parts []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := sc.Text()
		// pgscribe_lag_seconds{projection="balances",version="1"} 0.25
		if rest, ok := strings.CutPrefix(l, `pgscribe_lag_seconds{projection="`); ok {
			name, after, _ := strings.Cut(rest, `"`)
			fields := strings.Fields(after)
			parts = append(parts, name+" "+fields[len(fields)-1]+"s")
		}
	}
	return strings.Join(parts, ", ")
}

func prefix(r io.Reader, p string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fmt.Println(p + sc.Text())
	}
}

func say(format string, args ...any) { fmt.Printf("demo: "+format+"\n", args...) }
