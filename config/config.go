// Package config loads and validates pgscribe's TOML configuration file.
// Errors name the file, the line and the key at fault.
package config

import (
	"time"

	"github.com/pgscribe/pgscribe/rules"
)

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

// Columns maps the logical event fields to the table's column names.
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
	QueueSize            int           // events buffered per partition, default 2*BatchSize
	StandbyPoll          time.Duration // default 5s
	LeaseTimeout         time.Duration // default 15s
	LagInterval          time.Duration // default 5s
	StallTimeout         time.Duration // default 30s
	StatusInterval       time.Duration // standby status update interval, default 10s
	ShutdownTimeout      time.Duration // default 30s
	MaxActiveProjections int           // 0 = unlimited
}

// Retry bounds retries of rule evaluation and transient commit failures.
type Retry struct {
	MaxAttempts int           // default 5; 0 = retry transient failures forever
	Backoff     time.Duration // first delay, doubled each attempt, default 200ms
	MaxBackoff  time.Duration // default 30s
}

// Metrics configures the HTTP listener for /metrics, /healthz and /readyz.
type Metrics struct {
	Listen string // default "127.0.0.1:9187"; "" or "off" disables
}

// Log configures the structured logger.
type Log struct {
	Level  string // debug|info|warn|error, default info
	Format string // text|json, default text
}
