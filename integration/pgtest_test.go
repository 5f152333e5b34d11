package integration

import (
	"context"
	"errors"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

// Tests of the test harness itself (internal/pgtest) against the shared
// server: what every other test in this package relies on.

// adminQuery runs a one-row query on the maintenance database.
func adminQuery(t *testing.T, ctx context.Context, sql string, args []any, dest ...any) {
	t.Helper()
	conn, err := pgx.Connect(ctx, srv().AdminDSN())
	if err != nil {
		t.Fatalf("connect admin: %v", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

func databaseExists(t *testing.T, ctx context.Context, name string) bool {
	t.Helper()
	var exists bool
	adminQuery(t, ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", []any{name}, &exists)
	return exists
}

func dbName(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse dsn: %v", err)
	}
	return strings.TrimPrefix(u.Path, "/")
}

func TestHarnessDropDatabaseWithSlots(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	name := pgtest.DatabaseName(t.Name())
	dsn, err := srv().CreateDatabase(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv().DropDatabase(context.Background(), name) })

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		"CREATE TABLE events (id bigserial PRIMARY KEY, body text)",
		"CREATE PUBLICATION harness_pub FOR TABLE events WITH (publish = 'insert')",
		"SELECT pg_create_logical_replication_slot('harness_idle', 'pgoutput')",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	// A slot held by a live walsender, as a running pgscribe holds its own.
	repl, err := pgconn.Connect(ctx, dsn+"&replication=database")
	if err != nil {
		t.Fatalf("replication connection: %v", err)
	}
	defer repl.Close(context.WithoutCancel(ctx))
	if _, err := pglogrepl.CreateReplicationSlot(ctx, repl, "harness_active", "pgoutput", pglogrepl.CreateReplicationSlotOptions{}); err != nil {
		t.Fatalf("create slot: %v", err)
	}
	err = pglogrepl.StartReplication(ctx, repl, "harness_active", 0, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names 'harness_pub'"},
	})
	if err != nil {
		t.Fatalf("start replication: %v", err)
	}
	waitFor(t, 30*time.Second, "the slot to be active", func() bool {
		var active bool
		adminQuery(t, ctx, "SELECT coalesce(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = 'harness_active'", nil, &active)
		return active
	})

	if err := srv().DropDatabase(ctx, name); err != nil {
		t.Fatalf("DropDatabase: %v", err)
	}
	if databaseExists(t, ctx, name) {
		t.Fatalf("database %s still exists", name)
	}
	var slots int
	adminQuery(t, ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name IN ('harness_idle', 'harness_active')", nil, &slots)
	if slots != 0 {
		t.Fatalf("%d replication slots left", slots)
	}

	// The walsender was terminated: the stream ends with an error well
	// before the deadline.
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	defer rcancel()
	for {
		_, err := repl.ReceiveMessage(rctx)
		if err != nil {
			if rctx.Err() != nil {
				t.Fatalf("replication connection still open after DropDatabase")
			}
			break
		}
	}

	// Dropping what is not there is not an error.
	if err := srv().DropDatabase(ctx, name); err != nil {
		t.Fatalf("second DropDatabase: %v", err)
	}
}

func TestHarnessNewDatabase(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var name string
	t.Run("inner", func(t *testing.T) {
		dsn := newDatabase(t)
		name = dbName(t, dsn)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var current string
		var tables int
		err = conn.QueryRow(ctx, `SELECT current_database(),
			(SELECT count(*) FROM pg_tables WHERE schemaname = 'public')`).Scan(&current, &tables)
		if err != nil {
			t.Fatal(err)
		}
		if current != name || tables != 0 {
			t.Fatalf("got database %q with %d tables, want empty %q", current, tables, name)
		}
		// Leave a session open: the cleanup must cope with it.
		if _, err := conn.Exec(ctx, "CREATE TABLE leftover (x int)"); err != nil {
			t.Fatal(err)
		}
	})
	if name == "" {
		t.Fatal("subtest did not run")
	}
	if databaseExists(t, ctx, name) {
		t.Fatalf("database %s survived its test", name)
	}
}

func TestHarnessRestartImmediate(t *testing.T) {
	requireServer(t)
	if !srv().CanRestart() {
		t.Skipf("%s server cannot be restarted", srv().Mode())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dsn := newDatabase(t)
	hostPort := srv().HostPort()

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	// An open transaction: the crash must lose it.
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO t VALUES (2)"); err != nil {
		t.Fatal(err)
	}

	if err := srv().Restart(ctx, true); err != nil {
		t.Fatalf("Restart(immediate): %v", err)
	}
	if srv().HostPort() != hostPort {
		t.Fatalf("address changed from %s to %s", hostPort, srv().HostPort())
	}
	if err := tx.Commit(ctx); err == nil {
		t.Fatal("commit on a connection that lived through a crash succeeded")
	}

	readAll := func() []int32 {
		t.Helper()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatalf("connect after restart: %v", err)
		}
		defer conn.Close(ctx)
		var xs []int32
		if err := conn.QueryRow(ctx, "SELECT coalesce(array_agg(x ORDER BY x), '{}') FROM t").Scan(&xs); err != nil {
			t.Fatal(err)
		}
		return xs
	}
	if got := readAll(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after crash: rows %v, want [1]", got)
	}

	if err := srv().Restart(ctx, false); err != nil {
		t.Fatalf("Restart(fast): %v", err)
	}
	if got := readAll(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("after fast restart: rows %v, want [1]", got)
	}
}

func TestHarnessProxy(t *testing.T) {
	requireServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dsn := newDatabase(t)

	p, err := pgtest.NewProxy(srv().HostPort())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	pdsn, err := p.DSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgx.ParseConfig(pdsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnectTimeout = 5 * time.Second
	connect := func() (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, cfg) }
	// mustPing connects through the proxy and checks the connection works.
	mustPing := func(when string) *pgx.Conn {
		t.Helper()
		conn, err := connect()
		if err == nil {
			t.Cleanup(func() { conn.Close(context.WithoutCancel(ctx)) })
			err = conn.Ping(ctx)
		}
		if err != nil {
			t.Fatalf("connect through proxy %s: %v", when, err)
		}
		return conn
	}

	conn := mustPing("at first")
	p.Cut()
	qctx, qcancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = conn.Exec(qctx, "SELECT 1")
	qcancel()
	if err == nil {
		t.Fatal("query on a cut connection succeeded")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cut connection hung instead of failing: %v", err)
	}
	if c, err := connect(); err == nil {
		c.Close(ctx)
		t.Fatal("new connection went through a cut proxy")
	}
	p.Restore()
	conn = mustPing("after Restore")

	// A blackhole keeps the connection open but silent: the query can
	// only end by its own deadline, and after Restore traffic flows again.
	p.Blackhole()
	bctx, bcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	var one int
	err = conn.QueryRow(bctx, "SELECT 1").Scan(&one)
	bcancel()
	if err == nil {
		t.Fatal("query through a blackhole succeeded")
	}
	p.Restore()
	mustPing("after a blackhole")
}

func TestPgscribeBinaryBuilds(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary with -race; skipped with -short")
	}
	path := pgscribeBinary(t)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm()&0o111 == 0 {
		t.Fatalf("%s is not executable", path)
	}
}
