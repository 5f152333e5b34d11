package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

// serverSettings are the PostgreSQL settings of a bench run, on top of
// pgtest's (wal_level=logical, track_commit_timestamp=on, …): durable
// commits, as in production, and room for a 1M-event table in memory
// without a checkpoint forced by WAL volume in the middle of a measurement.
var serverSettings = map[string]string{
	"fsync":          "on",
	"shared_buffers": "512MB",
	"max_wal_size":   "4GB",
	// Recycled WAL segments are kept up to this much (see warmWAL).
	"min_wal_size": "1GB",
}

// warmSegments is how many WAL segments warmWAL makes ready for reuse:
// 1 GB at the default 16 MB, more than a live step writes.
const warmSegments = 64

// server is the PostgreSQL of a bench run.
type server struct {
	*pgtest.Server
	postmaster int // host pid of the postmaster; 0 when not on this host
	version    string
	settings   map[string]string // as reported by the server
}

// startServer starts PostgreSQL through the test harness. mode, when not
// empty, forces the harness mode (PGSCRIBE_TEST_PG_MODE).
func startServer(ctx context.Context, mode string, extra map[string]string, logf func(string, ...any)) (*server, error) {
	if mode != "" && os.Getenv(pgtest.EnvMode) == "" && os.Getenv(pgtest.EnvDatabaseURL) == "" {
		os.Setenv(pgtest.EnvMode, mode)
	}
	settings := maps.Clone(serverSettings)
	maps.Copy(settings, extra)
	srv, err := pgtest.Start(ctx, pgtest.Options{Settings: settings, Logf: logf})
	if err != nil {
		return nil, err
	}
	s := &server{Server: srv, settings: map[string]string{}}
	conn, err := pgx.Connect(ctx, srv.AdminDSN())
	if err != nil {
		_ = srv.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var backend int
	err = conn.QueryRow(ctx, "SELECT current_setting('server_version'), pg_backend_pid()").Scan(&s.version, &backend)
	if err != nil {
		_ = srv.Stop(context.WithoutCancel(ctx))
		return nil, err
	}
	// A server the bench started; a given one (PGSCRIBE_TEST_DATABASE_URL)
	// is measured as it is.
	if srv.Mode() != pgtest.ModeExternal {
		if err := warmWAL(ctx, conn); err != nil {
			_ = srv.Stop(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	names := []string{"fsync", "synchronous_commit", "shared_buffers", "max_wal_size", "min_wal_size", "wal_level",
		"track_commit_timestamp", "logical_decoding_work_mem", "work_mem"}
	for _, n := range names {
		var v string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", n).Scan(&v); err == nil {
			s.settings[n] = v
		}
	}
	// In local mode the backend's pid is a host pid and its parent is the
	// postmaster; in a container the pid belongs to another namespace.
	if srv.Mode() == pgtest.ModeLocal {
		if st, err := readStat(backend); err == nil && isPostgres(st.ppid) {
			s.postmaster = st.ppid
		}
	}
	return s, nil
}

// warmWAL gives a fresh server what a server that has been running has:
// WAL segments recycled by a checkpoint, ready for reuse. A fresh cluster
// has none, so each segment its workloads fill is created anew, zeroed
// (wal_init_zero) and synced while committing backends wait on it, which
// a server in production rarely does. Filling warmSegments segments (a
// switch after a one-record write) and checkpointing renames them into
// the segments to come.
func warmWAL(ctx context.Context, conn *pgx.Conn) error {
	for range warmSegments {
		if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, 'pgscribe-bench', 'warm'), pg_switch_wal()"); err != nil {
			return fmt.Errorf("warm WAL: %w", err)
		}
	}
	if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("warm WAL: %w", err)
	}
	var ahead int
	err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_ls_waldir()
		WHERE name ~ '^[0-9A-F]{24}$' AND name > pg_walfile_name(pg_current_wal_lsn())`).Scan(&ahead)
	if err != nil {
		return fmt.Errorf("warm WAL: %w", err)
	}
	say("WAL warmed: %d segments recycled ahead of the insert position", ahead)
	return nil
}

// dataDirectory is the server's data_directory, or "" when it cannot be
// read.
func (s *server) dataDirectory(ctx context.Context) string {
	conn, err := pgx.Connect(ctx, s.AdminDSN())
	if err != nil {
		return ""
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return ""
	}
	return dir
}

func isPostgres(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return err == nil && strings.TrimSpace(string(b)) == "postgres"
}

// cpu returns the CPU time the whole server has used so far; ok is false
// when it cannot be measured from here (a container, an external server).
func (s *server) cpu() (time.Duration, bool) {
	if s.postmaster == 0 {
		return 0, false
	}
	d, err := treeCPU(s.postmaster)
	return d, err == nil
}

// settingsLine renders the reported settings for RESULTS.md.
func (s *server) settingsLine() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(s.settings)) {
		parts = append(parts, k+"="+s.settings[k])
	}
	return strings.Join(parts, ", ")
}

// database is one workload's database: its DSN and a pool for the bench's
// own queries (generation, references, polling).
type database struct {
	name string
	dsn  string
	pool *pgxpool.Pool
}

// newDatabase creates a fresh database for a workload.
func (s *server) newDatabase(ctx context.Context, name string) (*database, error) {
	_ = s.DropDatabase(ctx, name) // left by an interrupted run on an external server
	dsn, err := s.CreateDatabase(ctx, name)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	// Told apart from the engine's sessions (sampleOldestXact).
	cfg.ConnConfig.RuntimeParams["application_name"] = benchApplication
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &database{name: name, dsn: dsn, pool: pool}, nil
}

// benchApplication is the application_name of the bench's own sessions.
const benchApplication = "pgscribe-bench"

// drop closes the pool and drops the database with its slots.
func (s *server) drop(ctx context.Context, db *database) {
	db.pool.Close()
	if err := s.DropDatabase(ctx, db.name); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	}
}

// settle makes a database quiet before a measurement: hint bits set and
// statistics fresh on the events table, and dirty buffers written out, so
// that no measurement pays for the previous step's leftovers.
func (db *database) settle(ctx context.Context) error {
	for _, q := range []string{"VACUUM (ANALYZE) events", "CHECKPOINT"} {
		if _, err := db.pool.Exec(ctx, q); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// tableSizes reads the size of each table (a name, schema-qualified where
// not in the search path) as it stands, tagged with the events behind it.
// The statistics' dead tuples are flushed by the server's stats collector
// up to a second late; the bench reads them after the engine has stopped.
func (db *database) tableSizes(ctx context.Context, events int64, tables []string) ([]TableSize, error) {
	var out []TableSize
	for _, t := range tables {
		ts := TableSize{Events: events, Table: t}
		err := db.pool.QueryRow(ctx, `SELECT pg_relation_size(c.oid) / current_setting('block_size')::bigint,
				pg_total_relation_size(c.oid) / 1024, coalesce(s.n_dead_tup, 0)
			FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
			WHERE c.oid = $1::regclass`, t).Scan(&ts.Pages, &ts.TotalKB, &ts.DeadTuples)
		if err != nil {
			return nil, fmt.Errorf("size of %s: %w", t, err)
		}
		if err := db.pool.QueryRow(ctx, "SELECT count(*) FROM "+t).Scan(&ts.Rows); err != nil {
			return nil, fmt.Errorf("rows of %s: %w", t, err)
		}
		out = append(out, ts)
	}
	return out, nil
}

// accounted returns how many events the projection version has accounted
// for (applied + skipped + dead-lettered), from its cursors.
func (db *database) accounted(ctx context.Context, projection string, version int) (int64, error) {
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT coalesce(sum(applied + skipped + dead_lettered), 0)::bigint
		FROM pgscribe.cursors WHERE projection = $1 AND version = $2`, projection, version).Scan(&n)
	return n, err
}

// phase returns the stored phase of a projection version ("" before any).
func (db *database) phase(ctx context.Context, projection string, version int) (string, error) {
	var p string
	err := db.pool.QueryRow(ctx, `SELECT coalesce(max(phase), '') FROM pgscribe.watermarks
		WHERE projection = $1 AND version = $2`, projection, version).Scan(&p)
	return p, err
}

// count returns the number of rows of table.
func (db *database) count(ctx context.Context, table string) (int64, error) {
	var n int64
	err := db.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&n)
	return n, err
}

// waitFor polls cond every interval until it holds, fails, or timeout passes.
func waitFor(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}
