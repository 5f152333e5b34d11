package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

// binDir holds the pgscribe binary built by pgscribeBinary.
var binDir string

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// srv is the server shared by the package's tests (pgtest.Main starts it);
// nil with -short. Tests that call srv().Restart must not call t.Parallel:
// a restart breaks every connection to the server.
func srv() *pgtest.Server { return pgtest.Shared() }

// requireServer skips t when the shared server is not running (-short).
func requireServer(t testing.TB) {
	t.Helper()
	pgtest.Require(t)
}

// newDatabase returns the DSN of a fresh, empty database on the shared
// server, dropped (with its slots) when t ends. It skips t with -short.
func newDatabase(t *testing.T) string {
	t.Helper()
	return pgtest.Database(t)
}

var (
	buildOnce   sync.Once
	binaryPath  string
	buildErr    error
	buildOutput []byte
)

// pgscribeBinary returns the path of the pgscribe binary, built with -race
// from the module root once per test binary.
func pgscribeBinary(t testing.TB) string {
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
