package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Results is everything a run measured. It is written as results.json
// (read by the chart generator in chart/) and rendered as RESULTS.md.
type Results struct {
	Command   string      `json:"command"`
	Date      string      `json:"date"`
	Commit    string      `json:"commit"`
	Scale     float64     `json:"scale"`
	Machine   Machine     `json:"machine"`
	Workloads []*Workload `json:"workloads"`
	Memory    []MemoryRow `json:"memory"`
	Profiles  []Profile   `json:"profiles"`

	Baseline    *Baseline `json:"baseline,omitempty"`     // with -baseline
	BeforeAfter []Change  `json:"before_after,omitempty"` // against Baseline
}

// Machine describes where the run happened.
type Machine struct {
	Cores      int        `json:"cores"`
	CPU        string     `json:"cpu"`
	MemoryGiB  float64    `json:"memory_gib"`
	Postgres   string     `json:"postgres"`
	Mode       string     `json:"mode"`
	Settings   string     `json:"settings"`
	PGCPU      bool       `json:"pg_cpu_measured"`
	Engine     string     `json:"engine"`
	Go         string     `json:"go"`
	LoadBefore string     `json:"load_before"`
	LoadAfter  string     `json:"load_after"`
	LoadDuring string     `json:"load_during,omitempty"` // the 1-minute load, sampled through the run
	Disk       *DiskProbe `json:"disk,omitempty"`
}

// Workload is one workload's figures.
type Workload struct {
	ID              string       `json:"id"`
	Title           string       `json:"title"`
	Description     string       `json:"description"`
	Events          int64        `json:"events"`
	Load            string       `json:"load"` // load average when the engine started
	GenerateSeconds float64      `json:"generate_seconds,omitempty"`
	Rows            []Row        `json:"rows,omitempty"`
	Latency         []LatencyRow `json:"latency,omitempty"`
	Floor           []LatencyRow `json:"decode_floor,omitempty"` // W4's reference: logical decoding alone
	Checks          []Check      `json:"checks,omitempty"`
	Statements      []Statement  `json:"statements,omitempty"`
	Wait            *WaitFigures `json:"wait,omitempty"`        // W4 with -w4-wait (bench/wait.go)
	W7              *w7Figures   `json:"w7,omitempty"`          // W7 (bench/w7.go)
	Sizes           []TableSize  `json:"table_sizes,omitempty"` // W8: the hot tables after each backfill
}

// TableSize is a table's size when a backfill has just accounted for every
// event, before any VACUUM the bench runs (issue 35's churn figure: a hot
// row updated once per batch must not leave a version per batch behind).
type TableSize struct {
	Events     int64  `json:"events"`
	Table      string `json:"table"`
	Rows       int64  `json:"rows"`
	Pages      int64  `json:"pages"`       // heap pages (pg_relation_size / block size)
	TotalKB    int64  `json:"total_kb"`    // heap, indexes and TOAST
	DeadTuples int64  `json:"dead_tuples"` // pg_stat_user_tables.n_dead_tup
}

// Statement is one line of pg_stat_statements over an engine run.
type Statement struct {
	Calls   int64   `json:"calls"`
	TotalMS float64 `json:"total_ms"`
	Rows    int64   `json:"rows"`
	Query   string  `json:"query"`
}

// Row is one way of building a read model: the engine, or a reference.
// CPU figures are µs per event; -1 means not measured.
type Row struct {
	Kind          string        `json:"kind"` // engine | sql | loop
	Label         string        `json:"label"`
	Projection    string        `json:"projection"` // "*" for all projections of a run
	Events        int64         `json:"events"`
	Seconds       float64       `json:"seconds"`
	Rate          float64       `json:"rate"`     // events/s, wall clock measured from outside
	LogRate       float64       `json:"log_rate"` // the engine's own `backfill complete` figure
	CPUPerEvent   float64       `json:"cpu_us_per_event"`
	PGCPUPerEvent float64       `json:"pg_cpu_us_per_event"`
	PeakRSSMB     float64       `json:"peak_rss_mb"`
	EngineRatio   float64       `json:"engine_ratio"` // engine events/s ÷ this row's
	InProcess     bool          `json:"in_process"`
	OtherCores    float64       `json:"other_cores"`             // engine rows: cores busy outside the engine and PostgreSQL; -1 not measured
	Poison        *PoisonCounts `json:"poison,omitempty"`        // W6 engine rows: isolation, deadlocks, dead letters
	OldestXactS   float64       `json:"oldest_xact_s,omitempty"` // engine rows: the longest an engine transaction stayed open (sampled every second)
}

// LatencyRow is one W4 load step.
type LatencyRow struct {
	TargetRate    int     `json:"target_rate"`
	Poison        float64 `json:"poison,omitempty"` // share of events that are poison (W4p)
	Achieved      float64 `json:"achieved_rate"`
	Seconds       float64 `json:"seconds"`
	Events        int64   `json:"events"`
	P50           float64 `json:"p50_ms"`
	P99           float64 `json:"p99_ms"`
	Max           float64 `json:"max_ms"`
	WorstP99      float64 `json:"worst_projection_p99_ms,omitempty"` // W7: the highest p99 of one projection's rows
	CPUPerEvent   float64 `json:"cpu_us_per_event"`
	PGCPUPerEvent float64 `json:"pg_cpu_us_per_event"`
	PeakRSSMB     float64 `json:"peak_rss_mb"`
	OtherCores    float64 `json:"other_cores"`
	// The producer's own commits over the step (its INSERT of a tick's
	// events, autocommitted: what the application sees), ms.
	AppCommitP50 float64 `json:"app_commit_p50_ms,omitempty"`
	AppCommitP99 float64 `json:"app_commit_p99_ms,omitempty"`
	Paired       *Paired `json:"paired,omitempty"`
	Load         string  `json:"load"`
}

// Paired is a W4 rate run again with a consumer that only receives
// attached: per event, PostgreSQL's delivery (commit to the consumer's
// arrival) and what pgscribe adds (the commit of the event's read-model row
// less that arrival), and the engine's own latency in that run, in ms.
type Paired struct {
	EngineP50   float64 `json:"engine_p50_ms"`
	EngineP99   float64 `json:"engine_p99_ms"`
	EngineMax   float64 `json:"engine_max_ms"`
	DeliversP50 float64 `json:"delivers_p50_ms"`
	DeliversP99 float64 `json:"delivers_p99_ms"`
	DeliversMax float64 `json:"delivers_max_ms"`
	AddsP50     float64 `json:"adds_p50_ms"`
	AddsP99     float64 `json:"adds_p99_ms"`
	AddsMax     float64 `json:"adds_max_ms"`
}

// MemoryRow is the engine's peak RSS over one backfill.
type MemoryRow struct {
	Label     string  `json:"label"`
	Events    int64   `json:"events"`
	Rate      float64 `json:"rate"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
	Load      string  `json:"load"`
}

// Check compares the engine's read model with the SQL ceiling's.
type Check struct {
	Projection    string `json:"projection"`
	DifferingRows int64  `json:"differing_rows"`
}

// Profile is an in-process CPU profile's top functions.
type Profile struct {
	Workload string  `json:"workload"`
	File     string  `json:"file"`
	Rate     float64 `json:"rate"`
	Flat     string  `json:"top_flat"`
	Cum      string  `json:"top_cum"`
}

func newResults(o options) *Results {
	r := &Results{
		Command: "go run ./bench " + strings.Join(os.Args[1:], " "),
		Date:    time.Now().UTC().Format("2006-01-02 15:04 MST"),
		Commit:  gitCommit(),
		Scale:   o.scale,
		Machine: Machine{Cores: runtime.NumCPU(), CPU: cpuModel(), MemoryGiB: float64(meminfoTotal()) / (1 << 30),
			Go: runtime.Version(), LoadBefore: loadAverage(), Engine: engineLine(o)},
	}
	return r
}

func engineLine(o options) string {
	s := "the [engine] defaults of " + o.configPath
	if len(o.engineSet) > 0 {
		var kv []string
		for k, v := range o.engineSet {
			kv = append(kv, k+"="+v)
		}
		s += ", with " + strings.Join(kv, ", ")
	}
	return s
}

func (r *Results) setServer(s *server) {
	r.Machine.Postgres = s.version
	r.Machine.Mode = s.Mode()
	r.Machine.Settings = s.settingsLine()
	r.Machine.PGCPU = s.postmaster != 0
}

// workload adds a workload to the results.
func (r *Results) workload(id, title, desc string, events int64) *Workload {
	w := &Workload{ID: id, Title: title, Description: desc, Events: events, Load: loadAverage()}
	r.Workloads = append(r.Workloads, w)
	return w
}

func (r *Results) find(id string) *Workload {
	for _, w := range r.Workloads {
		if w.ID == id {
			return w
		}
	}
	return nil
}

// engineRate is the measured (not profiled) engine rate of a projection.
func (w *Workload) engineRate(projection string) float64 {
	for _, row := range w.Rows {
		if row.Kind == "engine" && !row.InProcess && row.Projection == projection {
			return row.Rate
		}
	}
	return 0
}

func (w *Workload) row(kind, projection string) (Row, bool) {
	for _, row := range w.Rows {
		if row.Kind == kind && !row.InProcess && row.Projection == projection {
			return row, true
		}
	}
	return Row{}, false
}

func (r Row) summary() string {
	return fmt.Sprintf("%s: %s events/s over %.1f s, %.1f µs CPU/event, peak RSS %.1f MB, oldest engine transaction %.0f s",
		r.Label, thousands(int64(r.Rate)), r.Seconds, r.CPUPerEvent, r.PeakRSSMB, r.OldestXactS)
}

func gitCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		c += " (with uncommitted changes)"
	}
	return c
}

// write saves results.json and RESULTS.md in the output directory.
func (b *bench) write() error {
	if b.base != nil {
		b.res.BeforeAfter = compare(b.base, b.res)
	}
	js, err := json.MarshalIndent(b.res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(b.opts.out, "results.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(b.opts.out, "RESULTS.md"), []byte(b.res.markdown()), 0o644)
}

// drawChart runs the chart generator (its own module, so that the plotting
// library stays out of the main go.mod) on results.json.
func (b *bench) drawChart(ctx context.Context) error {
	in, err := filepath.Abs(filepath.Join(b.opts.out, "results.json"))
	if err != nil {
		return err
	}
	out, err := filepath.Abs(filepath.Join(b.opts.out, "results.png"))
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, b.opts.goCmd, "run", ".", "-in", in, "-out", out)
	cmd.Dir = b.opts.chartDir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return err
	}
	say("wrote %s", out)
	return nil
}

// thousands formats n with thin separators: 1,234,567.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
