package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// marker tags the line an error must point at in test inputs.
const marker = "# HERE"

// writeConfig writes src to a fresh pgscribe.toml and returns its path.
func writeConfig(t *testing.T, src string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pgscribe.toml")
	if err := os.WriteFile(path, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// markedLine is the 1-based line of src holding marker, or 0.
func markedLine(t *testing.T, src string) int {
	t.Helper()
	for i, l := range strings.Split(src, "\n") {
		if strings.Contains(l, marker) {
			return i + 1
		}
	}
	return 0
}

// clearEnv unsets the variables Load and RequireDatabase read.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{EnvDatabaseURL, EnvConfig, EnvConsoleToken, "PGHOST", "PGSERVICE"} {
		t.Setenv(k, "")
	}
}

// rule wraps rule lines in a valid projection whose first rule header is on
// line 4, so rule keys start on line 5.
func rule(lines ...string) string {
	return "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]]\n" + strings.Join(lines, "\n") + "\n"
}

func TestLoadErrors(t *testing.T) {
	tests := []struct {
		name    string
		src     string
		wantErr bool
		wantKey string // key of the single error; its line is the marked one
	}{
		// Syntax.
		{name: "syntax error", src: "[engine]\nbatch_size = # HERE\n", wantErr: true, wantKey: "engine.batch_size"},
		{name: "duplicate key", src: "[log]\nlevel = \"info\"\nlevel = \"debug\" # HERE\n", wantErr: true, wantKey: "log.level"},

		// Unknown keys.
		{name: "unknown top-level key", src: "bogus = 1 # HERE\n", wantErr: true, wantKey: "bogus"},
		{name: "unknown table", src: "[engin] # HERE\nschema = \"x\"\n", wantErr: true, wantKey: "engin"},
		{name: "unknown engine key", src: "[engine]\nbatchsize = 3 # HERE\n", wantErr: true, wantKey: "engine.batchsize"},
		{name: "unknown column key", src: "[source.columns]\nstream = \"s\" # HERE\n", wantErr: true, wantKey: "source.columns.stream"},
		{
			name: "unknown rule key in second rule",
			src: rule(`op = "insert"`, `table = "t"`, `set = { a = "id" }`,
				`[[projection.rule]]`, `op = "insert"`, `table = "t"`, `tabel = "t" `+marker, `set = { a = "id" }`),
			wantErr: true, wantKey: "projection[0].rule[1].tabel",
		},
		{
			name:    "unknown key in second projection",
			src:     rule(`op = "sql"`, `sql = "SELECT 1"`) + strings.Replace(rule(`op = "sql"`, `sql = "SELECT 1"`, `when = "true"`, `whn = "x" `+marker), `"p"`, `"q"`, 1),
			wantErr: true, wantKey: "projection[1].rule[0].whn",
		},

		// Types and values.
		{name: "section not a table", src: "engine = 5 # HERE\n", wantErr: true, wantKey: "engine"},
		{name: "url not a string", src: "[database]\nurl = 5 # HERE\n", wantErr: true, wantKey: "database.url"},
		{name: "parallelism a string", src: "[engine]\nparallelism = \"4\" # HERE\n", wantErr: true, wantKey: "engine.parallelism"},
		{name: "parallelism zero", src: "[engine]\nparallelism = 0 # HERE\n", wantErr: true, wantKey: "engine.parallelism"},
		{name: "batch_size zero", src: "[engine]\nbatch_size = 0 # HERE\n", wantErr: true, wantKey: "engine.batch_size"},
		{name: "backfill_batch_size negative", src: "[engine]\nbackfill_batch_size = -5 # HERE\n", wantErr: true, wantKey: "engine.backfill_batch_size"},
		{name: "queue_size zero", src: "[engine]\nqueue_size = 0 # HERE\n", wantErr: true, wantKey: "engine.queue_size"},
		{name: "max_active_projections negative", src: "[engine]\nmax_active_projections = -1 # HERE\n", wantErr: true, wantKey: "engine.max_active_projections"},
		{name: "max_active_projections zero", src: "[engine]\nmax_active_projections = 0\n"},
		{name: "schema empty", src: "[engine]\nschema = \"\" # HERE\n", wantErr: true, wantKey: "engine.schema"},
		{name: "node empty", src: "[engine]\nnode = \"\" # HERE\n", wantErr: true, wantKey: "engine.node"},
		{name: "duration without unit", src: "[engine]\nbatch_timeout = \"20\" # HERE\n", wantErr: true, wantKey: "engine.batch_timeout"},
		{name: "duration as integer", src: "[engine]\nstandby_poll = 5 # HERE\n", wantErr: true, wantKey: "engine.standby_poll"},
		{name: "duration negative", src: "[engine]\nstall_timeout = \"-1s\" # HERE\n", wantErr: true, wantKey: "engine.stall_timeout"},
		{name: "duration zero", src: "[engine]\nlag_interval = \"0s\" # HERE\n", wantErr: true, wantKey: "engine.lag_interval"},
		{name: "retry max_attempts negative", src: "[retry]\nmax_attempts = -1 # HERE\n", wantErr: true, wantKey: "retry.max_attempts"},
		{name: "retry max_attempts zero means forever", src: "[retry]\nmax_attempts = 0\n"},
		{name: "max_backoff below backoff", src: "[retry]\nbackoff = \"2s\"\nmax_backoff = \"1s\" # HERE\n", wantErr: true, wantKey: "retry.max_backoff"},
		{name: "backoff above default max_backoff", src: "[retry]\nbackoff = \"1m\" # HERE\n", wantErr: true, wantKey: "retry.backoff"},
		{name: "metrics listen without port", src: "[metrics]\nlisten = \"localhost\" # HERE\n", wantErr: true, wantKey: "metrics.listen"},
		{name: "metrics listen off", src: "[metrics]\nlisten = \"off\"\n"},
		{name: "metrics listen any interface", src: "[metrics]\nlisten = \":9187\"\n"},
		{name: "console off", src: "[metrics]\nconsole = false\n"},
		{name: "console not a boolean", src: "[metrics]\nconsole = \"yes\" # HERE\n", wantErr: true, wantKey: "metrics.console"},
		{name: "console token and header", src: "[metrics]\nconsole_token = \"s3cret\"\nconsole_auth_header = \"X-Forwarded-User\"\n"},
		{name: "console auth header not a header name", src: "[metrics]\nconsole_auth_header = \"X User:\" # HERE\n", wantErr: true, wantKey: "metrics.console_auth_header"},
		{name: "console unknown key", src: "[metrics]\nconsole_tokn = \"x\" # HERE\n", wantErr: true, wantKey: "metrics.console_tokn"},
		{name: "log level unknown", src: "[log]\nlevel = \"verbose\" # HERE\n", wantErr: true, wantKey: "log.level"},
		{name: "log format unknown", src: "[log]\nformat = \"xml\" # HERE\n", wantErr: true, wantKey: "log.format"},
		{name: "slot_prefix upper case", src: "[source]\nslot_prefix = \"Pg\" # HERE\n", wantErr: true, wantKey: "source.slot_prefix"},
		{name: "publication empty", src: "[source]\npublication = \"\" # HERE\n", wantErr: true, wantKey: "source.publication"},
		{name: "publication too long", src: "[source]\npublication = \"" + strings.Repeat("p", 64) + "\" # HERE\n", wantErr: true, wantKey: "source.publication"},
		{name: "column empty", src: "[source.columns]\nstream_id = \"\" # HERE\n", wantErr: true, wantKey: "source.columns.stream_id"},
		{name: "optional columns absent", src: "[source.columns]\nid = \"\"\nmetadata = \"\"\noccurred_at = \"\"\n"},
		{name: "column mapped twice", src: "[source.columns]\nid = \"position\" # HERE\n", wantErr: true, wantKey: "source.columns.id"},
		{name: "columns remapped", src: "[source.columns]\nid = \"event_id\"\nposition = \"seq\"\n"},

		// Projections.
		{name: "projection not an array", src: "[projection] # HERE\nname = \"p\"\n", wantErr: true, wantKey: "projection"},
		{name: "projection name missing", src: "[[projection]] # HERE\nversion = 1\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].name"},
		{name: "projection version missing", src: "[[projection]] # HERE\nname = \"p\"\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].version"},
		{name: "projection version zero", src: "[[projection]]\nname = \"p\"\nversion = 0 # HERE\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].version"},
		{name: "projection version a string", src: "[[projection]]\nname = \"p\"\nversion = \"1\" # HERE\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].version"},
		{name: "projection name upper case", src: "[[projection]]\nname = \"Balances\" # HERE\nversion = 1\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].name"},
		{name: "projection name starts with digit", src: "[[projection]]\nname = \"1p\" # HERE\nversion = 1\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].name"},
		{name: "projection slot name too long", src: "[[projection]]\nname = \"" + strings.Repeat("a", 64-len("pgscribe__v1")) + "\" # HERE\nversion = 1\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].name"},
		{name: "projection slot name just fits", src: "[[projection]]\nname = \"" + strings.Repeat("a", 63-len("pgscribe__v1")) + "\"\nversion = 1\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n"},
		{name: "projection duplicate name and version", src: rule(`op = "sql"`, `sql = "SELECT 1"`) + "[[projection]]\nname = \"p\" " + marker + "\nversion = 1\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[1].name"},
		{name: "projection same name new version", src: rule(`op = "sql"`, `sql = "SELECT 1"`) + "[[projection]]\nname = \"p\"\nversion = 2\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n"},
		{name: "projection on_error unknown", src: "[[projection]]\nname = \"p\"\nversion = 1\non_error = \"skip\" # HERE\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n", wantErr: true, wantKey: "projection[0].on_error"},
		{name: "projection on_error halt", src: "[[projection]]\nname = \"p\"\nversion = 1\non_error = \"halt\"\n[[projection.rule]]\nop = \"sql\"\nsql = \"SELECT 1\"\n"},
		{name: "projection without rules", src: "[[projection]] # HERE\nname = \"p\"\nversion = 1\n", wantErr: true, wantKey: "projection[0].rule"},
		{name: "projection rule not a table array", src: "[[projection]]\nname = \"p\"\nversion = 1\nrule = 5 # HERE\n", wantErr: true, wantKey: "projection[0].rule"},

		// Rules: op.
		{name: "rule op missing", src: "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]] # HERE\ntable = \"t\"\n", wantErr: true, wantKey: "projection[0].rule[0].op"},
		{name: "rule op unknown", src: rule(`op = "merge" `+marker, `table = "t"`), wantErr: true, wantKey: "projection[0].rule[0].op"},
		{name: "rule op not a string", src: rule(`op = 1 `+marker, `table = "t"`), wantErr: true, wantKey: "projection[0].rule[0].op"},

		// Rules: fields per op.
		{name: "insert ok", src: rule(`op = "insert"`, `table = "t"`, `set = { a = "id" }`)},
		{name: "insert with key ok", src: rule(`op = "insert"`, `table = "t"`, `key = { id = "id" }`, `inc = { n = "1" }`)},
		{name: "insert table missing", src: "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]] # HERE\nop = \"insert\"\nset = { a = \"id\" }\n", wantErr: true, wantKey: "projection[0].rule[0].table"},
		{name: "insert table empty", src: rule(`op = "insert"`, `table = "" `+marker, `set = { a = "id" }`), wantErr: true, wantKey: "projection[0].rule[0].table"},
		{name: "insert key, set and inc missing", src: "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]] # HERE\nop = \"insert\"\ntable = \"t\"\n", wantErr: true, wantKey: "projection[0].rule[0].key"},
		{name: "insert key only ok", src: rule(`op = "insert"`, `table = "t"`, `key = { id = "id" }`)},
		{name: "upsert key only ok", src: rule(`op = "upsert"`, `table = "t"`, `key = { id = "id" }`)},
		{name: "update if_missing ok", src: rule(`op = "update"`, `table = "t"`, `key = { id = "id" }`, `set = { a = "id" }`, `if_missing = "dead_letter"`)},
		{name: "delete if_missing ok", src: rule(`op = "delete"`, `table = "t"`, `key = { id = "id" }`, `if_missing = "ignore"`)},
		{name: "insert with if_missing", src: rule(`op = "insert"`, `table = "t"`, `key = { id = "id" }`, `if_missing = "ignore" `+marker), wantErr: true, wantKey: "projection[0].rule[0].if_missing"},
		{name: "if_missing unknown", src: rule(`op = "delete"`, `table = "t"`, `key = { id = "id" }`, `if_missing = "halt" `+marker), wantErr: true, wantKey: "projection[0].rule[0].if_missing"},
		{name: "update set empty", src: rule(`op = "update"`, `table = "t"`, `key = { id = "id" }`, `set = {} `+marker), wantErr: true, wantKey: "projection[0].rule[0].set"},
		{name: "update inc only ok", src: rule(`op = "update"`, `table = "t"`, `key = { id = "id" }`, `inc = { n = "1" }`)},
		{name: "upsert key missing", src: "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]] # HERE\nop = \"upsert\"\ntable = \"t\"\nset = { a = \"id\" }\n", wantErr: true, wantKey: "projection[0].rule[0].key"},
		{name: "update key empty", src: rule(`op = "update"`, `table = "t"`, `key = {} `+marker, `set = { a = "id" }`), wantErr: true, wantKey: "projection[0].rule[0].key"},
		{name: "delete ok", src: rule(`op = "delete"`, `table = "t"`, `key = { id = "id" }`)},
		{name: "delete key missing", src: "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]] # HERE\nop = \"delete\"\ntable = \"t\"\n", wantErr: true, wantKey: "projection[0].rule[0].key"},
		{name: "delete with inc", src: rule(`op = "delete"`, `table = "t"`, `key = { id = "id" }`, `inc = { n = "1" } `+marker), wantErr: true, wantKey: "projection[0].rule[0].inc"},
		{name: "delete with set", src: rule(`op = "delete"`, `table = "t"`, `key = { id = "id" }`, `set = { n = "1" } `+marker), wantErr: true, wantKey: "projection[0].rule[0].set"},
		{name: "sql ok with args", src: rule(`op = "sql"`, `sql = "UPDATE t SET n = n + $1"`, `args = ["data.n"]`)},
		{name: "sql missing", src: "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]] # HERE\nop = \"sql\"\n", wantErr: true, wantKey: "projection[0].rule[0].sql"},
		{name: "sql with table", src: rule(`op = "sql"`, `sql = "SELECT 1"`, `table = "t" `+marker), wantErr: true, wantKey: "projection[0].rule[0].table"},
		{name: "sql with key", src: rule(`op = "sql"`, `sql = "SELECT 1"`, `key = { id = "id" } `+marker), wantErr: true, wantKey: "projection[0].rule[0].key"},
		{name: "sql with set", src: rule(`op = "sql"`, `sql = "SELECT 1"`, `set = { a = "id" } `+marker), wantErr: true, wantKey: "projection[0].rule[0].set"},
		{name: "sql args not strings", src: rule(`op = "sql"`, `sql = "SELECT $1"`, `args = ["id", 2] `+marker), wantErr: true, wantKey: "projection[0].rule[0].args[1]"},
		{name: "args with update", src: rule(`op = "update"`, `table = "t"`, `key = { id = "id" }`, `set = { a = "id" }`, `args = ["id"] `+marker), wantErr: true, wantKey: "projection[0].rule[0].args"},
		{name: "fail ok", src: rule(`op = "fail"`, `message = "'bad'"`)},
		{name: "fail message missing", src: "[[projection]]\nname = \"p\"\nversion = 1\n[[projection.rule]] # HERE\nop = \"fail\"\n", wantErr: true, wantKey: "projection[0].rule[0].message"},
		{name: "fail with table", src: rule(`op = "fail"`, `message = "'bad'"`, `table = "t" `+marker), wantErr: true, wantKey: "projection[0].rule[0].table"},
		{name: "message with insert", src: rule(`op = "insert"`, `table = "t"`, `set = { a = "id" }`, `message = "'x'" `+marker), wantErr: true, wantKey: "projection[0].rule[0].message"},

		// Rules: on, when, names, columns.
		{name: "on list ok", src: rule(`on = ["A", "B"]`, `op = "fail"`, `message = "'x'"`)},
		{name: "on empty string", src: rule(`on = "" `+marker, `op = "fail"`, `message = "'x'"`), wantErr: true, wantKey: "projection[0].rule[0].on"},
		{name: "on empty list", src: rule(`on = [] `+marker, `op = "fail"`, `message = "'x'"`), wantErr: true, wantKey: "projection[0].rule[0].on"},
		{name: "on list with empty type", src: rule(`on = ["A", ""] `+marker, `op = "fail"`, `message = "'x'"`), wantErr: true, wantKey: "projection[0].rule[0].on[1]"},
		{name: "on list with number", src: rule(`on = ["A", 3] `+marker, `op = "fail"`, `message = "'x'"`), wantErr: true, wantKey: "projection[0].rule[0].on[1]"},
		{name: "on a number", src: rule(`on = 3 `+marker, `op = "fail"`, `message = "'x'"`), wantErr: true, wantKey: "projection[0].rule[0].on"},
		{name: "when empty", src: rule(`when = "" `+marker, `op = "fail"`, `message = "'x'"`), wantErr: true, wantKey: "projection[0].rule[0].when"},
		{name: "duplicate rule names", src: rule(`name = "r"`, `op = "fail"`, `message = "'x'"`, `[[projection.rule]]`, `name = "r" `+marker, `op = "fail"`, `message = "'y'"`), wantErr: true, wantKey: "projection[0].rule[1].name"},
		{name: "same rule name in two projections ok", src: rule(`name = "r"`, `op = "fail"`, `message = "'x'"`) + strings.Replace(rule(`name = "r"`, `op = "fail"`, `message = "'x'"`), `"p"`, `"q"`, 1)},
		{name: "column in key and set", src: rule(`op = "upsert"`, `table = "t"`, `key = { id = "id" }`, `set = { id = "id", a = "1" } `+marker), wantErr: true, wantKey: "projection[0].rule[0].set.id"},
		{name: "column in set and inc", src: rule(`op = "upsert"`, `table = "t"`, `key = { id = "id" }`, `set = { n = "1" }`, `inc = { n = "1" } `+marker), wantErr: true, wantKey: "projection[0].rule[0].inc.n"},
		{name: "column expression not a string", src: rule(`op = "insert"`, `table = "t"`, `set = { a = 1 } `+marker), wantErr: true, wantKey: "projection[0].rule[0].set.a"},
		{name: "column expression empty", src: rule(`op = "insert"`, `table = "t"`, `set = { a = " " } `+marker), wantErr: true, wantKey: "projection[0].rule[0].set.a"},
		{name: "quoted column name", src: rule(`op = "insert"`, `table = "t"`, `set = { "my col" = 1 } `+marker), wantErr: true, wantKey: `projection[0].rule[0].set."my col"`},
		{name: "set not a table", src: rule(`op = "insert"`, `table = "t"`, `set = "a" `+marker), wantErr: true, wantKey: "projection[0].rule[0].set"},

		// Line tracking through other TOML forms.
		{
			name:    "inline array of projections",
			src:     "projection = [\n  { name = \"p\", version = 1, rule = [{ op = \"sql\", sql = \"SELECT 1\" }] },\n  { name = \"q\", version = 1, rule = [{ op = \"merge\" }] }, # HERE\n]\n",
			wantErr: true, wantKey: "projection[1].rule[0].op",
		},
		{
			name:    "multi-line string hides look-alike lines",
			src:     rule(`op = "sql"`, `sql = """`, `[[projection.rule]]`, `tabel = 1`, `"""`, `[[projection.rule]]`, `op = "sql"`, `sql = '''`, `x = '''`, `tabel = "t" `+marker),
			wantErr: true, wantKey: "projection[0].rule[1].tabel",
		},
		{
			name: "multi-line array and inline table",
			src: rule(`op = "sql"`, `sql = "SELECT $1, $2"`, `args = [`, `  "id", # a comment with [brackets] and = signs`, `  "type",`, `]`,
				`[[projection.rule]]`, `op = "insert"`, `table = "t"`, `set = { a = "id",`, `  b = "type" }`, `whn = "x" `+marker),
			wantErr: true, wantKey: "projection[0].rule[1].whn",
		},
		{
			name:    "dotted keys",
			src:     "engine.parallelism = 2\nengine.batch_timeout = \"soon\" # HERE\n",
			wantErr: true, wantKey: "engine.batch_timeout",
		},
		{
			name:    "nested table header under array element",
			src:     rule(`op = "insert"`, `table = "t"`, `[projection.rule.set]`, `a = "id"`, `b = 2 `+marker),
			wantErr: true, wantKey: "projection[0].rule[0].set.b",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			_, err := Load(writeConfig(t, tt.src))
			if (err != nil) != tt.wantErr {
				t.Fatalf("Load() error = %v, wantErr %v", err, tt.wantErr)
			}
			if !tt.wantErr {
				return
			}
			var all Errors
			if !errors.As(err, &all) || len(all) != 1 {
				t.Fatalf("want exactly one problem, got %v", err)
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v is not a *config.Error", err)
			}
			wantLine := markedLine(t, tt.src)
			if e.Line != wantLine || e.Key != tt.wantKey {
				t.Errorf("got line %d key %q, want line %d key %q (%v)", e.Line, e.Key, wantLine, tt.wantKey, e)
			}
			if !strings.HasSuffix(e.File, "pgscribe.toml") {
				t.Errorf("File = %q, want the loaded path", e.File)
			}
		})
	}
}

func TestLoadReportsAllProblemsSortedByLine(t *testing.T) {
	clearEnv(t)
	src := `[[projection]]
name = "p"
version = 1
  [[projection.rule]]
  op = "upsert"
  tabel = "t"
  set = { a = "id" }

[engine]
parallelism = 0
batch_timeout = "soon"

[log]
level = "loud"
`
	_, err := Load(writeConfig(t, src))
	var all Errors
	if !errors.As(err, &all) {
		t.Fatalf("want Errors, got %v", err)
	}
	type pos struct {
		line int
		key  string
	}
	want := []pos{
		{4, "projection[0].rule[0].table"},
		{4, "projection[0].rule[0].key"},
		{6, "projection[0].rule[0].tabel"},
		{10, "engine.parallelism"},
		{11, "engine.batch_timeout"},
		{14, "log.level"},
	}
	var got []pos
	for _, e := range all {
		got = append(got, pos{e.Line, e.Key})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("problems = %v\nwant %v", got, want)
	}
}

func TestLoadUnreadableFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing.toml")
	_, err := Load(path)
	if !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("errors.Is(%v, fs.ErrNotExist) = false", err)
	}
	var e *Error
	if !errors.As(err, &e) || e.File != path {
		t.Errorf("want *Error for %s, got %v", path, err)
	}
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{name: "all parts", err: &Error{File: "a.toml", Line: 3, Key: "engine.batch_size", Msg: "bad"}, want: "a.toml:3: engine.batch_size: bad"},
		{name: "unknown line", err: &Error{File: "a.toml", Key: "database.url", Msg: "bad"}, want: "a.toml: database.url: bad"},
		{name: "no key", err: &Error{File: "a.toml", Line: 2, Msg: "bad"}, want: "a.toml:2: bad"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestLoadDefaults(t *testing.T) {
	clearEnv(t)
	c, err := Load(writeConfig(t, ""))
	if err != nil {
		t.Fatal(err)
	}
	want := Default()
	want.Path = c.Path
	want.lines = c.lines
	if fmt.Sprintf("%+v", *c) != fmt.Sprintf("%+v", *want) {
		t.Errorf("empty file loads to\n%+v\nwant defaults\n%+v", *c, *want)
	}
	host, err := os.Hostname()
	if err == nil && c.Engine.Node != host {
		t.Errorf("Engine.Node = %q, want host name %q", c.Engine.Node, host)
	}

	checks := []struct {
		name      string
		got, want any
	}{
		{"source table", c.Source.Table, "events"},
		{"publication", c.Source.Publication, "pgscribe_events"},
		{"slot prefix", c.Source.SlotPrefix, "pgscribe"},
		{"columns", c.Source.Columns, Columns{"position", "id", "stream_id", "stream_position", "type", "data", "metadata", "occurred_at"}},
		{"schema", c.Engine.Schema, "pgscribe"},
		{"parallelism", c.Engine.Parallelism, 4},
		{"batch size", c.Engine.BatchSize, 500},
		{"batch timeout", c.Engine.BatchTimeout, 20 * time.Millisecond},
		{"backfill batch size", c.Engine.BackfillBatchSize, 5000},
		{"queue size", c.Engine.QueueSize, 2500},
		{"standby poll", c.Engine.StandbyPoll, 5 * time.Second},
		{"lease timeout", c.Engine.LeaseTimeout, 15 * time.Second},
		{"lag interval", c.Engine.LagInterval, 5 * time.Second},
		{"stall timeout", c.Engine.StallTimeout, 30 * time.Second},
		{"status interval", c.Engine.StatusInterval, 10 * time.Second},
		{"shutdown timeout", c.Engine.ShutdownTimeout, 30 * time.Second},
		{"max active projections", c.Engine.MaxActiveProjections, 0},
		{"retry attempts", c.Retry.MaxAttempts, 5},
		{"retry backoff", c.Retry.Backoff, 200 * time.Millisecond},
		{"retry max backoff", c.Retry.MaxBackoff, 30 * time.Second},
		{"metrics listen", c.Metrics.Listen, "127.0.0.1:9187"},
		{"console", c.Metrics.Console, true},
		{"console token", c.Metrics.ConsoleToken, ""},
		{"log level", c.Log.Level, "info"},
		{"log format", c.Log.Format, "text"},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestLoadDerivedAndExplicitValues(t *testing.T) {
	tests := []struct {
		name      string
		src       string
		wantQueue int
	}{
		{name: "queue follows backfill batch size", src: "[engine]\nbatch_size = 100\n", wantQueue: 2500},
		{name: "queue follows batch size", src: "[engine]\nbatch_size = 100\nbackfill_batch_size = 300\n", wantQueue: 200},
		{name: "queue follows a large batch size", src: "[engine]\nbatch_size = 2000\n", wantQueue: 4000},
		{name: "explicit queue size", src: "[engine]\nbatch_size = 100\nqueue_size = 7\n", wantQueue: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			c, err := Load(writeConfig(t, tt.src))
			if err != nil {
				t.Fatal(err)
			}
			if c.Engine.QueueSize != tt.wantQueue {
				t.Errorf("QueueSize = %d, want %d", c.Engine.QueueSize, tt.wantQueue)
			}
		})
	}
}

func TestLoadProjection(t *testing.T) {
	clearEnv(t)
	src := `[source]
slot_prefix = "ps"

[[projection]]
name = "balances"
version = 3

  [[projection.rule]]
  name = "open"
  on = "AccountOpened"
  when = "data.initial >= 0"
  op = "upsert"
  table = "balances"
  key = { account_id = "data.account_id" }
  set = { owner = "data.owner" }
  inc = { balance = "data.initial" }

  [[projection.rule]]
  on = ["Deposited", "Withdrawn"]
  op = "sql"
  sql = "SELECT $1"
  args = ["data.amount"]
`
	c, err := Load(writeConfig(t, src))
	if err != nil {
		t.Fatal(err)
	}
	want := []rules.Spec{{
		Name: "balances", Version: 3, OnError: rules.OnErrorDeadLetter,
		Rules: []rules.RuleSpec{
			{
				Name: "open", On: "AccountOpened", When: "data.initial >= 0", Op: "upsert", Table: "balances",
				Key: map[string]string{"account_id": "data.account_id"},
				Set: map[string]string{"owner": "data.owner"},
				Inc: map[string]string{"balance": "data.initial"},
			},
			{On: []any{"Deposited", "Withdrawn"}, Op: "sql", SQL: "SELECT $1", Args: []string{"data.amount"}},
		},
	}}
	if fmt.Sprintf("%#v", c.Projections) != fmt.Sprintf("%#v", want) {
		t.Errorf("Projections = %#v\nwant %#v", c.Projections, want)
	}
	if got := c.SlotName(c.Projections[0]); got != "ps_balances_v3" {
		t.Errorf("SlotName = %q, want ps_balances_v3", got)
	}
}

func TestDatabaseURL(t *testing.T) {
	tests := []struct {
		name       string
		src        string
		env        map[string]string
		wantURL    string
		wantTarget string
		wantErr    bool
		wantLine   int
	}{
		{name: "from file", src: "[database]\nurl = \"postgres://file\"\n", wantURL: "postgres://file", wantTarget: "postgres://file"},
		{name: "env overrides file", src: "[database]\nurl = \"postgres://file\"\n", env: map[string]string{EnvDatabaseURL: "postgres://env"}, wantURL: "postgres://env", wantTarget: "postgres://env"},
		{name: "env without file", src: "", env: map[string]string{EnvDatabaseURL: "postgres://env"}, wantURL: "postgres://env", wantTarget: "postgres://env"},
		{name: "separate target", src: "[database]\nurl = \"postgres://src\"\ntarget_url = \"postgres://dst\"\n", wantURL: "postgres://src", wantTarget: "postgres://dst"},
		{name: "libpq environment", src: "", env: map[string]string{"PGHOST": "/run/postgresql"}},
		{name: "missing, no database table", src: "[engine]\nparallelism = 2\n", wantErr: true, wantLine: 0},
		{name: "missing, empty database table", src: "[engine]\nparallelism = 2\n[database]\ntarget_url = \"postgres://dst\"\n", wantTarget: "postgres://dst", wantErr: true, wantLine: 3},
		{name: "empty url", src: "[database]\nurl = \"\"\n", wantErr: true, wantLine: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			c, err := Load(writeConfig(t, tt.src))
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			if c.Database.URL != tt.wantURL || c.TargetURL() != tt.wantTarget {
				t.Errorf("URL, TargetURL() = %q, %q; want %q, %q", c.Database.URL, c.TargetURL(), tt.wantURL, tt.wantTarget)
			}
			err = c.RequireDatabase()
			if (err != nil) != tt.wantErr {
				t.Fatalf("RequireDatabase() error = %v, wantErr %v", err, tt.wantErr)
			}
			var e *Error
			if tt.wantErr && (!errors.As(err, &e) || e.Key != "database.url" || e.Line != tt.wantLine) {
				t.Errorf("RequireDatabase() = %v, want *Error at line %d key database.url", err, tt.wantLine)
			}
		})
	}
}

func TestConfigPath(t *testing.T) {
	tests := map[string]struct{ flag, env, want string }{
		"flag wins": {flag: "/etc/a.toml", env: "/etc/b.toml", want: "/etc/a.toml"},
		"env":       {env: "/etc/b.toml", want: "/etc/b.toml"},
		"default":   {want: "./pgscribe.toml"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Setenv(EnvConfig, tt.env)
			if got := ConfigPath(tt.flag); got != tt.want {
				t.Errorf("ConfigPath(%q) with %s=%q = %q, want %q", tt.flag, EnvConfig, tt.env, got, tt.want)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	// What is printed for each connection string.
	redacted := map[string]string{
		"postgres://app:s3cret@db:5432/x?sslmode=disable": "postgres://app:xxxxx@db:5432/x?sslmode=disable",
		"postgres://app@db/x":                             "postgres://app@db/x",
		"postgresql://db/x":                               "postgresql://db/x",
		// raw @ and / in the password
		"postgres://app:p@ss/w@db/x":                                      "postgres://app:xxxxx@db/x",
		"postgres://db/x?password=s3cret&sslpassword=k3y&sslmode=require": "postgres://db/x?password=xxxxx&sslpassword=xxxxx&sslmode=require",
		"postgres://app:s3cret@h1:5432,h2:5432/x":                         "postgres://app:xxxxx@h1:5432,h2:5432/x",
		"host=db user=app password=s3cret dbname=x":                       "host=db user=app password=xxxxx dbname=x",
		// quoted keyword/value password
		"host=db password = 'a b\\' c' dbname=x": "host=db password = xxxxx dbname=x",
		// password first, and sslpassword
		"password=s3cret sslpassword=k3y": "password=xxxxx sslpassword=xxxxx",
		"":                                "",
	}
	for dsn, want := range redacted {
		if got := RedactURL(dsn); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", dsn, got, want)
		}
	}
}

func TestConfigPrintingHidesPasswords(t *testing.T) {
	clearEnv(t)
	c, err := Load(writeConfig(t, "[database]\nurl = \"postgres://app:s3cret@db/x\"\ntarget_url = \"host=db password=t0p\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "database", c.Database)
	for _, out := range []string{fmt.Sprintf("%v", c), fmt.Sprintf("%+v", *c), fmt.Sprint(c.Database), logged.String()} {
		if strings.Contains(out, "s3cret") || strings.Contains(out, "t0p") {
			t.Errorf("password leaked: %s", out)
		}
	}
}

func TestMetricsEnabled(t *testing.T) {
	tests := []struct {
		listen string
		want   bool
	}{{"127.0.0.1:9187", true}, {":9187", true}, {"", false}, {"off", false}}
	for _, tt := range tests {
		if got := (Metrics{Listen: tt.listen}).Enabled(); got != tt.want {
			t.Errorf("Metrics{Listen: %q}.Enabled() = %v, want %v", tt.listen, got, tt.want)
		}
	}
}

func TestExampleLoads(t *testing.T) {
	clearEnv(t)
	c, err := Load(filepath.Join("..", "config.toml.example"))
	if err != nil {
		t.Fatalf("config.toml.example: %v", err)
	}
	var names []string
	for _, p := range c.Projections {
		names = append(names, fmt.Sprintf("%s_v%d", p.Name, p.Version))
	}
	if got := strings.Join(names, ","); got != "balances_v1,activity_v1" {
		t.Errorf("example projections = %s, want balances_v1,activity_v1", got)
	}
	if err := c.RequireDatabase(); err != nil {
		t.Errorf("example has no database url: %v", err)
	}
	for _, p := range c.Projections {
		if _, err := rules.Compile(p); err != nil {
			t.Errorf("example projection %s does not compile: %v", p.Name, err)
		}
	}
	def := Default()
	def.Path, def.lines, def.Database, def.Projections = c.Path, c.lines, c.Database, c.Projections
	if fmt.Sprintf("%+v", *c) != fmt.Sprintf("%+v", *def) {
		t.Errorf("example settings differ from the defaults:\n%+v\n%+v", *c, *def)
	}
}

// TestExampleMatchesDemoSchema checks that every table and column the
// example's rules write exists in examples/demo/schema.sql.
func TestExampleMatchesDemoSchema(t *testing.T) {
	clearEnv(t)
	c, err := Load(filepath.Join("..", "config.toml.example"))
	if err != nil {
		t.Fatal(err)
	}
	schema, err := os.ReadFile(filepath.Join("..", "examples", "demo", "schema.sql"))
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string]map[string]bool{}
	tableRE := regexp.MustCompile(`(?s)CREATE TABLE IF NOT EXISTS (\w+) \((.*?)\n\);`)
	colRE := regexp.MustCompile(`(?m)^\s+(\w+)\s`)
	for _, m := range tableRE.FindAllStringSubmatch(string(schema), -1) {
		tables[m[1]] = map[string]bool{}
		for _, col := range colRE.FindAllStringSubmatch(m[2], -1) {
			tables[m[1]][col[1]] = true
		}
	}
	for _, p := range c.Projections {
		for i, r := range p.Rules {
			if r.Table == "" {
				continue
			}
			cols, ok := tables[r.Table]
			if !ok {
				t.Errorf("%s rule %d: table %s not in schema.sql", p.Name, i, r.Table)
				continue
			}
			for _, group := range []map[string]string{r.Key, r.Set, r.Inc} {
				for col := range group {
					if !cols[col] {
						t.Errorf("%s rule %d: column %s.%s not in schema.sql", p.Name, i, r.Table, col)
					}
				}
			}
		}
	}
}

func TestIndexLines(t *testing.T) {
	src := `top = 1
"quoted key" = 2
[a.b]
c = """
d = 1
"""
e = [
  { f = 1 },
  { f = 2 },
]
[[arr]]
[arr.sub]
g = 1
[[arr]]
h.i = 'x' # trailing [comment]
`
	tests := []struct {
		path keyPath
		want int
	}{
		{keyPath{"top"}, 1},
		{keyPath{}.key("quoted key"), 2},
		{keyPath{"a"}, 3},
		{keyPath{"a", "b", "c"}, 4},
		{keyPath{"a", "b", "d"}, 3}, // inside the string: not a key, falls back to [a.b]
		{keyPath{"a", "b", "e", "[1]", "f"}, 9},
		{keyPath{"arr", "[0]", "sub", "g"}, 13},
		{keyPath{"arr", "[1]"}, 14},
		{keyPath{"arr", "[1]", "h", "i"}, 15},
		{keyPath{"arr", "[1]", "missing"}, 14},
		{keyPath{"nowhere"}, 0},
	}
	ix := indexLines(src)
	for _, tt := range tests {
		t.Run(tt.path.String(), func(t *testing.T) {
			if got := ix.line(tt.path); got != tt.want {
				t.Errorf("line(%s) = %d, want %d", tt.path, got, tt.want)
			}
		})
	}
}

// TestExampleRulesOnDemoEvents runs the example's compiled rules over the
// demo's event types: each valid event yields its writes, and a
// non-positive amount dead-letters the event.
func TestExampleRulesOnDemoEvents(t *testing.T) {
	clearEnv(t)
	c, err := Load(filepath.Join("..", "config.toml.example"))
	if err != nil {
		t.Fatal(err)
	}
	programs := map[string]*rules.Program{}
	for _, p := range c.Projections {
		prog, err := rules.Compile(p)
		if err != nil {
			t.Fatal(err)
		}
		programs[p.Name] = prog
	}
	tests := []struct {
		name        string
		typ         string
		data        map[string]any
		wantErr     bool // balances dead-letters the event
		wantChanges []string
		wantAmount  int64 // activity's amount column
	}{
		{name: "open", typ: "AccountOpened", data: map[string]any{"account_id": "a1", "owner": "ann", "initial": int64(100)}, wantChanges: []string{"upsert balances"}, wantAmount: 100},
		{name: "open negative", typ: "AccountOpened", data: map[string]any{"account_id": "a1", "owner": "ann", "initial": int64(-1)}, wantErr: true, wantAmount: -1},
		{name: "deposit", typ: "Deposited", data: map[string]any{"account_id": "a1", "amount": int64(50)}, wantChanges: []string{"update balances"}, wantAmount: 50},
		{name: "withdraw", typ: "Withdrawn", data: map[string]any{"account_id": "a1", "amount": int64(20)}, wantChanges: []string{"update balances"}, wantAmount: 20},
		{name: "withdraw zero", typ: "Withdrawn", data: map[string]any{"account_id": "a1", "amount": int64(0)}, wantErr: true},
		{name: "close", typ: "AccountClosed", data: map[string]any{"account_id": "a1"}, wantChanges: []string{"update balances"}},
		{name: "other type", typ: "Audited", data: map[string]any{}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := &event.Event{
				Position: int64(i + 1), ID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i+1),
				StreamID: "a1", StreamPosition: int64(i + 1), Type: tt.typ,
				Data: tt.data, Metadata: map[string]any{}, OccurredAt: time.Unix(1700000000, 0),
			}
			intents, err := programs["balances"].Eval(ev)
			if (err != nil) != tt.wantErr {
				t.Fatalf("balances Eval error = %v, wantErr %v", err, tt.wantErr)
			}
			var got []string
			for _, in := range intents {
				got = append(got, string(in.Op)+" "+in.Table)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.wantChanges) {
				t.Errorf("balances intents = %v, want %v", got, tt.wantChanges)
			}

			activity, err := programs["activity"].Eval(ev)
			if err != nil {
				t.Fatalf("activity Eval: %v", err)
			}
			if tt.typ == "Audited" {
				if len(activity) != 0 {
					t.Errorf("activity intents for %s = %+v, want none", tt.typ, activity)
				}
				return
			}
			if len(activity) != 1 || activity[0].Op != event.OpInsert {
				t.Fatalf("activity intents = %+v, want one insert", activity)
			}
			for _, col := range activity[0].Set {
				if col.Name == "amount" && fmt.Sprint(col.Value) != fmt.Sprint(tt.wantAmount) {
					t.Errorf("activity amount = %v, want %d", col.Value, tt.wantAmount)
				}
			}
		})
	}
}

// TestErrorsNameRules: a problem in a rule names the projection and the
// rule as the user wrote them (a default name when it has none), with the
// file and line.
func TestErrorsNameRules(t *testing.T) {
	clearEnv(t)
	src := rule(`name = "open-index"`, `op = "insert"`, `table = "t"`, `set = { a = "id" }`, `inc = { a = "1" }`) +
		"[[projection.rule]]\non = \"Closed\"\nop = \"delete\"\ntable = \"t\"\n"
	_, err := Load(writeConfig(t, src))
	if err == nil {
		t.Fatal("Load succeeded, want errors")
	}
	for _, want := range []string{
		`pgscribe.toml:9: projection "p" v1, rule "open-index": inc.a: column "a" is already in set`,
		`pgscribe.toml:10: projection "p" v1, rule "Closed#2": key: is required with op = "delete"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

// TestLoadSettingsSkipsRules: migrate's load accepts a file whose rules
// do not validate, and still checks the other tables.
func TestLoadSettingsSkipsRules(t *testing.T) {
	clearEnv(t)
	bad := rule(`op = "merge"`)
	if _, err := Load(writeConfig(t, bad)); err == nil {
		t.Fatal("Load accepted an unknown op")
	}
	c, err := LoadSettings(writeConfig(t, "[engine]\nschema = \"eng\"\n"+bad))
	if err != nil {
		t.Fatalf("LoadSettings: %v", err)
	}
	if c.Engine.Schema != "eng" || len(c.Projections) != 1 || len(c.Projections[0].Rules) != 0 {
		t.Errorf("got schema %q and projections %+v", c.Engine.Schema, c.Projections)
	}
	if _, err := LoadSettings(writeConfig(t, "[engine]\nbatch_size = \"x\"\n"+bad)); err == nil {
		t.Error("LoadSettings accepted a bad engine setting")
	}
}

// TestRuleLine finds the line of a rule's field as rules.CompileError
// names it.
func TestRuleLine(t *testing.T) {
	clearEnv(t)
	src := rule(`op = "sql"`, `sql = "SELECT $1"`, `args = [`, `  "id",`, `]`) +
		"[[projection.rule]]\nop = \"update\"\ntable = \"t\"\nkey = { id = \"id\" }\nset = { a = \"1\" }\n"
	c, err := Load(writeConfig(t, src))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		rule  int
		field string
		want  int
	}{{0, "", 4}, {0, "sql", 6}, {0, "args[1]", 8}, {1, "set.a", 14}, {1, "when", 10}} {
		if got := c.RuleLine(0, tt.rule, tt.field); got != tt.want {
			t.Errorf("RuleLine(0, %d, %q) = %d, want %d", tt.rule, tt.field, got, tt.want)
		}
	}
}

func TestConsoleTokenFromEnv(t *testing.T) {
	clearEnv(t)
	path := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(path, []byte("[metrics]\nconsole_token = \"from-file\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, env, want string }{
		{name: "file", want: "from-file"},
		{name: "env overrides file", env: "from-env", want: "from-env"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(EnvConsoleToken, tt.env)
			c, err := Load(path)
			if err != nil {
				t.Fatal(err)
			}
			if c.Metrics.ConsoleToken != tt.want {
				t.Errorf("console token = %q, want %q", c.Metrics.ConsoleToken, tt.want)
			}
		})
	}
}
