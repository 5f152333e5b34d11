// Command demo is what `make demo` runs: a throwaway PostgreSQL through the
// test harness, the engine schema and demo read models, a background writer
// appending account events, and pgscribe itself on config.toml.example,
// with the read model printed as it changes. Ctrl-C stops everything and
// removes the server.
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

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

func main() {
	bin := flag.String("bin", "bin/pgscribe", "pgscribe binary")
	cfgPath := flag.String("config", "config.toml.example", "configuration for the engine")
	schema := flag.String("schema", "examples/demo/schema.sql", "read-model tables")
	rate := flag.Int("rate", 50, "events appended per second")
	duration := flag.Duration("duration", 0, "stop after this long (0 = until Ctrl-C)")
	flag.Parse()
	if err := run(*bin, *cfgPath, *schema, *rate, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(bin, cfgPath, schemaPath string, rate int, duration time.Duration) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, duration)
		defer cancel()
	}
	say("starting a throwaway PostgreSQL (wal_level=logical) through the test harness …")
	srv, err := pgtest.Start(ctx, pgtest.Options{Logf: func(f string, a ...any) {}})
	if err != nil {
		return err
	}
	defer func() {
		say("removing the throwaway PostgreSQL")
		_ = srv.Stop(context.Background())
	}()
	dsn, err := srv.CreateDatabase(ctx, "pgscribe_demo")
	if err != nil {
		return err
	}
	say("PostgreSQL (%s mode) ready: database pgscribe_demo", srv.Mode())
	env := append(os.Environ(), "PGSCRIBE_DATABASE_URL="+dsn)

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
	for i := 0; i < 500; i++ {
		if err := w.append(ctx); err != nil {
			return err
		}
	}
	say("appended 500 events before the first start (the engine backfills them from its slot's snapshot)")

	say("$ pgscribe run -config %s", cfgPath)
	engine := exec.Command(bin, "run", "-config", cfgPath)
	engine.Env = env
	logs, err := engine.StderrPipe()
	if err != nil {
		return err
	}
	if err := engine.Start(); err != nil {
		return err
	}
	go prefix(logs, "  engine | ")
	defer func() {
		_ = engine.Process.Signal(syscall.SIGTERM)
		_ = engine.Wait()
	}()

	go func() {
		t := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_ = w.append(ctx)
			}
		}
	}()

	say("appending ~%d events/s; metrics at http://127.0.0.1:9187/metrics — Ctrl-C to stop", rate)
	tick := time.NewTicker(3 * time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			show(ctx, pool)
		}
	}
}

// writer appends account events with expected-version semantics.
type writer struct {
	pool     *pgxpool.Pool
	versions map[string]int64
	accounts []string
}

func (w *writer) append(ctx context.Context) error {
	var stream, typ string
	var data map[string]any
	if len(w.accounts) < 20 || rand.IntN(10) == 0 {
		stream = fmt.Sprintf("acct-%03d", len(w.accounts)+1)
		w.accounts = append(w.accounts, stream)
		typ = "AccountOpened"
		data = map[string]any{"account_id": stream, "owner": fmt.Sprintf("owner %d", len(w.accounts)), "initial": rand.IntN(1000)}
	} else {
		stream = w.accounts[rand.IntN(len(w.accounts))]
		typ = "Deposited"
		if rand.IntN(2) == 0 {
			typ = "Withdrawn"
		}
		amount := 1 + rand.IntN(100)
		if rand.IntN(200) == 0 {
			amount = 0 // the fail rule dead-letters it
		}
		data = map[string]any{"account_id": stream, "amount": amount}
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
	}
	return err
}

func show(ctx context.Context, pool *pgxpool.Pool) {
	var events, applied, dead int64
	_ = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM events),
		(SELECT COALESCE(sum(applied + skipped + dead_lettered), 0) FROM pgscribe.cursors WHERE projection = 'balances'),
		(SELECT count(*) FROM pgscribe.dead_letters)`).Scan(&events, &applied, &dead)
	fmt.Printf("\n  events %d · balances accounted %d · dead letters %d · lag %s\n", events, applied, dead, lagLine())
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

func lagLine() string {
	resp, err := http.Get("http://127.0.0.1:9187/metrics")
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
