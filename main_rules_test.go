package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
)

// The example fixtures pass against config.toml.example's rules, with no
// database: `make test` runs them on every change to the rules or the
// engine.
func TestExampleFixtures(t *testing.T) {
	cfg := filepath.Join(srcDir, "config.toml.example")
	fixtures, err := filepath.Glob(filepath.Join(srcDir, "examples", "fixtures", "*.toml"))
	if err != nil || len(fixtures) == 0 {
		t.Fatalf("no example fixtures: %v", err)
	}
	var out, errOut bytes.Buffer
	err = run(append([]string{"test", "-config", cfg}, fixtures...), &out, &errOut)
	if err != nil {
		t.Fatalf("pgscribe test: exit %d: %v\n%s%s", exitCode(err), err, out.String(), errOut.String())
	}
	if got := strings.Count(out.String(), "ok    "); got != len(fixtures) {
		t.Errorf("want %d ok lines:\n%s", len(fixtures), out.String())
	}

	// A wrong expectation exits 1 with the diff; a bad fixture exits 2.
	src, err := os.ReadFile(filepath.Join(srcDir, "examples", "fixtures", "balances.toml"))
	if err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(t.TempDir(), "wrong.toml")
	if err := os.WriteFile(wrong, bytes.Replace(src, []byte("balance = 100,"), []byte("balance = 99,"), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	err = run([]string{"test", "-config", cfg, wrong}, &out, &errOut)
	if exitCode(err) != 1 || !strings.Contains(out.String(), "intent 1 (rule open): set.balance: want 99, got 100") {
		t.Errorf("wrong expectation: exit %d (want 1), %v\n%s", exitCode(err), err, out.String())
	}
	bad := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(bad, []byte("projection = \"balances\"\n\n[[event]]\ntype = \"AccountOpened\"\nstreem = \"a\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	err = run([]string{"test", "-config", cfg, bad}, &out, &errOut)
	if exitCode(err) != 2 || !strings.Contains(err.Error(), bad+":5: event[0].streem: unknown key") ||
		!strings.Contains(err.Error(), bad+":3: event[0].stream: is required") {
		t.Errorf("bad fixture: exit %d (want 2), %v", exitCode(err), err)
	}
}

// verify and test refuse what they cannot do with exit 2, before touching
// a database.
func TestRulesCommandsUsage(t *testing.T) {
	cfg := filepath.Join(srcDir, "config.toml.example")
	for _, args := range [][]string{
		{"test", "-config", cfg},
		{"test", "-bogus"},
		{"test", "-config", cfg, filepath.Join(t.TempDir(), "missing.toml")},
		{"verify", "-config", cfg},
		{"verify", "-config", cfg, "-projection", "balances"},
		{"verify", "-config", cfg, "-projection", "nope", "-version", "1"},
		{"verify", "-config", cfg, "-projection", "balances", "-version", "1", "extra"},
	} {
		var out, errOut bytes.Buffer
		if err := run(args, &out, &errOut); exitCode(err) != 2 {
			t.Errorf("pgscribe %s: exit %d (want 2): %v", strings.Join(args, " "), exitCode(err), err)
		}
	}
}

// config.toml.example shows every op once: the ops its tables have no use
// for are rules commented out with "#   ". Uncommented, the file still
// passes `check -offline`, and its rules use every op of event.Ops.
func TestExampleConfigEveryOp(t *testing.T) {
	src, err := os.ReadFile(filepath.Join(srcDir, "config.toml.example"))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, l := range strings.SplitAfter(string(src), "\n") {
		if rest, ok := strings.CutPrefix(l, "#   "); ok && !strings.HasPrefix(rest, " ") {
			l = "  " + rest
		}
		b.WriteString(l)
	}
	cfg := filepath.Join(t.TempDir(), "uncommented.toml")
	if err := os.WriteFile(cfg, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run([]string{"check", "-offline", "-config", cfg}, &out, &out); err != nil {
		t.Fatalf("check -offline of config.toml.example with its commented rules: %v\n%s", err, out.String())
	}
	c, err := config.Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, p := range c.Projections {
		for _, r := range p.Rules {
			used = append(used, r.Op)
		}
	}
	for _, op := range event.OpNames() {
		if !slices.Contains(used, op) {
			t.Errorf("config.toml.example has no rule with op = %q, not even commented out", op)
		}
	}
	// And every key, set or commented out ("# node = …").
	for _, k := range config.Keys() {
		name := k[strings.LastIndex(k, ".")+1:]
		if !regexp.MustCompile(`(?m)^[ #]*` + name + ` *=`).MatchString(b.String()) {
			t.Errorf("config.toml.example does not show the key %s", k)
		}
	}
}
