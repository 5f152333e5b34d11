package integration

// The harness every test of this package builds on (doc.go lists it):
// waits, the configuration file, names, the oracles, and the pgscribe
// process (node). The families of tests (core/crash: rig, faults: faultEnv,
// failover: foCluster, metrics, cli: cliEnv) are environments on top of it.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ---- waits

// waitLong bounds every wait for the engine (catch-up, a halt, a log line):
// generous for a loaded 2-core machine, never reached when things work.
const waitLong = 90 * time.Second

// waitUntil polls cond until it holds, failing t at the deadline, on an
// error of cond, or as soon as one of broken reports a reason (a process
// that exited: nothing would change any more). Each call of cond gets a
// context of its own, bounded to 30s.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error), broken ...func() string) {
	t.Helper()
	if !poll(t, timeout, what, cond, broken...) {
		t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// poll is waitUntil that returns false at the deadline instead of failing.
func poll(t testing.TB, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error), broken ...func() string) bool {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		ok, err := cond(ctx)
		cancel()
		if err != nil {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		if ok {
			return true
		}
		for _, b := range broken {
			if why := b(); why != "" {
				t.Fatalf("waiting for %s: %s", what, why)
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor is waitUntil for a condition that cannot fail.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	waitUntil(t, timeout, what, func(context.Context) (bool, error) { return cond(), nil })
}

// ---- names

// uniqueID returns kind followed by random hex: slot prefixes and role
// names, which are server-wide, never collide between tests or binaries.
func uniqueID(kind string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return kind + hex.EncodeToString(b[:])
}

// slotName is the replication slot pgscribe creates for a projection
// version (<slot_prefix>_<projection>_v<version>, as config.SlotName).
func slotName(prefix, projection string, version int) string {
	return fmt.Sprintf("%s_%s_v%d", prefix, projection, version)
}

// ---- configuration

// config is a pgscribe configuration file: sections of key = value lines
// (values are TOML, written as given), then the projections. newConfig
// sets what every test wants; set overrides or adds a key.
type config struct {
	sections    map[string][][2]string
	extra       map[string]string // verbatim lines per section
	projections []string
}

// configSections is the order of the sections in the file.
var configSections = []string{"database", "source", "engine", "retry", "metrics", "log"}

// newConfig starts a configuration for the database at dsn ("" leaves the
// URL to PGSCRIBE_DATABASE_URL) with the given slot prefix: metrics on a
// free port, JSON logs.
func newConfig(dsn, slotPrefix string) *config {
	c := &config{sections: map[string][][2]string{}, extra: map[string]string{}}
	if dsn != "" {
		c.set("database", "url", fmt.Sprintf("%q", dsn))
	}
	c.set("source", "slot_prefix", fmt.Sprintf("%q", slotPrefix))
	c.set("metrics", "listen", `"127.0.0.1:0"`)
	c.set("log", "format", `"json"`)
	return c
}

// set sets key to the TOML value in section.
func (c *config) set(section, key, value string) *config {
	kvs := c.sections[section]
	for i := range kvs {
		if kvs[i][0] == key {
			kvs[i][1] = value
			return c
		}
	}
	c.sections[section] = append(kvs, [2]string{key, value})
	return c
}

// with sets every key of kv (TOML values) in section, in sorted order.
func (c *config) with(section string, kv map[string]string) *config {
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range kv {
			if !yield(k) {
				return
			}
		}
	}) {
		c.set(section, k, kv[k])
	}
	return c
}

// raw appends verbatim lines to section.
func (c *config) raw(section, lines string) *config {
	c.extra[section] += lines + "\n"
	return c
}

// add appends [[projection]] blocks (TOML).
func (c *config) add(projections ...string) *config {
	c.projections = append(c.projections, projections...)
	return c
}

func (c *config) String() string {
	var b strings.Builder
	for _, s := range configSections {
		if len(c.sections[s]) == 0 && c.extra[s] == "" {
			continue
		}
		fmt.Fprintf(&b, "[%s]\n", s)
		for _, kv := range c.sections[s] {
			fmt.Fprintf(&b, "%s = %s\n", kv[0], kv[1])
		}
		b.WriteString(c.extra[s])
		b.WriteString("\n")
	}
	for _, p := range c.projections {
		b.WriteString(p)
	}
	return b.String()
}

// write writes the file to path and returns path.
func (c *config) write(t testing.TB, path string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(c.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// ---- projections

// rule is one [[projection.rule]] of a test projection. on is an event
// type, or several separated by commas ("" for every type); key, set and
// inc are the insides of their inline tables ("col = \"expr\", …"); args
// is a TOML array; the other fields are written as TOML strings.
type rule struct {
	name, on, when, op, table, key, set, inc, message, sql, args, ifMissing string
}

func (r rule) String() string {
	var b strings.Builder
	b.WriteString("\n  [[projection.rule]]\n")
	field := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, "  %s = %s\n", k, v)
		}
	}
	field("name", fmt.Sprintf("%q", r.name))
	if types := strings.Split(r.on, ","); len(types) > 1 {
		q := make([]string, len(types))
		for i, ty := range types {
			q[i] = fmt.Sprintf("%q", strings.TrimSpace(ty))
		}
		field("on", "["+strings.Join(q, ", ")+"]")
	} else if r.on != "" {
		field("on", fmt.Sprintf("%q", r.on))
	}
	quoted := func(k, v string) {
		if v != "" {
			field(k, fmt.Sprintf("%q", v))
		}
	}
	quoted("when", r.when)
	quoted("op", r.op)
	quoted("table", r.table)
	for _, kv := range [][2]string{{"key", r.key}, {"set", r.set}, {"inc", r.inc}} {
		if kv[1] != "" {
			field(kv[0], "{ "+kv[1]+" }")
		}
	}
	quoted("message", r.message)
	quoted("if_missing", r.ifMissing)
	quoted("sql", r.sql)
	field("args", r.args)
	return b.String()
}

// projectionTOML renders a [[projection]] block; onError "" leaves the
// default.
func projectionTOML(name string, version int, onError string, rules ...rule) string {
	return projectionKeysTOML(name, version, onError, nil, rules...)
}

// projectionKeysTOML is projectionTOML with more projection keys (schema,
// serve, ddl …): lines "key = tomlValue".
func projectionKeysTOML(name string, version int, onError string, keys []string, rules ...rule) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\n[[projection]]\nname = %q\nversion = %d\n", name, version)
	if onError != "" {
		fmt.Fprintf(&b, "on_error = %q\n", onError)
	}
	for _, k := range keys {
		b.WriteString(k + "\n")
	}
	for _, r := range rules {
		b.WriteString(r.String())
	}
	return b.String()
}

// ---- oracles

// querier is what the oracles need of a connection or pool.
type querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// mustExec runs a statement, failing t if it fails.
func mustExec(t testing.TB, q querier, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := q.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// scalar runs a one-value query.
func scalar[T any](t testing.TB, q querier, sql string, args ...any) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var v T
	if err := q.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
		t.Fatalf("%s: %v", sqlHead(sql), err)
	}
	return v
}

// testDB runs a test environment's statements on its connection or pool,
// failing its test when one fails.
type testDB struct {
	t *testing.T
	q querier
}

func (d testDB) exec(sql string, args ...any) {
	d.t.Helper()
	mustExec(d.t, d.q, sql, args...)
}

// queryInt runs a one-integer query.
func (d testDB) queryInt(sql string, args ...any) int64 {
	d.t.Helper()
	return scalar[int64](d.t, d.q, sql, args...)
}

// sqlHead is the first line of a statement, for messages.
func sqlHead(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}

// accountedSQL is the conservation side of the cursors: how many events a
// projection version accounts for (applied + skipped + dead_lettered +
// adopted, the events a start_after_position counted as done).
const accountedSQL = `SELECT coalesce(sum(applied + skipped + dead_lettered + adopted), 0)::bigint
FROM pgscribe.cursors WHERE projection = $1 AND version = $2`

// accounted is how many events the projection version's cursors account for.
func accounted(ctx context.Context, q querier, projection string, version int) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, accountedSQL, projection, version).Scan(&n)
	return n, err
}

// eventCount is the number of rows in the events table.
func eventCount(ctx context.Context, q querier) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n)
	return n, err
}

// waitAccounted waits until the projection version accounts for every
// event of the table (conservation by the counts; writers must be
// stopped), failing at once when it accounts for more, or when broken
// reports a reason.
func waitAccounted(t testing.TB, q querier, timeout time.Duration, projection string, version int, broken ...func() string) {
	t.Helper()
	var got, want int64
	ok := poll(t, timeout, projection+" to account for every event", func(ctx context.Context) (bool, error) {
		var err error
		if want, err = eventCount(ctx, q); err != nil {
			return false, err
		}
		if got, err = accounted(ctx, q, projection, version); err != nil {
			return false, err
		}
		return got >= want, nil
	}, broken...)
	switch {
	case got > want:
		t.Fatalf("projection %s v%d accounts for %d events, the table has %d", projection, version, got, want)
	case !ok:
		t.Fatalf("timed out after %s: projection %s v%d accounts for %d of %d events", timeout, projection, version, got, want)
	}
}

// sameRows fails t when the got and want queries (sharing args) do not
// return the same multiset of rows, with a sample of the rows missing and
// extra.
func sameRows(t testing.TB, q querier, what, got, want string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var missing, extra []string
	rows, err := q.Query(ctx, `WITH got AS (`+got+`), want AS (`+want+`)
SELECT 'missing', w::text FROM (SELECT * FROM want EXCEPT ALL SELECT * FROM got) w
UNION ALL
SELECT 'extra', g::text FROM (SELECT * FROM got EXCEPT ALL SELECT * FROM want) g ORDER BY 2`, args...)
	if err != nil {
		t.Fatalf("compare %s: %v", what, err)
	}
	var side, row string
	if _, err := pgx.ForEachRow(rows, []any{&side, &row}, func() error {
		if side == "missing" {
			missing = append(missing, row)
		} else {
			extra = append(extra, row)
		}
		return nil
	}); err != nil {
		t.Fatalf("compare %s: %v", what, err)
	}
	if len(missing)+len(extra) > 0 {
		t.Errorf("%s differs from the events table: %d rows missing %s, %d rows extra %s",
			what, len(missing), firstFew(missing), len(extra), firstFew(extra))
	}
}

func firstFew(rows []string) string {
	if len(rows) > 5 {
		return fmt.Sprint(rows[:5], " …")
	}
	return fmt.Sprint(rows)
}
