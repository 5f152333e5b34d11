// Package deploy holds no Go code: its tests check the Prometheus alerting
// rules (prometheus/) and the Grafana dashboard (grafana/) against the
// metrics pgscribe really exports, so that a renamed metric cannot leave a
// dashboard panel empty or an alert silent. promtool checks the rules'
// syntax and behaviour (make lint-deploy).
package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
	"gopkg.in/yaml.v2"

	"github.com/pgscribe/pgscribe/lag"
)

// exported returns every metric name a pgscribe process serves: what
// lag.NewMetrics registers plus the Go and process collectors that
// engine.RunAll adds, plus Prometheus's own "up".
func exported(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	lag.NewMetrics(reg, "test").For("p", 1).DeadLettered("rule:r")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{"up": true}
	for _, f := range families {
		names[f.GetName()] = true
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			names[f.GetName()+"_bucket"] = true
			fallthrough
		case dto.MetricType_SUMMARY:
			names[f.GetName()+"_sum"] = true
			names[f.GetName()+"_count"] = true
		}
	}
	for _, want := range []string{"pgscribe_lag_seconds", "go_goroutines", "process_resident_memory_bytes"} {
		if !names[want] {
			t.Fatalf("%s is not exported: the test's registry does not match pgscribe's", want)
		}
	}
	return names
}

// PromQL words that are not metric names.
var promqlKeywords = map[string]bool{
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"bool": true, "and": true, "or": true, "unless": true, "offset": true, "atan2": true,
	"inf": true, "nan": true,
}

// Aggregation operators, which may be followed by a by/without clause
// rather than by their parenthesised argument.
var promqlAggregations = map[string]bool{
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true,
	"limit_ratio": true,
}

// metricNames returns the metric names an expression selects. It is a
// scanner, not a parser: strings, label matchers and ranges are dropped;
// an identifier followed by "(" is a function or aggregation; grouping
// clauses are skipped. Grafana's label_values(selector, label) counts its
// selector only.
func metricNames(expr string) []string {
	if m := regexp.MustCompile(`^\s*label_values\((.*),\s*\w+\s*\)\s*$`).FindStringSubmatch(expr); m != nil {
		expr = m[1]
	}
	var b strings.Builder
	depth := map[rune]int{}
	for i := 0; i < len(expr); i++ {
		c := rune(expr[i])
		switch {
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for j < len(expr) && rune(expr[j]) != c {
				if expr[j] == '\\' {
					j++
				}
				j++
			}
			i = j
			b.WriteString(" ")
		case c == '{':
			depth['{']++
		case c == '}':
			depth['{']--
			b.WriteString(" ")
		case c == '[':
			depth['[']++
		case c == ']':
			depth['[']--
			b.WriteString(" ")
		default:
			if depth['{'] == 0 && depth['['] == 0 {
				b.WriteRune(c)
			}
		}
	}
	s := b.String()
	isIdent := func(r rune, first bool) bool {
		return r == '_' || r == ':' || unicode.IsLetter(r) || (!first && unicode.IsDigit(r))
	}
	var out []string
	for i := 0; i < len(s); {
		r := rune(s[i])
		switch {
		case unicode.IsDigit(r) || r == '.':
			for i < len(s) && (isIdent(rune(s[i]), false) || s[i] == '.') {
				i++ // a number, 1e9 and 0x1F included
			}
		case r == '$':
			for i++; i < len(s) && isIdent(rune(s[i]), false); i++ {
			}
		case isIdent(r, true):
			j := i
			for j < len(s) && isIdent(rune(s[j]), false) {
				j++
			}
			word := s[i:j]
			k := j
			for k < len(s) && strings.ContainsRune(" \t\n", rune(s[k])) {
				k++
			}
			next := byte(0)
			if k < len(s) {
				next = s[k]
			}
			lower := strings.ToLower(word)
			switch {
			case promqlKeywords[lower] && next == '(':
				// A label list: by (a, b), on (x), group_left (y).
				for k < len(s) && s[k] != ')' {
					k++
				}
				j = k
			case promqlKeywords[lower], promqlAggregations[lower], next == '(':
			default:
				out = append(out, word)
			}
			i = j
		default:
			i++
		}
	}
	return out
}

func TestMetricNamesScanner(t *testing.T) {
	tests := []struct {
		expr string
		want []string
	}{
		{`max by (projection, version) (pgscribe_lag_seconds{job=~"$job"}) > 300`, []string{"pgscribe_lag_seconds"}},
		{`histogram_quantile(0.95, sum by (le) (rate(a_bucket{x="y}"}[$__rate_interval])))`, []string{"a_bucket"}},
		{"sum(a) / on (p) group_left (q) b unless c == 1e9", []string{"a", "b", "c"}},
		{`time() - max(x > 0)`, []string{"x"}},
		{`label_values(pgscribe_active{job=~"$job"}, projection)`, []string{"pgscribe_active"}},
		{`up{job="pgscribe"} == 0`, []string{"up"}},
	}
	for _, tt := range tests {
		if got := metricNames(tt.expr); !slices.Equal(got, tt.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tt.expr, got, tt.want)
		}
	}
}

type rulesFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// runbookAnchors returns the GitHub anchors of the runbook's headings.
func runbookAnchors(t *testing.T) map[string]bool {
	t.Helper()
	src, err := os.ReadFile("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(src), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var a strings.Builder
		for _, r := range h {
			switch {
			case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
				a.WriteRune(r)
			case r == ' ':
				a.WriteRune('-')
			}
		}
		anchors[a.String()] = true
	}
	return anchors
}

// TestAlertRules checks that every alert selects only exported metrics,
// carries a severity, a summary and a runbook link to an existing anchor
// of docs/runbook.md, and that the alerts the runbook promises exist.
func TestAlertRules(t *testing.T) {
	names := exported(t)
	anchors := runbookAnchors(t)
	src, err := os.ReadFile("prometheus/pgscribe-rules.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f rulesFile
	if err := yaml.UnmarshalStrict(src, &f); err != nil {
		t.Fatalf("pgscribe-rules.yml: %v", err)
	}
	seen := map[string]bool{}
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			t.Run(r.Alert, func(t *testing.T) {
				if r.Alert == "" {
					t.Fatalf("rule %q: pgscribe-rules.yml holds alerts only", r.Record)
				}
				seen[r.Alert] = true
				for _, n := range metricNames(r.Expr) {
					if !names[n] {
						t.Errorf("expr selects %s, which pgscribe does not export", n)
					}
				}
				if len(metricNames(r.Expr)) == 0 {
					t.Errorf("expr %q selects no metric", r.Expr)
				}
				if s := r.Labels["severity"]; s != "warning" && s != "critical" {
					t.Errorf("severity %q, want warning or critical", s)
				}
				if r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
					t.Error("summary or description annotation missing")
				}
				url := r.Annotations["runbook_url"]
				_, anchor, ok := strings.Cut(url, "docs/runbook.md#")
				if !ok || anchor != strings.ToLower(r.Alert) {
					t.Errorf("runbook_url %q, want …docs/runbook.md#%s", url, strings.ToLower(r.Alert))
				}
				if !anchors[anchor] {
					t.Errorf("docs/runbook.md has no heading for #%s", anchor)
				}
			})
		}
	}
	for _, want := range []string{"PgscribeLagHigh", "PgscribeSlotWALRetentionGrowing", "PgscribeProjectionHalted",
		"PgscribeDeadLetters", "PgscribeNoActiveNode", "PgscribeDown"} {
		if !seen[want] {
			t.Errorf("alert %s is missing", want)
		}
	}
}

type dashboard struct {
	UID           string                    `json:"uid"`
	Title         string                    `json:"title"`
	SchemaVersion int                       `json:"schemaVersion"`
	ID            *int                      `json:"id"`
	Panels        []panel                   `json:"panels"`
	Templating    struct{ List []variable } `json:"templating"`
}

type panel struct {
	ID         int                       `json:"id"`
	Type       string                    `json:"type"`
	Title      string                    `json:"title"`
	Datasource *datasourceRef            `json:"datasource"`
	GridPos    *struct{ H, W, X, Y int } `json:"gridPos"`
	Targets    []struct {
		RefID      string         `json:"refId"`
		Expr       string         `json:"expr"`
		Datasource *datasourceRef `json:"datasource"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type datasourceRef struct {
	Type string `json:"type"`
	UID  string `json:"uid"`
}

type variable struct {
	Name       string          `json:"name"`
	Type       string          `json:"type"`
	Query      json.RawMessage `json:"query"`
	Datasource *datasourceRef  `json:"datasource"`
}

// TestDashboard checks that the Grafana dashboard imports anywhere (a valid
// JSON model with a schemaVersion, no fixed id, the data source chosen by a
// variable) and that every query selects only exported metrics.
func TestDashboard(t *testing.T) {
	names := exported(t)
	src, err := os.ReadFile("grafana/pgscribe.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(src)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("pgscribe.json: %v", err)
	}
	if d.UID == "" || d.Title == "" || d.SchemaVersion < 30 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want all set (schemaVersion >= 30)", d.UID, d.Title, d.SchemaVersion)
	}
	if d.ID != nil {
		t.Errorf("id %d: an exported dashboard has a null id, or import overwrites another one", *d.ID)
	}
	vars := map[string]variable{}
	for _, v := range d.Templating.List {
		vars[v.Name] = v
	}
	if ds := vars["datasource"]; ds.Type != "datasource" || string(ds.Query) != `"prometheus"` {
		t.Errorf("want a datasource variable of type prometheus, got %+v", ds)
	}
	checkRef := func(where string, ref *datasourceRef) {
		t.Helper()
		if ref == nil || ref.UID != "${datasource}" || ref.Type != "prometheus" {
			t.Errorf("%s: datasource %+v, want the ${datasource} variable", where, ref)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		checkRef("variable "+v.Name, v.Datasource)
		var q struct{ Query string }
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Errorf("variable %s: query %s: %v", v.Name, v.Query, err)
		}
		for _, n := range metricNames(q.Query) {
			if !names[n] {
				t.Errorf("variable %s selects %s, which pgscribe does not export", v.Name, n)
			}
		}
	}
	ids := map[int]bool{}
	queries := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: bad gridPos %+v", p.Title, p.GridPos)
			}
			walk(p.Panels)
			if p.Type == "row" {
				continue
			}
			checkRef("panel "+p.Title, p.Datasource)
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				queries++
				checkRef("panel "+p.Title+" query "+q.RefID, q.Datasource)
				got := metricNames(q.Expr)
				if len(got) == 0 {
					t.Errorf("panel %q query %s selects no metric: %q", p.Title, q.RefID, q.Expr)
				}
				for _, n := range got {
					if !names[n] {
						t.Errorf("panel %q query %s selects %s, which pgscribe does not export", p.Title, q.RefID, n)
					}
				}
			}
		}
	}
	walk(d.Panels)
	// The dashboard shows what the issue asked for.
	all := string(src)
	for _, m := range []string{"pgscribe_lag_seconds", "pgscribe_events_total", "pgscribe_batch_duration_seconds_bucket",
		"pgscribe_dead_letters_total", "pgscribe_active", "pgscribe_slot_retained_wal_bytes", "pgscribe_backlog_events"} {
		if !strings.Contains(all, m) {
			t.Errorf("no panel shows %s", m)
		}
	}
	if queries < 10 {
		t.Errorf("%d queries: the dashboard looks truncated", queries)
	}
}
