package config

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// Load reads the TOML file at path, applies the defaults and validates the
// result.
//
// On failure the error is either a single *Error (the file cannot be read;
// it unwraps to the os error, so errors.Is(err, fs.ErrNotExist) works) or an
// Errors value listing every problem found, sorted by line. A TOML syntax
// error stops parsing, so it is reported alone.
//
// When PGSCRIBE_DATABASE_URL is set and non-empty it replaces [database]
// url. Load does not require a database URL, so that `pgscribe check` can
// run offline; commands that connect call RequireDatabase.
func Load(path string) (*Config, error) { return loadFile(path, true) }

// LoadSettings is Load without the rules: it reads and validates every
// table, and of each [[projection]] its identity and deployment keys
// (name, version, schema, serve, ddl, start_after_position), leaving Rules
// empty, so that a command that needs no rules (migrate) is not refused for
// a rule's mistake. Unknown keys are still errors.
func LoadSettings(path string) (*Config, error) { return loadFile(path, false) }

func loadFile(path string, withRules bool) (*Config, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		msg := err.Error()
		var pe *fs.PathError
		if errors.As(err, &pe) {
			msg = pe.Err.Error()
		}
		return nil, &Error{File: path, Msg: "cannot read: " + msg, err: err}
	}
	return load(path, string(src), withRules)
}

func load(file, src string, withRules bool) (*Config, error) {
	var raw map[string]any
	if _, err := toml.Decode(src, &raw); err != nil {
		e := &Error{File: file, Msg: err.Error(), err: err}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			e.Line, e.Key, e.Msg = pe.Position.Line, pe.LastKey, pe.Message
		}
		return nil, Errors{e}
	}

	d := &decoder{file: file, lines: indexLines(src)}
	c := d.config(raw, withRules)
	c.Path = file
	if len(d.errs) > 0 {
		d.errs.sort()
		nameRules(d.errs, raw)
		return nil, d.errs
	}
	if u := os.Getenv(EnvDatabaseURL); u != "" {
		c.Database.URL = u
	}
	if t := os.Getenv(EnvConsoleToken); t != "" {
		c.Metrics.ConsoleToken = t
	}
	return c, nil
}

// config decodes the whole file, raw, onto the defaults.
func (d *decoder) config(raw map[string]any, withRules bool) *Config {
	c := Default()
	c.lines = d.lines
	root := d.table(nil, raw)
	d.database(root.sub("database"), &c.Database)
	d.source(root.sub("source"), &c.Source)
	d.engine(root.sub("engine"), &c.Engine)
	d.retry(root.sub("retry"), &c.Retry)
	d.metrics(root.sub("metrics"), &c.Metrics)
	d.log(root.sub("log"), &c.Log)
	c.Projections = d.projections(root, c.Source.SlotPrefix, withRules)
	root.done()
	return c
}

// decoder turns the generic TOML tree into a Config. It decodes by hand
// rather than with toml's reflection because that stops at the first type
// error and cannot say which array element a key belongs to; here every
// problem is collected with its key path and line.
type decoder struct {
	file  string
	lines lineIndex
	errs  Errors
	// schema, when not nil, collects every table's known keys (see Keys).
	schema map[string][]string
}

func (d *decoder) fail(p keyPath, format string, args ...any) {
	d.errs = append(d.errs, &Error{
		File: d.file,
		Line: d.lines.line(p),
		Key:  p.String(),
		Msg:  fmt.Sprintf(format, args...),
	})
}

// failedUnder reports whether a problem was already found at p or inside
// it, so that a bad value is not reported a second time as missing.
func (d *decoder) failedUnder(p keyPath) bool {
	k := p.String()
	for _, e := range d.errs {
		if e.Key == k || strings.HasPrefix(e.Key, k+".") || strings.HasPrefix(e.Key, k+"[") {
			return true
		}
	}
	return false
}

// table is one TOML table being decoded. Every key asked for is remembered,
// so that done can report the rest as unknown.
type table struct {
	d     *decoder
	path  keyPath
	m     map[string]any
	known []string
}

// table wraps v, the value at p; an absent table (nil) reads as empty.
func (d *decoder) table(p keyPath, v any) *table {
	t := &table{d: d, path: p}
	switch m := v.(type) {
	case nil:
	case map[string]any:
		t.m = m
	default:
		d.fail(p, "must be a table, not %s", typeName(v))
	}
	return t
}

// get returns the value of key, if present, and its path.
func (t *table) get(key string) (any, keyPath, bool) {
	t.known = append(t.known, key)
	v, ok := t.m[key]
	return v, t.path.key(key), ok
}

func (t *table) has(key string) bool {
	_, ok := t.m[key]
	return ok
}

func (t *table) sub(key string) *table {
	v, p, _ := t.get(key)
	return t.d.table(p, v)
}

// done reports the keys of t that no accessor asked for.
func (t *table) done() {
	if t.d.schema != nil {
		t.d.schema[t.path.section()] = t.known
	}
	var unknown []string
	for k := range t.m {
		if !slices.Contains(t.known, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		if s := suggest(k, t.known); s != "" {
			t.d.fail(t.path.key(k), "unknown key (did you mean %q?)", s)
		} else {
			t.d.fail(t.path.key(k), "unknown key")
		}
	}
}

// typed reads the value of key into dst; it reports whether key was present
// and a T. what names T in the error when the value is of another type.
func typed[T any](t *table, key, what string, dst *T) bool {
	v, p, ok := t.get(key)
	if !ok {
		return false
	}
	x, ok := v.(T)
	if !ok {
		t.d.fail(p, "must be %s, not %s", what, typeName(v))
		return false
	}
	*dst = x
	return true
}

// str reads a string; it reports whether key was present and a string.
func (t *table) str(key string, dst *string) bool {
	return typed(t, key, "a string", dst)
}

// name reads a string that, if present, must not be empty.
func (t *table) name(key string, dst *string) bool {
	var s string
	if !t.str(key, &s) {
		return false
	}
	if s == "" {
		t.d.fail(t.path.key(key), "must not be empty")
		return false
	}
	*dst = s
	return true
}

// matching reads a non-empty string that must match re; rule says how.
func (t *table) matching(key string, dst *string, re *regexp.Regexp, rule string) bool {
	var s string
	if !t.name(key, &s) {
		return false
	}
	if !re.MatchString(s) {
		t.d.fail(t.path.key(key), "%s, not %q", rule, s)
		return false
	}
	*dst = s
	return true
}

// oneOf reads a string that, if present, must be one of allowed.
func (t *table) oneOf(key string, dst *string, allowed ...string) bool {
	var s string
	if !t.str(key, &s) {
		return false
	}
	if !slices.Contains(allowed, s) {
		t.d.fail(t.path.key(key), "must be one of %s, not %q", strings.Join(allowed, ", "), s)
		return false
	}
	*dst = s
	return true
}

func (t *table) integer(key string, dst *int64) bool {
	return typed(t, key, "an integer", dst)
}

// count reads an integer of at least least.
func (t *table) count(key string, dst *int, least int) bool {
	var n int64
	if !t.integer(key, &n) {
		return false
	}
	switch {
	case n < int64(least):
		if least == 0 {
			t.d.fail(t.path.key(key), "must not be negative, not %d", n)
		} else {
			t.d.fail(t.path.key(key), "must be at least %d, not %d", least, n)
		}
		return false
	case n > math.MaxInt:
		t.d.fail(t.path.key(key), "is too large")
		return false
	}
	*dst = int(n)
	return true
}

// duration reads a positive duration written as a string ("250ms", "5s").
func (t *table) duration(key string, dst *time.Duration) bool {
	var s string
	if !typed(t, key, `a duration string such as "5s"`, &s) {
		return false
	}
	p := t.path.key(key)
	dur, err := time.ParseDuration(s)
	switch {
	case err != nil:
		t.d.fail(p, `must be a duration such as "250ms", "5s" or "1m30s", not %q`, s)
		return false
	case dur <= 0:
		t.d.fail(p, "must be positive, not %q", s)
		return false
	}
	*dst = dur
	return true
}

func (d *decoder) database(t *table, db *Database) {
	t.str("url", &db.URL)
	t.str("target_url", &db.TargetURL)
	t.done()
}

// maxIdentLen is PostgreSQL's identifier limit (NAMEDATALEN-1). Longer names
// are truncated silently by the server, so a long name would not match the
// object pgscribe looks for later.
const maxIdentLen = 63

var slotPrefixRE = regexp.MustCompile(`^[a-z0-9_]+$`)

func (d *decoder) source(t *table, s *Source) {
	t.name("table", &s.Table)
	if t.name("publication", &s.Publication) && len(s.Publication) > maxIdentLen {
		d.fail(t.path.key("publication"), "must be at most %d bytes", maxIdentLen)
	}
	t.matching("slot_prefix", &s.SlotPrefix, slotPrefixRE,
		"may contain only lower-case letters, digits and underscores (it starts replication slot names)")

	ct := t.sub("columns")
	// id, metadata and occurred_at may be "": the events table has no such
	// column (an event then has an empty id, no metadata, no time).
	cols := []struct {
		key      string
		dst      *string
		optional bool
	}{
		{"position", &s.Columns.Position, false},
		{"id", &s.Columns.ID, true},
		{"stream_id", &s.Columns.StreamID, false},
		{"stream_position", &s.Columns.StreamPosition, false},
		{"type", &s.Columns.Type, false},
		{"data", &s.Columns.Data, false},
		{"metadata", &s.Columns.Metadata, true},
		{"occurred_at", &s.Columns.OccurredAt, true},
	}
	mappedBy := map[string]string{}
	for _, col := range cols {
		if col.optional {
			ct.str(col.key, col.dst)
		} else {
			ct.name(col.key, col.dst)
		}
		if *col.dst == "" {
			continue
		}
		if other, dup := mappedBy[*col.dst]; dup {
			d.fail(ct.path.key(col.key), "column %q is already mapped by %s", *col.dst, other)
		}
		mappedBy[*col.dst] = col.key
	}
	ct.done()
	t.done()
}

func (d *decoder) engine(t *table, e *Engine) {
	if t.name("schema", &e.Schema) && len(e.Schema) > maxIdentLen {
		d.fail(t.path.key("schema"), "must be at most %d bytes", maxIdentLen)
	}
	t.name("node", &e.Node)
	t.count("parallelism", &e.Parallelism, 1)
	t.count("batch_size", &e.BatchSize, 1)
	t.duration("batch_timeout", &e.BatchTimeout)
	t.count("backfill_batch_size", &e.BackfillBatchSize, 1)
	if !t.count("queue_size", &e.QueueSize, 1) {
		// Room for a live batch twice over, and for half a backfill batch:
		// a backfill batch is what queued while the previous one committed,
		// so a smaller queue caps backfill batches below their size.
		e.QueueSize = max(2*e.BatchSize, e.BackfillBatchSize/2)
	}
	t.duration("standby_poll", &e.StandbyPoll)
	t.duration("lease_timeout", &e.LeaseTimeout)
	t.duration("lag_interval", &e.LagInterval)
	t.duration("stall_timeout", &e.StallTimeout)
	t.duration("status_interval", &e.StatusInterval)
	t.duration("shutdown_timeout", &e.ShutdownTimeout)
	t.duration("slow_member_timeout", &e.SlowMemberTimeout)
	t.count("buffer_mb", &e.BufferMB, 1)
	t.count("max_active_projections", &e.MaxActiveProjections, 0)
	t.done()
}

func (d *decoder) retry(t *table, r *Retry) {
	t.count("max_attempts", &r.MaxAttempts, 0)
	backoffSet := t.duration("backoff", &r.Backoff)
	maxSet := t.duration("max_backoff", &r.MaxBackoff)
	if (backoffSet || maxSet) && r.MaxBackoff < r.Backoff {
		key := "max_backoff"
		if !maxSet {
			key = "backoff"
		}
		d.fail(t.path.key(key), "max_backoff (%s) must not be less than backoff (%s)", r.MaxBackoff, r.Backoff)
	}
	t.done()
}

func (d *decoder) metrics(t *table, m *Metrics) {
	var listen string
	if t.str("listen", &listen) {
		if listen == "" || listen == "off" || validListen(listen) {
			m.Listen = listen
		} else {
			d.fail(t.path.key("listen"), `must be host:port (":9187" for every interface), "" or "off", not %q`, listen)
		}
	}
	typed(t, "console", "a boolean", &m.Console)
	t.str("console_token", &m.ConsoleToken)
	if t.str("console_auth_header", &m.ConsoleAuthHeader) && m.ConsoleAuthHeader != "" && !headerNameRE.MatchString(m.ConsoleAuthHeader) {
		d.fail(t.path.key("console_auth_header"), "must be an HTTP header name (X-Forwarded-User), not %q", m.ConsoleAuthHeader)
	}
	t.done()
}

// headerNameRE matches an HTTP header name (an RFC 9110 token).
var headerNameRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

func validListen(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	_, err = strconv.ParseUint(port, 10, 16)
	return err == nil
}

func (d *decoder) log(t *table, l *Log) {
	t.oneOf("level", &l.Level, "debug", "info", "warn", "error")
	t.oneOf("format", &l.Format, "text", "json")
	t.done()
}

// typeName names the TOML type of a decoded value, for messages.
func typeName(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case int64:
		return "an integer"
	case float64:
		return "a float"
	case bool:
		return "a boolean"
	case map[string]any:
		return "a table"
	case []any:
		return "an array"
	case []map[string]any:
		return "an array of tables"
	default:
		return "a date-time"
	}
}

// suggest returns the known key closest to k, if it is a plausible typo.
func suggest(k string, known []string) string {
	best, bestDist := "", 3
	for _, cand := range known {
		if dist := editDistance(k, cand); dist < bestDist {
			best, bestDist = cand, dist
		}
	}
	return best
}

// editDistance is the Damerau-Levenshtein (optimal string alignment)
// distance, so that a transposition such as tabel/table counts once.
func editDistance(a, b string) int {
	rows := make([][]int, len(a)+1)
	for i := range rows {
		rows[i] = make([]int, len(b)+1)
		rows[i][0] = i
	}
	for j := range rows[0] {
		rows[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			rows[i][j] = min(rows[i-1][j]+1, rows[i][j-1]+1, rows[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				rows[i][j] = min(rows[i][j], rows[i-2][j-2]+1)
			}
		}
	}
	return rows[len(a)][len(b)]
}
