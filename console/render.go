package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/pgscribe/pgscribe/admin"
)

// parsePages parses each page template with the shared layout.
func parsePages() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	for _, name := range []string{"overview", "version", "confirm", "result"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console templates: %w", err)
		}
		pages[name] = t
	}
	return pages, nil
}

var funcs = template.FuncMap{
	"bytes":    formatBytesPtr,
	"seconds":  formatSecondsPtr,
	"time":     formatTime,
	"ago":      ago,
	"json":     prettyJSON,
	"bar":      progressBar,
	"lowerCSS": func(s string) string { return strings.ToLower(s) },
	"dur":      func(d time.Duration) string { return d.Round(100 * time.Microsecond).String() },
}

// render executes a page into a buffer first, so that a template error
// becomes a 500 rather than half a page.
func (s *Server) render(w http.ResponseWriter, status int, page string, data any) {
	var buf bytes.Buffer
	if err := s.pages[page].Execute(&buf, data); err != nil {
		s.log.Error("console: render", "page", page, "err", err)
		http.Error(w, "console: render "+page+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func formatBytesPtr(b *int64) string {
	if b == nil {
		return "–"
	}
	return admin.FormatBytes(*b)
}

func formatSecondsPtr(s *float64) string {
	if s == nil {
		return "–"
	}
	return admin.FormatSeconds(*s)
}

func formatTime(t any) string {
	switch v := t.(type) {
	case time.Time:
		if v.IsZero() {
			return "–"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	case *time.Time:
		if v == nil || v.IsZero() {
			return "–"
		}
		return v.UTC().Format("2006-01-02 15:04:05Z")
	}
	return "–"
}

// ago renders how long before now t was: "3m ago".
func ago(t any) string {
	var at time.Time
	switch v := t.(type) {
	case time.Time:
		at = v
	case *time.Time:
		if v != nil {
			at = *v
		}
	}
	if at.IsZero() {
		return ""
	}
	return admin.FormatSeconds(max(time.Since(at).Seconds(), 0)) + " ago"
}

// prettyJSON indents a JSON document; anything else is returned as is
// (escaped by the template like any text).
func prettyJSON(raw []byte) string {
	if len(raw) == 0 {
		return "null"
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, raw, "", "  "); err != nil {
		return string(raw)
	}
	return buf.String()
}

// progressBar draws percent (0–100) as an SVG bar. Only numbers go into
// the markup.
func progressBar(percent float64) template.HTML {
	p := math.Min(math.Max(percent, 0), 100)
	return template.HTML(fmt.Sprintf(`<svg class="bar" viewBox="0 0 100 6" preserveAspectRatio="none" role="img" aria-label="%.1f%%"><rect class="bar-bg" width="100" height="6" rx="2"/><rect class="bar-fg" width="%.2f" height="6" rx="2"/></svg>`, p, p))
}

// sparkline draws values (oldest first) as an SVG polyline scaled to their
// range (from 0), with the last value's dot. Only numbers go into the
// markup. Fewer than two values draw an empty frame.
func sparkline(values []float64, label string) template.HTML {
	return drawLine(values, label, "spark", 120, 24)
}

// drawLine is sparkline at any size, with the svg element's class.
func drawLine(values []float64, label, class string, w, h float64) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="%s" viewBox="0 0 %g %g" preserveAspectRatio="none" role="img" aria-label="%s">`, class, w, h, template.HTMLEscapeString(label))
	if len(values) >= 2 {
		top := 0.0
		for _, v := range values {
			top = math.Max(top, v)
		}
		if top == 0 {
			top = 1
		}
		b.WriteString(`<polyline fill="none" vector-effect="non-scaling-stroke" points="`)
		var x, y float64
		for i, v := range values {
			x = float64(i) * w / float64(len(values)-1)
			y = h - 1 - v/top*(h-2)
			fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
		}
		fmt.Fprintf(&b, `"/><circle cx="%.1f" cy="%.1f" r="1.5"/>`, x, y)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// lagValues, backlogValues and rateValues turn a history into the series
// of the sparklines: lag in seconds (unknown counts as 0), of every
// sample; backlog in events and throughput in events per second between
// two counts, of the samples that counted (every Options.Counts).
func lagValues(pts []point) []float64 {
	out := make([]float64, len(pts))
	for i, p := range pts {
		if p.HasLag {
			out[i] = p.Lag
		}
	}
	return out
}

func backlogValues(pts []point) []float64 {
	pts = counted(pts)
	out := make([]float64, len(pts))
	for i, p := range pts {
		out[i] = float64(p.Backlog)
	}
	return out
}

// counted keeps the points of the samples that counted.
func counted(pts []point) []point {
	out := make([]point, 0, len(pts))
	for _, p := range pts {
		if p.Counted {
			out = append(out, p)
		}
	}
	return out
}

func rateValues(pts []point) []float64 {
	pts = counted(pts)
	if len(pts) < 2 {
		return nil
	}
	out := make([]float64, 0, len(pts)-1)
	for i := 1; i < len(pts); i++ {
		dt := pts[i].At.Sub(pts[i-1].At).Seconds()
		r := 0.0
		if dt > 0 {
			r = math.Max(float64(pts[i].Accounted-pts[i-1].Accounted)/dt, 0)
		}
		out = append(out, r)
	}
	return out
}

// lastRate is the throughput of the last two samples, in events/s.
func lastRate(pts []point) float64 {
	r := rateValues(pts)
	if len(r) == 0 {
		return 0
	}
	return r[len(r)-1]
}

// series is one history chart of a version page.
type series struct {
	Name  string
	Unit  string
	Now   float64
	Max   float64
	Chart template.HTML
}

// historyOf draws a version's history as the version page's charts.
func historyOf(pts []point) (out []series, span time.Duration) {
	if len(pts) > 1 {
		span = pts[len(pts)-1].At.Sub(pts[0].At).Round(time.Second)
	}
	for _, s := range []struct {
		name, unit string
		values     []float64
	}{
		{"lag", "s", lagValues(pts)},
		{"backlog", "events", backlogValues(pts)},
		{"throughput", "events/s", rateValues(pts)},
	} {
		sr := series{Name: s.name, Unit: s.unit, Chart: drawLine(s.values, s.name+" history", "chart", 600, 80)}
		for _, v := range s.values {
			sr.Max = math.Max(sr.Max, v)
		}
		if len(s.values) > 0 {
			sr.Now = s.values[len(s.values)-1]
		}
		out = append(out, sr)
	}
	return out, span
}
