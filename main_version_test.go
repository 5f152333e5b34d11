package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The commands on one projection version read the -config given after the
// command name: a file without a database fails on that file, not on the
// default ./pgscribe.toml, and before any database is touched.
func TestVersionCommandsReadTheirConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "nodb.toml")
	if err := os.WriteFile(cfg, []byte("[engine]\nparallelism = 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, cmd := range []string{"reset", "verify", "promote", "retire"} {
		var out, errOut bytes.Buffer
		err := run([]string{cmd, "-projection", "p", "-version", "1", "-config", cfg}, &out, &errOut)
		if exitCode(err) != 2 || !strings.Contains(err.Error(), cfg) || !strings.Contains(err.Error(), "database.url") {
			t.Errorf("pgscribe %s -config %s: exit %d (want 2), %v (want the file's missing database.url)", cmd, cfg, exitCode(err), err)
		}
	}
}
