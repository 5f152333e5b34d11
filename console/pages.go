package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/pgscribe/pgscribe/admin"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/engine"
	"github.com/pgscribe/pgscribe/rules"
)

// page is what every page's layout needs.
type page struct {
	Title       string
	Refresh     int    // live refresh interval in ms; 0 for a page that is not live
	CountsEvery string // Options.Counts, for people
	Sample      sample
	Actions     bool // actions are configured
	TokenNeeded bool // the forms ask for the token (no trusted header on this request)
	User        string
	CSRF        string
	Node        string
}

// card is one projection version on the overview and its page's header.
type card struct {
	admin.ProjectionStatus
	ID        string // HTML id
	Lag       template.HTML
	Backlog   template.HTML
	Rate      template.HTML
	RateNow   float64
	Reason    string // why it is halted or paused, in one line
	Spec      *rules.Spec
	HaltSince string
}

type overviewData struct {
	page
	Cards    []card
	Report   *admin.StatusReport
	Counts   map[engine.State]int
	Problems int
}

func (s *Server) basePage(r *http.Request, title string, smp sample) page {
	user := ""
	if h := s.cfg.Metrics.ConsoleAuthHeader; h != "" {
		user = r.Header.Get(h)
	}
	return page{Title: title, Refresh: int(s.opts.Interval / time.Millisecond), Sample: smp, CountsEvery: s.opts.Counts.String(),
		Actions: s.actionsEnabled(), TokenNeeded: user == "" && s.cfg.Metrics.ConsoleToken != "",
		User: user, CSRF: s.csrf, Node: s.cfg.Engine.Node}
}

func (s *Server) cardOf(p admin.ProjectionStatus) card {
	pts := s.sampler.points(p.Projection, p.Version)
	c := card{ProjectionStatus: p, ID: fmt.Sprintf("v-%s-%d", p.Projection, p.Version),
		Lag:     sparkline(lagValues(pts), "lag, last minutes"),
		Backlog: sparkline(backlogValues(pts), "backlog, last minutes"),
		Rate:    sparkline(rateValues(pts), "throughput, last minutes"),
		RateNow: lastRate(pts)}
	switch {
	case p.State == engine.StateHalted:
		c.Reason = "halted"
		if p.HaltStage != "" {
			c.Reason += " at the " + p.HaltStage + " stage"
		}
		if p.HaltSQLState != "" {
			c.Reason += ", SQLSTATE " + p.HaltSQLState
		}
		c.Reason += ": " + p.HaltReason
	case p.Paused != nil:
		c.Reason = "paused by " + orDash(p.Paused.By) + " since " + formatTime(p.Paused.At)
		if p.Paused.Reason != "" {
			c.Reason += ": " + p.Paused.Reason
		}
	}
	for i := range s.cfg.Projections {
		if spec := &s.cfg.Projections[i]; spec.Name == p.Projection && spec.Version == p.Version {
			c.Spec = spec
		}
	}
	return c
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}

func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	smp := s.sampler.current(r.Context())
	d := overviewData{page: s.basePage(r, "pgscribe console", smp), Report: smp.Report, Counts: map[engine.State]int{}}
	if smp.Report != nil {
		for _, p := range smp.Report.Projections {
			d.Cards = append(d.Cards, s.cardOf(p))
			d.Counts[p.State]++
			if p.State == engine.StateHalted || p.DeadLetters > 0 || p.ParkedStreams > 0 {
				d.Problems++
			}
		}
	}
	s.render(w, http.StatusOK, "overview", d)
}

// statusJSON serves the latest reading as `pgscribe status -json` prints it,
// with its counts as of the X-Pgscribe-Counts-As-Of header.
func (s *Server) statusJSON(w http.ResponseWriter, r *http.Request) {
	smp := s.sampler.current(r.Context())
	if smp.Report == nil {
		msg := "no status yet"
		if smp.Err != nil {
			msg = smp.Err.Error()
		}
		http.Error(w, msg, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	// The counts (events, backlog, dead letters, parked and adopted
	// events) are older than the rest of the reading: when they were taken.
	w.Header().Set("X-Pgscribe-Counts-As-Of", smp.CountsAt.UTC().Format(time.RFC3339Nano))
	_ = json.NewEncoder(w).Encode(smp.Report)
}

// dlFilter is the dead-letter filter of a version page's query string.
type dlFilter struct {
	Kind, Stream, Rule string
	After              int64
}

func filterOf(r *http.Request) dlFilter {
	after, _ := strconv.ParseInt(r.FormValue("after"), 10, 64)
	return dlFilter{Kind: r.FormValue("kind"), Stream: r.FormValue("stream"), Rule: r.FormValue("rule"), After: max(after, 0)}
}

// deadletter.Filter of a version: a rule selects the error kind
// "rule:<name>" (a rule's failures are dead-lettered with that kind).
func (f dlFilter) of(projection string, version int64) deadletter.Filter {
	kind := f.Kind
	if f.Rule != "" {
		kind = "rule:" + f.Rule
	}
	return deadletter.Filter{Projection: projection, Version: version, ErrorKind: kind, StreamID: f.Stream, AfterID: f.After}
}

// Query renders the filter as a query string (without paging), for links:
// typed as a URL so that the template keeps its = and &.
func (f dlFilter) Query() template.URL {
	q := make([]string, 0, 3)
	for _, kv := range [][2]string{{"kind", f.Kind}, {"stream", f.Stream}, {"rule", f.Rule}} {
		if kv[1] != "" {
			q = append(q, kv[0]+"="+template.URLQueryEscaper(kv[1]))
		}
	}
	return template.URL(strings.Join(q, "&"))
}

const pageSize = 50

type versionData struct {
	page
	Card        card
	Found       bool
	Projection  string
	Version     int64
	Filter      dlFilter
	Stats       deadletter.Stats
	DeadLetters []deadletter.Row
	More        bool
	NextAfter   int64
	Parked      []deadletter.ParkedStream
	Rules       []rules.RuleSpec
	History     []series
	Span        time.Duration // of History
	Err         string
}

func (s *Server) versionOf(r *http.Request) (string, int64, bool) {
	v, err := strconv.ParseInt(r.PathValue("version"), 10, 64)
	return r.PathValue("projection"), v, err == nil && v > 0
}

func (s *Server) versionPage(w http.ResponseWriter, r *http.Request) {
	proj, ver, ok := s.versionOf(r)
	if !ok {
		http.Error(w, "not a projection version", http.StatusNotFound)
		return
	}
	smp := s.sampler.current(r.Context())
	d := versionData{page: s.basePage(r, fmt.Sprintf("%s v%d · pgscribe console", proj, ver), smp),
		Projection: proj, Version: ver, Filter: filterOf(r)}
	if smp.Report != nil {
		for _, p := range smp.Report.Projections {
			if p.Projection == proj && p.Version == ver {
				d.Card, d.Found = s.cardOf(p), true
				d.History, d.Span = historyOf(s.sampler.points(proj, ver))
				if d.Card.Spec != nil {
					d.Rules = d.Card.Spec.Rules
				}
			}
		}
	}
	// live.js swaps only the live part: its polls skip the dead letters,
	// which are read when the page is loaded.
	if r.Header.Get("X-Console-Live") != "" {
		s.render(w, http.StatusOK, "version", d)
		return
	}
	if err := s.loadDeadLetters(r.Context(), &d); err != nil {
		d.Err = err.Error()
	}
	if !d.Found && d.Stats.Total == 0 && len(d.Parked) == 0 && d.Err == "" {
		s.render(w, http.StatusNotFound, "version", d)
		return
	}
	s.render(w, http.StatusOK, "version", d)
}

// loadDeadLetters reads one page of the version's dead letters (the
// filter's), their counts by kind and its parked streams.
func (s *Server) loadDeadLetters(ctx context.Context, d *versionData) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	schema := s.cfg.Engine.Schema
	f := d.Filter.of(d.Projection, d.Version)
	f.Limit = pageSize + 1
	rows, err := deadletter.List(ctx, s.target, schema, f)
	if err != nil {
		return err
	}
	if len(rows) > pageSize {
		rows, d.More = rows[:pageSize], true
		d.NextAfter = rows[pageSize-1].ID
	}
	d.DeadLetters = rows
	// The counts by kind are of the whole version, so that the kind filter
	// offers every kind.
	if d.Stats, err = deadletter.GetStats(ctx, s.target, schema, deadletter.Filter{Projection: d.Projection, Version: d.Version}); err != nil {
		return err
	}
	d.Parked, err = deadletter.ParkedStreams(ctx, s.target, schema, d.Projection, d.Version, 100)
	return err
}
