package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strings"
)

// Baseline names the earlier run that -baseline compares this one with.
type Baseline struct {
	File       string `json:"file"`
	Commit     string `json:"commit"`
	Date       string `json:"date"`
	LoadBefore string `json:"load_before"`
	LoadAfter  string `json:"load_after"`
}

// Change is one headline figure of the baseline run and of this one.
type Change struct {
	Figure string  `json:"figure"`
	Before float64 `json:"before"`
	After  float64 `json:"after"`
	Higher bool    `json:"higher_is_better"`
}

// loadBaseline reads an earlier run's results.json: a file, or a git
// object such as 7ebe299:bench/results.json (the figures a commit held).
func loadBaseline(path string) (*Results, error) {
	b, err := os.ReadFile(path)
	if err != nil && strings.Contains(path, ":") {
		var gerr error
		if b, gerr = exec.Command("git", "show", path).Output(); gerr == nil {
			err = nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("-baseline: %w", err)
	}
	var r Results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("-baseline %s: %w", path, err)
	}
	return &r, nil
}

// compare lists the headline figures that both runs measured: per
// workload the engine's events/s, its CPU and PostgreSQL's per event and
// its peak RSS, the time PostgreSQL spent loading cursors, W4's latency
// percentiles and the memory backfills.
func compare(before, after *Results) []Change {
	var out []Change
	add := func(figure string, b, a float64, higher bool) {
		if b <= 0 || a <= 0 || math.IsNaN(b) || math.IsNaN(a) {
			return
		}
		out = append(out, Change{Figure: figure, Before: b, After: a, Higher: higher})
	}
	engineRows := []struct{ id, projection, label string }{
		{"W1", "balances", "W1 balances backfill"},
		{"W2", "activity", "W2 activity backfill"},
		{"W3", "*", "W3 three projections (per event and projection)"},
		{"W5", "balances", "W5 WAL catch-up"},
	}
	for _, e := range engineRows {
		wb, wa := before.find(e.id), after.find(e.id)
		if wb == nil || wa == nil || wb.Events != wa.Events {
			continue // not run in both, or at different sizes
		}
		rb, okb := wb.row("engine", e.projection)
		ra, oka := wa.row("engine", e.projection)
		if !okb || !oka {
			continue
		}
		if e.id == "W3" {
			add("W3 slowest projection, events/s", slowestRate(wb), slowestRate(wa), true)
		} else {
			add(e.label+", events/s", rb.Rate, ra.Rate, true)
		}
		add(e.label+", engine CPU µs/event", rb.CPUPerEvent, ra.CPUPerEvent, false)
		add(e.label+", PG CPU µs/event", rb.PGCPUPerEvent, ra.PGCPUPerEvent, false)
		add(e.label+", peak RSS MB", rb.PeakRSSMB, ra.PeakRSSMB, false)
		add(e.label+", cursor load statement, total ms", cursorLoadMS(wb), cursorLoadMS(wa), false)
	}
	if wb, wa := before.find("W4"), after.find("W4"); wb != nil && wa != nil && wb.Description == wa.Description {
		for _, lb := range wb.Latency {
			for _, la := range wa.Latency {
				if la.TargetRate != lb.TargetRate {
					continue
				}
				rate := thousands(int64(la.TargetRate))
				add("W4 at "+rate+" events/s, p50 ms", lb.P50, la.P50, false)
				add("W4 at "+rate+" events/s, p99 ms", lb.P99, la.P99, false)
			}
		}
	}
	for _, mb := range before.Memory {
		for _, ma := range after.Memory {
			if ma.Label == mb.Label && ma.Events == mb.Events && strings.Contains(ma.Label, "-rss-5m") {
				add("peak RSS MB, "+thousands(ma.Events)+"-event backfill", mb.PeakRSSMB, ma.PeakRSSMB, false)
			}
		}
	}
	return out
}

func slowestRate(w *Workload) float64 {
	slowest := 0.0
	for _, row := range w.Rows {
		if row.Kind == "engine" && !row.InProcess && row.Projection != "*" && (slowest == 0 || row.Rate < slowest) {
			slowest = row.Rate
		}
	}
	return slowest
}

// cursorLoadMS is the execution time of the engine's cursor loads (the
// SELECT of stream positions from the cursors table, in whatever form)
// among a workload's heaviest statements; 0 when not recorded.
func cursorLoadMS(w *Workload) float64 {
	total := 0.0
	for _, st := range w.Statements {
		q := st.Query
		if strings.HasPrefix(q, "SELECT") && strings.Contains(q, `."cursors"`) &&
			strings.Contains(q, "stream_position") && !strings.Contains(q, "sum(") {
			total += st.TotalMS
		}
	}
	return total
}

// beforeAfter renders the comparison with the -baseline run.
func (r *Results) beforeAfter(p func(string, ...any)) {
	if r.Baseline == nil {
		return
	}
	bl := r.Baseline
	p("## Before → after")
	p("")
	if len(r.BeforeAfter) == 0 {
		p("No figure of this run compares with the run of commit %s (%s): different workloads or sizes.", bl.Commit, bl.Date)
		p("")
		return
	}
	p("This run against the run of commit %s (%s; its results.json read from `%s`). Load average "+
		"before the run: %s then, %s now. Events/s and latency follow the load on the machine; CPU per event "+
		"much less so. Commits between the two runs all count, not only the ones a change is meant for.",
		bl.Commit, bl.Date, bl.File, bl.LoadBefore, r.Machine.LoadBefore)
	p("")
	p("| figure | before (%s) | after (%s) | change |", bl.Commit, r.Commit)
	p("|---|--:|--:|--:|")
	for _, c := range r.BeforeAfter {
		p("| %s | %s | %s | %s |", c.Figure, figure(c.Before), figure(c.After), change(c))
	}
	p("")
}

func figure(v float64) string {
	if v >= 1000 {
		return thousands(int64(math.Round(v)))
	}
	return fmt.Sprintf("%.1f", v)
}

// change is after against before: a percentage, or a factor from ×2 (or
// ÷2) on.
func change(c Change) string {
	ratio := c.After / c.Before
	switch {
	case ratio >= 10:
		return "×" + thousands(int64(math.Round(ratio)))
	case ratio >= 2:
		return fmt.Sprintf("×%.1f", ratio)
	case ratio <= 0.1:
		return "÷" + thousands(int64(math.Round(1/ratio)))
	case ratio <= 0.5:
		return fmt.Sprintf("÷%.1f", 1/ratio)
	}
	return fmt.Sprintf("%+.0f%%", 100*(ratio-1))
}
