package config

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// versioned is a projection with the rebuild keys given, then one rule on
// table t; its keys start on line 4.
func versioned(keys string) string {
	return "[[projection]]\nname = \"p\"\nversion = 2\n" + keys +
		"[[projection.rule]]\nop = \"insert\"\ntable = \"t\"\nset = { a = \"id\" }\n"
}

func TestLoadRebuildKeys(t *testing.T) {
	clearEnv(t)
	path := writeConfig(t, versioned("schema = \"p_v2\"\nserve = \"public\"\nddl = \"sql/p_v2.sql\"\nstart_after_position = 42\n"))
	if err := os.MkdirAll(filepath.Join(filepath.Dir(path), "sql"), 0o700); err != nil {
		t.Fatal(err)
	}
	ddl := filepath.Join(filepath.Dir(path), "sql", "p_v2.sql")
	if err := os.WriteFile(ddl, []byte("CREATE TABLE IF NOT EXISTS t (a uuid);\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	p := c.Projections[0]
	if p.Schema != "p_v2" || p.Serve != "public" || p.DDL != ddl || p.StartAfterPosition != 42 {
		t.Errorf("got schema %q serve %q ddl %q start_after_position %d", p.Schema, p.Serve, p.DDL, p.StartAfterPosition)
	}
	if got := p.Qualify("t"); got != "p_v2.t" {
		t.Errorf("Qualify(t) = %q", got)
	}
	if got := p.Qualify("other.t"); got != "other.t" {
		t.Errorf("Qualify(other.t) = %q", got)
	}
	if got := p.Tables(); len(got) != 1 || got[0] != "p_v2.t" {
		t.Errorf("Tables() = %v", got)
	}
}

func TestLoadRebuildErrors(t *testing.T) {
	tests := []struct {
		name, keys, wantKey string
		wantLine            int
	}{
		{"schema not an identifier", "schema = \"P-2\"\n", "projection[0].schema", 4},
		{"serve without schema", "serve = \"public\"\n", "projection[0].serve", 4},
		{"serve equals schema", "schema = \"s\"\nserve = \"s\"\n", "projection[0].serve", 5},
		{"ddl without schema", "ddl = \"/dev/null\"\n", "projection[0].ddl", 4},
		{"ddl missing", "schema = \"s\"\nddl = \"nope.sql\"\n", "projection[0].ddl", 5},
		{"start_after_position zero", "start_after_position = 0\n", "projection[0].start_after_position", 4},
		{"start_after_position a string", "start_after_position = \"9\"\n", "projection[0].start_after_position", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			_, err := Load(writeConfig(t, versioned(tt.keys)))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Load() error = %v, want a *config.Error", err)
			}
			if e.Key != tt.wantKey || e.Line != tt.wantLine {
				t.Errorf("got %s line %d, want %s line %d (%v)", e.Key, e.Line, tt.wantKey, tt.wantLine, e)
			}
		})
	}
}

func TestLoadRebuildSharedSchema(t *testing.T) {
	clearEnv(t)
	src := versioned("schema = \"s\"\n") + "[[projection]]\nname = \"p\"\nversion = 3\nschema = \"s\"\n" +
		"[[projection.rule]]\nop = \"insert\"\ntable = \"t\"\nset = { a = \"id\" }\n"
	_, err := Load(writeConfig(t, src))
	var e *Error
	if !errors.As(err, &e) || e.Key != "projection[1].schema" || e.Line != 12 {
		t.Fatalf("Load() error = %v, want projection[1].schema at line 12", err)
	}
}

// TestLoadSettingsReadsDeployment: migrate's load has each version's
// schema and DDL file even when a rule is broken.
func TestLoadSettingsReadsDeployment(t *testing.T) {
	clearEnv(t)
	c, err := LoadSettings(writeConfig(t, "[[projection]]\nname = \"p\"\nversion = 2\nschema = \"s\"\nddl = \"/dev/null\"\n"+
		"[[projection.rule]]\nop = \"merge\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Projections) != 1 || c.Projections[0].Schema != "s" || c.Projections[0].DDL != "/dev/null" {
		t.Errorf("got %+v", c.Projections)
	}
}
