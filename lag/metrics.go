package lag

import (
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds every pgscribe metric. Labels come only from bounded sets:
// projection, version, outcome, result, error kind (rule names and SQLSTATEs
// are bounded by the configuration and PostgreSQL). Never a stream id.
type Metrics struct {
	Events        *prometheus.CounterVec
	Batches       *prometheus.CounterVec
	Isolation     *prometheus.CounterVec
	BatchDuration *prometheus.HistogramVec
	BatchEvents   *prometheus.HistogramVec
	LagSeconds    *prometheus.GaugeVec
	LagBytes      *prometheus.GaugeVec
	Backlog       *prometheus.GaugeVec
	WatermarkLSN  *prometheus.GaugeVec
	LastCommit    *prometheus.GaugeVec
	Active        *prometheus.GaugeVec
	Halted        *prometheus.GaugeVec
	Paused        *prometheus.GaugeVec
	Halts         *prometheus.CounterVec
	DeadLetters   *prometheus.CounterVec
	StreamGaps    *prometheus.CounterVec
	Reconnects    *prometheus.CounterVec
	BackfillDone  *prometheus.GaugeVec
	BackfillTotal *prometheus.GaugeVec
	WatermarkTime *prometheus.GaugeVec
	SlotRetained  *prometheus.GaugeVec
	ProbeErrors   *prometheus.CounterVec
	RowsMissing   *prometheus.CounterVec
	Retries       *prometheus.CounterVec
	OldestXact    prometheus.Gauge // process-wide: pgscribe_oldest_transaction_seconds (SampleOldestTransaction)

	tailsMu sync.Mutex
	tails   map[string]*sharedTail // event counts by source table, shared by the projections' probes
}

// NewMetrics creates the metrics and registers them on reg. version is the
// pgscribe version, exported as pgscribe_build_info{version, goversion}.
// It panics if reg already holds a metric of the same name (one Metrics per
// registry).
func NewMetrics(reg prometheus.Registerer, version string) *Metrics {
	// Every per-version metric is labelled by projection and version,
	// then by its own labels.
	pv := []string{"projection", "version"}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, slices.Concat(pv, labels))
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, slices.Concat(pv, labels))
	}
	m := &Metrics{
		Events: counter("pgscribe_events_total",
			"Source events accounted for, by outcome (applied, skipped, dead_lettered).", "outcome"),
		Batches: counter("pgscribe_batches_total",
			"Batches by result (committed, retried, isolated, halted).", "result"),
		Isolation: counter("pgscribe_isolation_attempts_total",
			"Segment attempts (savepoint round trips) made to find the events of isolated batches that fail an integrity check."),
		BatchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pgscribe_batch_duration_seconds",
			Help: "Time from a batch's first attempt to its commit.",
			// Sub-millisecond (a few skipped events) to a minute (a batch
			// that retried with backoff, or waited on a lock).
			Buckets: []float64{.0002, .0005, .001, .002, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}}, pv),
		BatchEvents: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pgscribe_batch_events",
			Help:    "Events per committed batch.",
			Buckets: []float64{1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000}}, pv),
		LagSeconds: gauge("pgscribe_lag_seconds",
			"Age of the oldest committed source event not yet applied; 0 when caught up. Refreshed every lag_interval on every node."),
		LagBytes: gauge("pgscribe_replication_lag_bytes",
			"Source server WAL LSN minus the slot's confirmed_flush_lsn."),
		Backlog: gauge("pgscribe_backlog_events",
			"Source events not yet accounted for: count of events minus applied + skipped + dead_lettered + parked of the version's cursors."),
		WatermarkLSN: gauge("pgscribe_watermark_lsn",
			"Contiguous watermark LSN (as a number): everything at or below it is durably accounted for."),
		LastCommit: gauge("pgscribe_last_commit_timestamp_seconds",
			"Unix time of the projection's last committed batch."),
		Active: gauge("pgscribe_active",
			"1 on the node holding the projection's lock, else 0."),
		Halted: gauge("pgscribe_halted",
			"1 when the projection is halted on a structural failure."),
		Paused: gauge("pgscribe_paused",
			"1 while an operator paused the projection (pgscribe pause) on the node holding its lock."),
		Halts: counter("pgscribe_halts_total",
			"Halts by stage (source, lock, commit, resource) and SQLSTATE class (two characters; none without a SQLSTATE).", "stage", "sqlstate_class"),
		DeadLetters: counter("pgscribe_dead_letters_total",
			"Dead-lettered events by error kind.", "error_kind"),
		StreamGaps: counter("pgscribe_stream_gaps_total",
			"Events whose stream_position jumped past cursor + 1."),
		Reconnects: counter("pgscribe_restarts_total",
			"Pipeline restarts after a connection loss or transient failure."),
		BackfillDone: gauge("pgscribe_backfill_events_done",
			"Events read by the running snapshot backfill."),
		BackfillTotal: gauge("pgscribe_backfill_events_total",
			"Events visible in the snapshot being backfilled."),
		WatermarkTime: gauge("pgscribe_watermark_commit_timestamp_seconds",
			"Unix time of the source commit of the last transaction at or below the watermark; 0 when unknown."),
		SlotRetained: gauge("pgscribe_slot_retained_wal_bytes",
			"Source server WAL LSN minus the slot's restart_lsn: WAL the slot keeps on disk."),
		ProbeErrors: counter("pgscribe_lag_probe_errors_total",
			"Lag measurements that could not read PostgreSQL."),
		RowsMissing: counter("pgscribe_rows_missing_total",
			"Committed updates and deletes that matched no row, by rule.", "rule"),
		OldestXact: prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgscribe_oldest_transaction_seconds",
			Help: "How long the oldest transaction open on an engine session of the source or target server has been open (any node's), sampled every lag_interval; 0 when none. Long ones hold back vacuum in the whole cluster."}),
		Retries: counter("pgscribe_batch_retries_total",
			"Batches retried after a transient failure, by SQLSTATE (40P01 deadlock, 40001 serialization …; \"connection\" for a lost connection).", "sqlstate"),
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "pgscribe_build_info",
		Help: "Build information; always 1."}, []string{"version", "goversion"})
	info.WithLabelValues(version, runtime.Version()).Set(1)
	reg.MustRegister(m.Events, m.Batches, m.Isolation, m.BatchDuration, m.BatchEvents, m.LagSeconds, m.LagBytes,
		m.Backlog, m.WatermarkLSN, m.LastCommit, m.Active, m.Halted, m.Paused, m.Halts, m.DeadLetters, m.StreamGaps,
		m.Reconnects, m.BackfillDone, m.BackfillTotal, m.WatermarkTime, m.SlotRetained, m.ProbeErrors, m.RowsMissing, m.Retries, m.OldestXact, info)
	return m
}

// Projection is the view of Metrics for one projection version. It
// implements the apply stage's observer, and keeps the lag measurement
// history (WAL clock, event count) that probes of the version share.
type Projection struct {
	m          *Metrics
	name, ver  string
	probe      probeState
	applied    prometheus.Counter
	skipped    prometheus.Counter
	dead       prometheus.Counter
	duration   prometheus.Observer
	size       prometheus.Observer
	lastCommit prometheus.Gauge
}

// For returns the metrics of one projection version, creating its series
// so that dashboards see zeros rather than gaps.
func (m *Metrics) For(name string, version int64) *Projection {
	v := strconv.FormatInt(version, 10)
	p := &Projection{m: m, name: name, ver: v,
		applied:    m.Events.WithLabelValues(name, v, "applied"),
		skipped:    m.Events.WithLabelValues(name, v, "skipped"),
		dead:       m.Events.WithLabelValues(name, v, "dead_lettered"),
		duration:   m.BatchDuration.WithLabelValues(name, v),
		size:       m.BatchEvents.WithLabelValues(name, v),
		lastCommit: m.LastCommit.WithLabelValues(name, v),
	}
	for _, r := range []string{"committed", "retried", "isolated", "halted"} {
		m.Batches.WithLabelValues(name, v, r)
	}
	for _, g := range []*prometheus.GaugeVec{m.LagSeconds, m.LagBytes, m.Backlog, m.WatermarkLSN, m.Active, m.Halted, m.Paused,
		m.WatermarkTime, m.SlotRetained, m.BackfillDone, m.BackfillTotal} {
		g.WithLabelValues(name, v)
	}
	m.StreamGaps.WithLabelValues(name, v)
	m.Isolation.WithLabelValues(name, v)
	m.Reconnects.WithLabelValues(name, v)
	m.ProbeErrors.WithLabelValues(name, v)
	return p
}

// BatchDone records a batch result; committed batches also record their
// duration and size.
func (p *Projection) BatchDone(result string, events int, d time.Duration) {
	p.m.Batches.WithLabelValues(p.name, p.ver, result).Inc()
	if result == "committed" {
		p.duration.Observe(d.Seconds())
		p.size.Observe(float64(events))
		p.lastCommit.Set(unixSeconds(time.Now()))
	}
}

// Outcomes adds a committed batch's event outcomes.
func (p *Projection) Outcomes(applied, skipped, deadLettered int) {
	p.applied.Add(float64(applied))
	p.skipped.Add(float64(skipped))
	p.dead.Add(float64(deadLettered))
}

// DeadLettered counts one dead letter of the given kind.
func (p *Projection) DeadLettered(kind string) {
	p.m.DeadLetters.WithLabelValues(p.name, p.ver, kind).Inc()
}

// Isolation adds the segment attempts of an isolated pass.
func (p *Projection) Isolation(attempts int) {
	p.m.Isolation.WithLabelValues(p.name, p.ver).Add(float64(attempts))
}

// Gap counts a stream gap.
func (p *Projection) Gap() { p.m.StreamGaps.WithLabelValues(p.name, p.ver).Inc() }

// RowsMissing counts n updates or deletes of a rule that matched no row.
func (p *Projection) RowsMissing(rule string, n int) {
	p.m.RowsMissing.WithLabelValues(p.name, p.ver, rule).Add(float64(n))
}

// Retried counts a batch retried after a transient failure; sqlstate is
// "" for a connection error. Only transient SQLSTATEs retry, a bounded set.
func (p *Projection) Retried(sqlstate string) {
	if sqlstate == "" {
		sqlstate = "connection"
	}
	p.m.Retries.WithLabelValues(p.name, p.ver, sqlstate).Inc()
}

// Restarted counts a pipeline restart.
func (p *Projection) Restarted() { p.m.Reconnects.WithLabelValues(p.name, p.ver).Inc() }

// SetActive sets pgscribe_active.
func (p *Projection) SetActive(on bool) { p.m.Active.WithLabelValues(p.name, p.ver).Set(b2f(on)) }

// SetHalted sets pgscribe_halted.
func (p *Projection) SetHalted(on bool) { p.m.Halted.WithLabelValues(p.name, p.ver).Set(b2f(on)) }

// SetPaused sets pgscribe_paused.
func (p *Projection) SetPaused(on bool) { p.m.Paused.WithLabelValues(p.name, p.ver).Set(b2f(on)) }

// Halt counts one halt at stage (source, lock, commit, resource) whose error has
// SQLSTATE code ("" when none): the label is the code's class, never the
// code's text or the error's, so the series stay few.
func (p *Projection) Halt(stage, code string) {
	class := "none"
	if len(code) == 5 {
		class = code[:2]
	}
	p.m.Halts.WithLabelValues(p.name, p.ver, stage, class).Inc()
}

// Report sets the lag gauges from a reading. What the reading does not
// know (slot, backlog, watermark time, last commit) leaves those gauges as
// they were.
func (p *Projection) Report(r Reading) {
	p.m.LagSeconds.WithLabelValues(p.name, p.ver).Set(r.LagSeconds)
	if r.SlotKnown {
		p.m.LagBytes.WithLabelValues(p.name, p.ver).Set(float64(r.LagBytes))
		p.m.SlotRetained.WithLabelValues(p.name, p.ver).Set(float64(r.RetainedBytes))
	}
	if r.BacklogKnown {
		p.m.Backlog.WithLabelValues(p.name, p.ver).Set(float64(r.Backlog))
	}
	p.m.WatermarkLSN.WithLabelValues(p.name, p.ver).Set(float64(r.Watermark))
	if !r.WatermarkTime.IsZero() {
		p.m.WatermarkTime.WithLabelValues(p.name, p.ver).Set(unixSeconds(r.WatermarkTime))
	}
	if !r.LastCommit.IsZero() {
		p.lastCommit.Set(unixSeconds(r.LastCommit))
	}
}

// ProbeFailed counts a lag measurement that could not read PostgreSQL.
func (p *Projection) ProbeFailed() { p.m.ProbeErrors.WithLabelValues(p.name, p.ver).Inc() }

func unixSeconds(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// SetBackfill sets the backfill progress gauges.
func (p *Projection) SetBackfill(done, total int64) {
	p.m.BackfillDone.WithLabelValues(p.name, p.ver).Set(float64(done))
	p.m.BackfillTotal.WithLabelValues(p.name, p.ver).Set(float64(total))
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
