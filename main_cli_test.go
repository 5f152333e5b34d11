package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The first messages a new user meets: short, and saying what to do next.
func TestFirstHourMessages(t *testing.T) {
	t.Setenv("PGSCRIBE_CONFIG", "")
	t.Chdir(t.TempDir()) // no ./pgscribe.toml

	run1 := func(args ...string) (stdout, stderr string, err error) {
		var o, e bytes.Buffer
		err = run(args, &o, &e)
		return o.String(), e.String(), err
	}

	_, stderr, err := run1("frobnicate")
	if exitCode(err) != 2 || stderr != "" ||
		err.Error() != `unknown command "frobnicate" (run 'pgscribe help' for usage)` {
		t.Errorf("unknown command: exit %d, err %v, stderr %q", exitCode(err), err, stderr)
	}

	_, _, err = run1("status")
	if exitCode(err) != 2 || !strings.Contains(err.Error(), "no such file") ||
		!strings.Contains(err.Error(), "neither -config nor $PGSCRIBE_CONFIG is set") ||
		!strings.Contains(err.Error(), "-config FILE or PGSCRIBE_CONFIG=FILE") {
		t.Errorf("status without a config file: exit %d, err %v", exitCode(err), err)
	}
	t.Setenv("PGSCRIBE_CONFIG", "elsewhere.toml")
	if _, _, err = run1("status"); !strings.Contains(err.Error(), "the path is $PGSCRIBE_CONFIG's") {
		t.Errorf("status, PGSCRIBE_CONFIG to a missing file: %v", err)
	}
	if _, _, err = run1("check", "-config", "x.toml"); !strings.Contains(err.Error(), "the path is -config's") {
		t.Errorf("check -config of a missing file: %v", err)
	}

	stdout, _, err := run1("version")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	if len(lines) != 4 || lines[0] != "pgscribe "+version || !strings.HasPrefix(lines[1], "commit ") ||
		!strings.HasPrefix(lines[2], "date ") || !strings.Contains(lines[3], "go1.") {
		t.Errorf("version:\n%s", stdout)
	}

	cfg := filepath.Join(t.TempDir(), "one.toml")
	src, err := os.ReadFile(filepath.Join(srcDir, "config.toml.example"))
	if err != nil {
		t.Fatal(err)
	}
	one, _, _ := strings.Cut(string(src), "# Projection `activity`")
	if err := os.WriteFile(cfg, []byte(one), 0o644); err != nil {
		t.Fatal(err)
	}
	if stdout, _, err = run1("check", "-offline", "-config", cfg); err != nil || !strings.Contains(stdout, "ok (1 projection; ") {
		t.Errorf("check of one projection: %v %q", err, stdout)
	}
}

func TestProjectionsWording(t *testing.T) {
	for n, want := range map[int]string{0: "0 projections", 1: "1 projection", 2: "2 projections"} {
		if got := projections(n); got != want {
			t.Errorf("projections(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestBuildInfoFlagsWin(t *testing.T) {
	defer func(v, c, d string) { version, commit, commitDate = v, c, d }(version, commit, commitDate)
	version, commit, commitDate = "v1.2.3", "abc123", "2026-01-02T03:04:05Z"
	var b bytes.Buffer
	writeVersion(&b)
	for _, want := range []string{"pgscribe v1.2.3\n", "commit   abc123", "date     2026-01-02T03:04:05Z\n", "go       go1."} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("version output lacks %q:\n%s", want, b.String())
		}
	}
}

// srcDir is this package's source directory, read before any t.Chdir.
var srcDir, _ = os.Getwd()
