// Package config loads and validates pgscribe's TOML configuration file.
// Errors name the file, the line and the key at fault.
//
// Load checks structure only: types, required keys, allowed values and
// names. Rule expressions are compiled by rules.Compile, and table and
// column names are checked against the target database by `pgscribe check`.
// A loaded Config is read-only and safe for concurrent use.
package config

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgscribe/pgscribe/rules"
)

// Environment variables read by this package.
const (
	EnvConfig      = "PGSCRIBE_CONFIG"       // config path when -config is not given
	EnvDatabaseURL = "PGSCRIBE_DATABASE_URL" // overrides [database] url
	// EnvConsoleToken overrides [metrics] console_token, so that the
	// secret can stay out of the file (make demo sets it).
	EnvConsoleToken = "PGSCRIBE_CONSOLE_TOKEN"
)

// DefaultPath is the config path when neither -config nor PGSCRIBE_CONFIG
// is given.
const DefaultPath = "./pgscribe.toml"

// Config is the whole configuration file after defaults are applied.
type Config struct {
	Path        string // file it was loaded from
	Database    Database
	Source      Source
	Engine      Engine
	Retry       Retry
	Metrics     Metrics
	Log         Log
	Projections []rules.Spec

	lines lineIndex // key path → line, for errors found after Load
}

// Database says where the source (events table, slot) and the target
// (read models, engine tables) live.
type Database struct {
	URL       string // source; PGSCRIBE_DATABASE_URL overrides
	TargetURL string // target; defaults to URL
}

// Source describes the events table and replication objects.
type Source struct {
	Table       string  // default "events"; may be schema-qualified
	Publication string  // default "pgscribe_events"
	SlotPrefix  string  // default "pgscribe"; slot = <prefix>_<name>_v<version>
	Columns     Columns // physical column names
}

// Columns maps the logical event fields to the table's column names. ID,
// Metadata and OccurredAt may be empty: the table has no such column.
type Columns struct {
	Position, ID, StreamID, StreamPosition, Type, Data, Metadata, OccurredAt string
}

// Engine holds the pipeline and lifecycle settings.
type Engine struct {
	Schema               string        // engine schema, default "pgscribe"
	Node                 string        // node name, default hostname
	Parallelism          int           // partitions per projection, default 4
	BatchSize            int           // live batch size, default 500
	BatchTimeout         time.Duration // default 20ms
	BackfillBatchSize    int           // default 5000
	QueueSize            int           // events buffered per partition, default max(2*BatchSize, BackfillBatchSize/2)
	StandbyPoll          time.Duration // default 5s
	LeaseTimeout         time.Duration // default 15s
	LagInterval          time.Duration // default 5s
	StallTimeout         time.Duration // default 30s
	StatusInterval       time.Duration // standby status update interval, default 10s
	ShutdownTimeout      time.Duration // default 30s
	MaxActiveProjections int           // 0 = unlimited
	// SlowMemberTimeout: a group member that held the others back (the
	// group's stream waited for its full queue while another's ran low)
	// for a fiftieth of a window this long is detached from the group's
	// stream (it catches up on a copy of the group's slot and joins again);
	// one the group's backfill scan waited for on one page this long is
	// dropped from the scan (it backfills on a slot of its own). Default 5s.
	SlowMemberTimeout time.Duration
	// BufferMB bounds, per projection version, the bytes of the events it
	// has read and not yet committed (partition queues, batches, a
	// backfill page), beside the counts above: big events make smaller
	// batches, not a bigger process. Default 64.
	BufferMB int
}

// Retry bounds retries of rule evaluation and transient commit failures.
type Retry struct {
	MaxAttempts int           // default 5; 0 = retry transient failures forever
	Backoff     time.Duration // first delay, doubled each attempt, default 200ms
	MaxBackoff  time.Duration // default 30s
}

// Metrics configures the HTTP listener for /metrics, /healthz and /readyz,
// and the console it also serves (package console).
type Metrics struct {
	Listen string // default "127.0.0.1:9187"; "" or "off" disables
	// Console serves the web console at / on this listener; default true.
	Console bool
	// ConsoleToken enables the console's actions (pause, resume, dead
	// letters, promote, retire) for requests that carry it; empty (the
	// default) leaves the console read-only. PGSCRIBE_CONSOLE_TOKEN
	// overrides it.
	ConsoleToken string
	// ConsoleAuthHeader names a request header set by a trusted reverse
	// proxy to the authenticated user (X-Forwarded-User): a request with
	// it may act, as that user. Empty (the default) trusts no header.
	ConsoleAuthHeader string
}

// Log configures the structured logger.
type Log struct {
	Level  string // debug|info|warn|error, default info
	Format string // text|json, default text
}

// Default returns a configuration with every default applied and no
// projections: what an empty file loads to, apart from Path.
func Default() *Config {
	return &Config{
		Source: Source{
			Table:       "events",
			Publication: "pgscribe_events",
			SlotPrefix:  "pgscribe",
			Columns: Columns{
				Position:       "position",
				ID:             "id",
				StreamID:       "stream_id",
				StreamPosition: "stream_position",
				Type:           "type",
				Data:           "data",
				Metadata:       "metadata",
				OccurredAt:     "occurred_at",
			},
		},
		Engine: Engine{
			Schema:            "pgscribe",
			Node:              defaultNode(),
			Parallelism:       4,
			BatchSize:         500,
			BatchTimeout:      20 * time.Millisecond,
			BackfillBatchSize: 5000,
			QueueSize:         5000 / 2,
			BufferMB:          64,
			StandbyPoll:       5 * time.Second,
			LeaseTimeout:      15 * time.Second,
			LagInterval:       5 * time.Second,
			StallTimeout:      30 * time.Second,
			StatusInterval:    10 * time.Second,
			ShutdownTimeout:   30 * time.Second,
			SlowMemberTimeout: 5 * time.Second,
		},
		Retry: Retry{
			MaxAttempts: 5,
			Backoff:     200 * time.Millisecond,
			MaxBackoff:  30 * time.Second,
		},
		Metrics: Metrics{Listen: "127.0.0.1:9187", Console: true},
		Log:     Log{Level: "info", Format: "text"},
	}
}

// defaultNode is the host name; "pgscribe" if the system cannot tell it,
// because a node name only labels leases and logs and must not stop startup.
func defaultNode() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "pgscribe"
}

// ConfigPath chooses the configuration file: the -config flag's value if
// given, else $PGSCRIBE_CONFIG, else ./pgscribe.toml.
func ConfigPath(flagValue string) string {
	if flagValue != "" {
		return flagValue
	}
	if p := os.Getenv(EnvConfig); p != "" {
		return p
	}
	return DefaultPath
}

// RequireDatabase reports a missing source database for commands that
// connect. The URL may come from [database] url or PGSCRIBE_DATABASE_URL
// (applied by Load). An empty URL is also accepted when PGHOST or PGSERVICE
// is set, since pgx then builds the connection from the libpq environment.
// The error is a *Error naming database.url.
func (c *Config) RequireDatabase() error {
	if c.Database.URL != "" || os.Getenv("PGHOST") != "" || os.Getenv("PGSERVICE") != "" {
		return nil
	}
	p := keyPath{"database", "url"}
	return &Error{
		File: c.Path,
		Line: c.lines.line(p),
		Key:  p.String(),
		Msg:  "is required: set it, or " + EnvDatabaseURL,
	}
}

// TargetURL is the connection string of the target database (read models
// and engine tables): [database] target_url, or the source URL when unset.
func (c *Config) TargetURL() string {
	if c.Database.TargetURL != "" {
		return c.Database.TargetURL
	}
	return c.Database.URL
}

// SlotName is the replication slot of a projection version:
// <slot_prefix>_<name>_v<version>. Load guarantees it fits PostgreSQL's
// 63-byte limit for every configured projection.
func (c *Config) SlotName(p rules.Spec) string {
	return slotName(c.Source.SlotPrefix, p.Name, p.Version)
}

// GroupSlotName is the replication slot a group of two or more projection
// versions shares: <slot_prefix>_group_<group>. A version alone in its
// group streams from SlotName (FeedSlot).
func (c *Config) GroupSlotName(group string) string {
	return groupSlotName(c.Source.SlotPrefix, group)
}

// FeedSlot is the slot a version's group streams from: the group's shared
// slot (GroupSlotName) when the configuration puts two or more versions in
// the version's group, the version's own (SlotName) when it is alone.
func (c *Config) FeedSlot(p rules.Spec) string {
	if len(c.Groups()[p.GroupName()]) > 1 {
		return c.GroupSlotName(p.GroupName())
	}
	return c.SlotName(p)
}

func groupSlotName(prefix, group string) string { return prefix + "_group_" + group }

// Groups returns the indexes into Projections of each group's versions, by
// group name, in configuration order.
func (c *Config) Groups() map[string][]int {
	g := map[string][]int{}
	for i, p := range c.Projections {
		g[p.GroupName()] = append(g[p.GroupName()], i)
	}
	return g
}

func slotName(prefix, name string, version int64) string {
	return fmt.Sprintf("%s_%s_v%d", prefix, name, version)
}

// Enabled reports whether the metrics listener should run: Listen is
// neither empty nor "off".
func (m Metrics) Enabled() bool { return m.Listen != "" && m.Listen != "off" }

// RuleLine is the line in the file of a rule's field, for errors found
// after Load (rules.Compile's): projection and rule are 0-based indexes,
// field is as in rules.CompileError ("when", "set.balance", "args[2]",
// "" for the rule itself). It is 0 when the file does not say.
func (c *Config) RuleLine(projection, rule int, field string) int {
	p := keyPath{"projection"}.index(projection).key("rule").index(rule)
	if field != "" {
		head, rest, _ := strings.Cut(field, ".")
		if name, n, ok := strings.Cut(head, "["); ok {
			i, _ := strconv.Atoi(strings.TrimSuffix(n, "]"))
			p = p.key(name).index(i - 1) // args[N] is 1-based
		} else {
			p = p.key(head)
		}
		if rest != "" {
			p = p.key(rest)
		}
	}
	return c.lines.line(p)
}
