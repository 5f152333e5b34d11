package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/engine"
)

// TestW7ConfigsCompile renders every kind of W7 projection the way a run
// does and loads and compiles the result as `pgscribe run` would: a
// block the engine refused (two rules of one name, a bad key) would
// otherwise surface only minutes into a bench run.
func TestW7ConfigsCompile(t *testing.T) {
	tmpl, err := loadTemplate(filepath.Join("..", "config.toml.example"))
	if err != nil {
		t.Fatal(err)
	}
	b := &bench{opts: options{w7SlowMS: 1.3}, tmpl: tmpl}
	var targets []target
	targets = append(targets, b.w7Targets("p", 2)...)
	targets = append(targets, b.w7Targets("l", 2)...)
	tmpl.projections["w7s3"] = w7SlowBlock(3, b.opts.w7SlowMS)
	tmpl.projections["w7r3"] = w7Block("r", 3)
	targets = append(targets, target{projection: "w7s3", version: 1}, target{projection: "w7r3", version: 1})
	text, err := tmpl.render("postgres://bench@localhost/bench", targets, nil)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "w7.toml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	progs, err := engine.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(progs) != len(targets) {
		t.Fatalf("%d programs for %d projections", len(progs), len(targets))
	}
	for _, spec := range cfg.Projections {
		if spec.Name != "w7r3" {
			continue
		}
		if len(spec.Rules) != 3 {
			t.Fatalf("w7r3 has %d rules, want one per table", len(spec.Rules))
		}
		for i, r := range spec.Rules {
			if want := "w7_live_" + string(rune('1'+i)); r.Table != want {
				t.Errorf("w7r3 rule %d writes %s, want %s", i, r.Table, want)
			}
		}
	}
	ddl := w7DDL(targets)
	for _, table := range []string{"w7_counts_1", "w7_counts_2", "w7_live_1", "w7_live_2", "w7_live_3"} {
		if !strings.Contains(ddl, "EXISTS "+table+" ") {
			t.Errorf("the DDL creates no %s:\n%s", table, ddl)
		}
	}
}
