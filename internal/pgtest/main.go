package pgtest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// shared is the server Main started for this test binary.
var shared *Server

// Main is the body of the TestMain of a package whose tests need
// PostgreSQL: one server per test binary, an isolated database per test
// (Database). It returns the exit code for os.Exit:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// Unless -short is set it starts a server (Start, progress on stderr), runs
// the tests and stops it; a server that cannot start or stop fails the run.
// With -short no server starts and Database skips the tests that need one,
// which is how `make test-unit` runs without a database. Callers with
// cleanup of their own run it after Main returns, before os.Exit.
func Main(m *testing.M) int {
	if !flag.Parsed() {
		flag.Parse()
	}
	if testing.Short() {
		return m.Run()
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	s, err := Start(ctx, Options{Logf: logf})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: start PostgreSQL: %v\n", err)
		return 1
	}
	shared = s
	logf("pgtest: PostgreSQL in %s mode at %s", s.Mode(), s.HostPort())

	code := m.Run()

	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: stop PostgreSQL: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// Shared returns the server Main started: nil with -short, or in a test
// binary whose TestMain does not call Main. Tests that call its Restart
// must not run in parallel: a restart breaks every connection to it.
func Shared() *Server { return shared }

// Require skips t when no shared server runs (-short).
func Require(t testing.TB) {
	t.Helper()
	if shared == nil {
		t.Skip("needs PostgreSQL (skipped with -short)")
	}
}

// Database returns the DSN of a fresh, empty database on the shared server,
// dropped with its backends and replication slots when t ends
// (NewDatabase). It skips t when no shared server runs (-short).
func Database(t testing.TB) string {
	t.Helper()
	Require(t)
	return NewDatabase(t, shared)
}

// Connect opens a connection to dsn, closed when t ends.
func Connect(t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
