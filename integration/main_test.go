// Package integration runs pgscribe against a real PostgreSQL: end to end,
// crash, failover and fault tests. TestMain starts one server for the whole
// package (see internal/pgtest for where it comes from); each test gets its
// own database from newDatabase. With -short nothing is started and every
// test that needs the server skips.
package integration

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

// srv is the server shared by the package's tests; nil with -short. Tests
// that call srv.Restart must not call t.Parallel: a restart breaks every
// connection to the server.
var srv *pgtest.Server

// binDir holds the pgscribe binary built by pgscribeBinary.
var binDir string

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	code := run(m)
	os.Exit(code)
}

// run starts the shared server, runs the tests and stops the server. It is
// separate from TestMain so that its defers run before os.Exit.
func run(m *testing.M) int {
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05.000 ")+format+"\n", args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	s, err := pgtest.Start(ctx, pgtest.Options{Logf: logf})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: start PostgreSQL: %v\n", err)
		return 1
	}
	srv = s
	logf("integration: PostgreSQL in %s mode at %s", s.Mode(), s.HostPort())

	code := m.Run()

	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := s.Stop(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "integration: stop PostgreSQL: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	return code
}

// requireServer skips t when the shared server is not running (-short).
func requireServer(t testing.TB) {
	t.Helper()
	if srv == nil {
		t.Skip("integration test: needs PostgreSQL (skipped with -short)")
	}
}

// newDatabase returns the DSN of a fresh, empty database on the shared
// server, dropped (with its slots) when t ends. It skips t with -short.
func newDatabase(t *testing.T) string {
	t.Helper()
	requireServer(t)
	return pgtest.NewDatabase(t, srv)
}

var (
	buildOnce   sync.Once
	binaryPath  string
	buildErr    error
	buildOutput []byte
)

// pgscribeBinary returns the path of the pgscribe binary, built with -race
// from the module root once per test binary.
func pgscribeBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgscribe-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binDir = dir
		binaryPath = filepath.Join(dir, "pgscribe")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, "go", "build", "-race", "-o", binaryPath, "github.com/pgscribe/pgscribe")
		cmd.Dir = ".." // the module root
		buildOutput, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("build pgscribe: %v\n%s", buildErr, buildOutput)
	}
	return binaryPath
}
