// Command consolebench measures the console against `pgscribe status` at
// the size of issue 32: 50 projection versions and 100k dead letters.
//
//	go build -o bin/pgscribe . && go run ./bench/consolebench -bin bin/pgscribe
//
// It starts a PostgreSQL through internal/pgtest with pg_stat_statements
// (track_planning on), migrates a database for a configuration of 50
// versions, and fills it set-based: events over streams, a cursor per
// stream and version, and the dead letters spread evenly over the
// versions. Then, side by side:
//
//   - `pgscribe status -json`, the binary, wall time per run;
//   - one full reading (admin.StatusOn on held connections, what status
//     reads): wall time, and the database's own time for it (planning +
//     execution, pg_stat_statements);
//   - the console's two parts of it: the counts (admin.ReadStatusCounts,
//     which the sampler reads at most every 30 s) and a refresh with the
//     counts reused (admin.StatusWith, every 2 s while a page is viewed),
//     and their average per 2 s refresh;
//   - the overview page (GET / on console.Server, the latest reading
//     rendered): wall time, size, and the statements and time it cost the
//     database (pg_stat_statements, as for the others);
//   - a version page (GET /v/p01/1: 50 dead letters, counts by kind, parked
//     streams, all read on the request): wall time and database time.
//
// It prints a Markdown table. Nothing is asserted.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/admin"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/console"
	"github.com/pgscribe/pgscribe/internal/pgtest"
)

func main() {
	bin := flag.String("bin", "bin/pgscribe", "pgscribe binary (for `pgscribe status`)")
	versions := flag.Int("versions", 50, "projection versions")
	deadLetters := flag.Int("dead-letters", 100_000, "dead letters, spread evenly over the versions")
	events := flag.Int("events", 100_000, "events in the events table")
	streams := flag.Int("streams", 1_000, "streams the events are spread over (one cursor per stream and version)")
	runs := flag.Int("runs", 30, "measured runs of each")
	flag.Parse()
	if err := run(*bin, *versions, *deadLetters, *events, *streams, *runs); err != nil {
		fmt.Fprintln(os.Stderr, "consolebench:", err)
		os.Exit(1)
	}
}

func run(bin string, versions, deadLetters, events, streams, runs int) error {
	ctx := context.Background()
	logf := func(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
	srv, err := pgtest.Start(ctx, pgtest.Options{Logf: logf, Settings: map[string]string{
		"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track_planning": "on",
		"pg_stat_statements.track": "all", "fsync": "on"}})
	if err != nil {
		return err
	}
	defer func() { _ = srv.Stop(context.WithoutCancel(ctx)) }()
	dsn, err := srv.CreateDatabase(ctx, "consolebench")
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "consolebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var b strings.Builder
	fmt.Fprintf(&b, "[database]\nurl = %q\n[metrics]\nlisten = \"off\"\n", dsn)
	for i := 1; i <= versions; i++ {
		fmt.Fprintf(&b, "\n[[projection]]\nname = \"p%02d\"\nversion = 1\ngroup = \"g%02d\"\n[[projection.rule]]\nname = \"reject\"\non = \"Bogus\"\nop = \"fail\"\nmessage = \"'bogus'\"\n", i, i)
	}
	cfgPath := filepath.Join(dir, "bench.toml")
	if err := os.WriteFile(cfgPath, []byte(b.String()), 0o600); err != nil {
		return err
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if err := admin.Migrate(ctx, cfg, true, log); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	logf("filling: %d events over %d streams, %d cursors, %d dead letters", events, streams, versions*streams, deadLetters)
	for _, sql := range []string{
		`INSERT INTO events (stream_id, stream_position, type, data)
SELECT 's' || (g % $1::int), g / $1::int + 1, 'Bogus', jsonb_build_object('n', g, 'note', repeat('x', 100))
FROM generate_series(0, $2::int - 1) g`,
		`INSERT INTO pgscribe.cursors (projection, version, stream_id, stream_position, position, applied, dead_lettered)
SELECT 'p' || lpad(v::text, 2, '0'), 1, 's' || s, $2::int / $1::int, $2::int,
  $2::int / $1::int - $3::int / ($1::int * $4::int), $3::int / ($1::int * $4::int)
FROM generate_series(1, $4::int) v, generate_series(0, $1::int - 1) s`,
		`INSERT INTO pgscribe.dead_letters (projection, version, position, event_id, stream_id, stream_position,
  event_type, error_kind, error_message, event_data, event_metadata, occurred_at)
SELECT 'p' || lpad((1 + (d % $4::int))::text, 2, '0'), 1, e.position, e.id::text, e.stream_id, e.stream_position,
  e.type, CASE WHEN d % 3 = 0 THEN 'commit:23505' ELSE 'rule:reject' END, 'bogus', e.data, e.metadata, e.occurred_at
FROM generate_series(0, $3::int - 1) d JOIN events e ON e.position = 1 + d % $2::int`,
		`VACUUM ANALYZE`,
	} {
		// The sizes are numbers of this program: written into the text.
		sql = strings.NewReplacer("$1", fmt.Sprint(streams), "$2", fmt.Sprint(events),
			"$3", fmt.Sprint(deadLetters), "$4", fmt.Sprint(versions)).Replace(sql)
		if _, err := conn.Exec(ctx, sql); err != nil {
			return fmt.Errorf("fill: %w", err)
		}
	}
	fmt.Printf("Sizes: %d projection versions, %d dead letters, %d events over %d streams, %d cursors; PostgreSQL %s (%s mode), fsync on.\n\n",
		versions, scalar(ctx, conn, `SELECT count(*) FROM pgscribe.dead_letters`), events, streams,
		scalar(ctx, conn, `SELECT count(*) FROM pgscribe.cursors`), serverVersion(ctx, conn), srv.Mode())
	if _, err := conn.Exec(ctx, `CREATE EXTENSION IF NOT EXISTS pg_stat_statements`); err != nil {
		return err
	}

	var rows [][]string
	add := func(what string, wall []time.Duration, db string, note string) {
		rows = append(rows, []string{what, ms(pct(wall, 50)), ms(pct(wall, 95)), db, note})
	}

	// pgscribe status -json, the binary.
	status := make([]time.Duration, 0, runs)
	for i := 0; i < runs+2; i++ {
		start := time.Now()
		out, err := exec.CommandContext(ctx, bin, "status", "-config", cfgPath, "-json").CombinedOutput()
		if err != nil {
			return fmt.Errorf("pgscribe status: %v\n%s", err, out)
		}
		if i >= 2 {
			status = append(status, time.Since(start))
		}
	}
	add("`pgscribe status -json` (process, connect, read)", status, "–", "a new process and connections per run")

	// One console reading: admin.StatusOn on held connections.
	held, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer held.Close(context.WithoutCancel(ctx))
	if _, err := admin.StatusOn(ctx, cfg, held, held); err != nil { // warm
		return err
	}
	// measure runs fn runs times: wall time of each, database time per run.
	measure := func(fn func() error) ([]time.Duration, dbStat, error) {
		wall := make([]time.Duration, 0, runs)
		db, err := dbTime(ctx, conn, runs, func() error {
			start := time.Now()
			err := fn()
			wall = append(wall, time.Since(start))
			return err
		})
		return wall, db, err
	}
	checked := func(rep *admin.StatusReport, err error) error {
		if err == nil && len(rep.Projections) != versions {
			err = fmt.Errorf("status: %d versions, want %d", len(rep.Projections), versions)
		}
		return err
	}
	reading, dbReading, err := measure(func() error { return checked(admin.StatusOn(ctx, cfg, held, held)) })
	if err != nil {
		return err
	}
	add("full reading (admin.StatusOn, held connections: what `pgscribe status` reads)", reading, dbReading.String(), fmt.Sprintf("%d statements", dbReading.calls))

	// The console's two parts: the counts (every 30 s, and at the first
	// view and after an action) and the rest (every refresh, the counts
	// reused).
	counts, err := admin.ReadStatusCounts(ctx, cfg, held, held)
	if err != nil {
		return err
	}
	countWall, dbCounts, err := measure(func() error {
		_, err := admin.ReadStatusCounts(ctx, cfg, held, held)
		return err
	})
	if err != nil {
		return err
	}
	add("console counts (admin.ReadStatusCounts: at most every 30 s)", countWall, dbCounts.String(), fmt.Sprintf("%d statements", dbCounts.calls))
	refresh, dbRefresh, err := measure(func() error { return checked(admin.StatusWith(ctx, cfg, held, held, counts)) })
	if err != nil {
		return err
	}
	add("console refresh (admin.StatusWith, the counts reused: every 2 s while viewed)", refresh, dbRefresh.String(), fmt.Sprintf("%d statements", dbRefresh.calls))
	// Every 2 s, the counts once in 15 refreshes.
	avg := dbRefresh.perRun + dbCounts.perRun/15
	rows = append(rows, []string{"console, per 2 s refresh on average (refresh + counts / 15)", "–", "–", "**" + ms(avg) + "**", "what a viewed console costs the database"})
	if os.Getenv("CONSOLEBENCH_TOP") != "" {
		rows, _ := conn.Query(ctx, `SELECT calls, round((total_plan_time + total_exec_time)::numeric, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 110)
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY 2 DESC LIMIT 8`)
		for rows.Next() {
			var calls int64
			var total float64
			var q string
			_ = rows.Scan(&calls, &total, &q)
			fmt.Fprintf(os.Stderr, "%6d %9.1f ms  %s\n", calls, total, q)
		}
		rows.Close()
		for _, q := range []string{
			`SELECT projection, version, count(*), sum(applied) FROM pgscribe.cursors GROUP BY projection, version`,
			`SELECT count(*), sum(applied) FROM pgscribe.cursors WHERE projection = 'p07' AND version = 1`,
			`SELECT projection, version, count(*) FROM pgscribe.dead_letters GROUP BY projection, version`,
			`SELECT count(*) FROM events`,
		} {
			rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q)
			if err != nil {
				return err
			}
			for rows.Next() {
				var line string
				_ = rows.Scan(&line)
				fmt.Fprintln(os.Stderr, "  ", line)
			}
			rows.Close()
		}
	}

	// The overview page: the latest reading, rendered.
	c, err := console.New(cfg, nil, log, console.Options{Interval: time.Hour, Idle: time.Hour})
	if err != nil {
		return err
	}
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	defer func() { stop(); <-done }()
	get := func(path string) (time.Duration, int, error) {
		start := time.Now()
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		d := time.Since(start)
		if rec.Code != 200 {
			return d, 0, fmt.Errorf("GET %s: %d\n%s", path, rec.Code, rec.Body)
		}
		return d, rec.Body.Len(), nil
	}
	if _, _, err := get("/"); err != nil { // waits for the first reading
		return err
	}
	// The view woke the sampler for a reading of its own, after the first:
	// let it end, so that only the views are counted.
	time.Sleep(5 * time.Second)
	// views GETs path n times: the wall time of each view, the database's
	// time for them and the size of the last page.
	views := func(path string, n int) ([]time.Duration, dbStat, int, error) {
		wall := make([]time.Duration, 0, n)
		var size int
		db, err := dbTime(ctx, conn, n, func() error {
			d, sz, err := get(path)
			wall, size = append(wall, d), sz
			return err
		})
		return wall, db, size, err
	}
	overview, dbOverview, size, err := views("/", runs*10)
	if err != nil {
		return err
	}
	add("overview page (GET /, rendered from the latest reading)", overview, dbOverview.String(),
		fmt.Sprintf("%.2f statements per view, %d KiB of HTML", dbOverview.perView, size/1024))

	// A version page: one page of dead letters, counts, parked streams.
	version, dbVersion, size, err := views("/v/p01/1", runs)
	if err != nil {
		return err
	}
	add("version page (GET /v/p01/1: 50 of its 2k dead letters)", version, dbVersion.String(),
		fmt.Sprintf("%d statements, %d KiB of HTML", dbVersion.calls, size/1024))

	fmt.Println("| what | wall p50 | wall p95 | database time per run | notes |")
	fmt.Println("|---|---:|---:|---:|---|")
	for _, r := range rows {
		fmt.Printf("| %s |\n", strings.Join(r, " | "))
	}
	return nil
}

// dbStat is the database's own time for a series of runs, per run.
type dbStat struct {
	perRun  time.Duration
	calls   int64
	perView float64 // calls per run, unrounded
}

func (s dbStat) String() string { return ms(s.perRun) }

// dbTime runs fn runs times and returns the planning and execution time
// pg_stat_statements recorded meanwhile, per run (the statements of the
// measuring connection excluded), and the statements per run.
func dbTime(ctx context.Context, conn *pgx.Conn, runs int, fn func() error) (dbStat, error) {
	if _, err := conn.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return dbStat{}, err
	}
	for range runs {
		if err := fn(); err != nil {
			return dbStat{}, err
		}
	}
	var total float64
	var calls int64
	err := conn.QueryRow(ctx, `SELECT coalesce(sum(total_plan_time + total_exec_time), 0), coalesce(sum(calls), 0)::bigint
FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query NOT LIKE '%pg_stat_statements%'`).Scan(&total, &calls)
	if err != nil {
		return dbStat{}, err
	}
	return dbStat{perRun: time.Duration(total / float64(runs) * float64(time.Millisecond)), calls: calls / int64(runs),
		perView: float64(calls) / float64(runs)}, nil
}

func scalar(ctx context.Context, conn *pgx.Conn, sql string) int64 {
	var n int64
	if err := conn.QueryRow(ctx, sql).Scan(&n); err != nil {
		panic(err)
	}
	return n
}

func serverVersion(ctx context.Context, conn *pgx.Conn) string {
	var v string
	_ = conn.QueryRow(ctx, `SHOW server_version`).Scan(&v)
	return v
}

func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, (len(s)*p+99)/100-1)]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
