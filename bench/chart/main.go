// Command chart draws results.png from the bench's results.json: the
// throughput of each workload next to its two references (log scale), the
// W4 latency percentiles per load, and the peak RSS per backfill size. It
// is its own module so that the plotting library stays out of pgscribe's
// go.mod; the bench runs it with `go run .` in this directory.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// results holds the parts of results.json the chart draws.
type results struct {
	Workloads []struct {
		ID   string `json:"id"`
		Rows []struct {
			Kind       string  `json:"kind"`
			Projection string  `json:"projection"`
			Rate       float64 `json:"rate"`
			InProcess  bool    `json:"in_process"`
		} `json:"rows"`
		Latency []struct {
			TargetRate int     `json:"target_rate"`
			P50        float64 `json:"p50_ms"`
			P99        float64 `json:"p99_ms"`
			Max        float64 `json:"max_ms"`
		} `json:"latency"`
	} `json:"workloads"`
	Memory []struct {
		Events    int64   `json:"events"`
		PeakRSSMB float64 `json:"peak_rss_mb"`
	} `json:"memory"`
}

// series is one colour of a grouped bar chart: a value per group (0 = none).
type series struct {
	name   string
	color  color.Color
	values []float64
}

var (
	blue   = color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}
	grey   = color.RGBA{R: 0x99, G: 0x99, B: 0x99, A: 0xff}
	orange = color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}
	green  = color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}
	red    = color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}
)

func main() {
	in := flag.String("in", "../results.json", "results.json written by the bench")
	out := flag.String("out", "../results.png", "PNG to write")
	flag.Parse()
	if err := run(*in, *out); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(in, out string) error {
	b, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	var plots []*plot.Plot
	if p := throughput(&r); p != nil {
		plots = append(plots, p)
	}
	if p := latency(&r); p != nil {
		plots = append(plots, p)
	}
	if p := memory(&r); p != nil {
		plots = append(plots, p)
	}
	if len(plots) == 0 {
		return fmt.Errorf("%s: nothing to draw", in)
	}
	widths := map[int]vg.Length{1: 9, 2: 16, 3: 20}
	img := vgimg.NewWith(vgimg.UseWH(widths[len(plots)]*vg.Inch, 6*vg.Inch), vgimg.UseDPI(110))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: len(plots), PadX: vg.Inch / 3, PadTop: vg.Inch / 6,
		PadBottom: vg.Inch / 8, PadLeft: vg.Inch / 8, PadRight: vg.Inch / 6}
	canvases := plot.Align([][]*plot.Plot{plots}, tiles, dc)
	for i, p := range plots {
		p.Draw(canvases[0][i])
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// throughput: per workload and projection, the engine against the SQL
// ceiling and the per-event loop, events/s on a log scale.
func throughput(r *results) *plot.Plot {
	var groups []string
	// A series per row kind, in the legend's order.
	kinds := []string{"engine", "sql", "loop"}
	ss := []series{
		{name: "pgscribe", color: blue},
		{name: "SQL ceiling (one INSERT … SELECT)", color: grey},
		{name: "per-event loop (1 tx/event)", color: orange},
	}
	for _, w := range r.Workloads {
		index := map[string]int{}
		for _, row := range w.Rows {
			if row.InProcess || row.Projection == "*" {
				continue
			}
			i, ok := index[row.Projection]
			if !ok {
				i = len(groups)
				index[row.Projection] = i
				groups = append(groups, w.ID+"\n"+row.Projection)
				for k := range ss {
					ss[k].values = append(ss[k].values, 0)
				}
			}
			if k := slices.Index(kinds, row.Kind); k >= 0 {
				ss[k].values[i] = row.Rate
			}
		}
	}
	return grouped("Throughput, events/s (log scale)", "events/s", groups, true, kilo, ss...)
}

// latency: W4 end-to-end latency percentiles per producer rate.
func latency(r *results) *plot.Plot {
	var groups []string
	p50 := series{name: "p50", color: green}
	p99 := series{name: "p99", color: orange}
	mx := series{name: "max", color: red}
	for _, w := range r.Workloads {
		for _, l := range w.Latency {
			groups = append(groups, kilo(float64(l.TargetRate))+" events/s")
			p50.values = append(p50.values, l.P50)
			p99.values = append(p99.values, l.P99)
			mx.values = append(mx.values, l.Max)
		}
	}
	return grouped("W4 live: commit-to-commit latency, ms (log scale)", "ms", groups, true, millis, p50, p99, mx)
}

// memory: the engine's peak RSS per backfill size.
func memory(r *results) *plot.Plot {
	var groups []string
	rss := series{name: "peak RSS", color: blue}
	for _, m := range r.Memory {
		groups = append(groups, kilo(float64(m.Events))+" events")
		rss.values = append(rss.values, m.PeakRSSMB)
	}
	return grouped("Engine peak RSS per backfill, MB", "MB", groups, false, megabytes, rss)
}

// grouped builds a grouped bar chart with value labels on the bars, or
// returns nil when there are no groups to draw.
func grouped(title, unit string, groups []string, logScale bool, label func(float64) string, ss ...series) *plot.Plot {
	if len(groups) == 0 {
		return nil // the results hold nothing for this chart
	}
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = 14
	p.Y.Label.Text = unit
	p.X.Tick.Label.Font.Size = 10
	p.NominalX(groups...)
	width := vg.Points(math.Min(28, 160/float64(len(groups)*len(ss))))
	lo, hi := math.Inf(1), 0.0
	for _, s := range ss {
		for _, v := range s.values {
			if v > 0 {
				lo, hi = math.Min(lo, v), math.Max(hi, v)
			}
		}
	}
	b := &bars{base: 0, top: hi * 1.15, label: label}
	if logScale {
		b.base = math.Pow10(int(math.Floor(math.Log10(lo))))
		b.top = math.Pow10(int(math.Ceil(math.Log10(hi * 2))))
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = labelledTicks{label: label}
	}
	for i, s := range ss {
		sb := *b
		sb.series = s
		sb.width = width
		sb.offset = (vg.Length(i) - vg.Length(len(ss)-1)/2) * width
		p.Add(&sb)
		if len(ss) > 1 {
			p.Legend.Add(s.name, &sb)
		}
	}
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

// bars draws one series of a grouped bar chart from base up to each value,
// which works on a log scale too (gonum's BarChart starts at zero), and
// writes the value above each bar.
type bars struct {
	series
	base, top     float64
	width, offset vg.Length
	label         func(float64) string
}

func (b *bars) Plot(c draw.Canvas, p *plot.Plot) {
	trX, trY := p.Transforms(&c)
	sty := text.Style{Color: color.Black, Font: font.From(plot.DefaultFont, 8), XAlign: draw.XCenter,
		YAlign: draw.YBottom, Handler: p.TextHandler}
	for i, v := range b.values {
		if v <= 0 {
			continue
		}
		x := trX(float64(i)) + b.offset
		y0, y1 := trY(b.base), trY(v)
		pts := []vg.Point{{X: x - b.width/2, Y: y0}, {X: x + b.width/2, Y: y0}, {X: x + b.width/2, Y: y1}, {X: x - b.width/2, Y: y1}}
		c.FillPolygon(b.color, c.ClipPolygonXY(pts))
		c.FillText(sty, vg.Point{X: x, Y: y1 + 2}, b.label(v))
	}
}

func (b *bars) DataRange() (xmin, xmax, ymin, ymax float64) {
	return -0.5, float64(len(b.values)) - 0.5, b.base, b.top
}

func (b *bars) Thumbnail(c *draw.Canvas) {
	pts := []vg.Point{{X: c.Min.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Min.Y}, {X: c.Max.X, Y: c.Max.Y}, {X: c.Min.X, Y: c.Max.Y}}
	c.FillPolygon(b.color, c.ClipPolygonXY(pts))
}

// labelledTicks are log ticks labelled like the bars (10k, not 10000).
type labelledTicks struct{ label func(float64) string }

func (t labelledTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.LogTicks{Prec: -1}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = t.label(ticks[i].Value)
		}
	}
	return ticks
}

func kilo(v float64) string {
	switch {
	case v >= 1e6:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e6), ".0") + "M"
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 1e3:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", v/1e3), ".0") + "k"
	}
	return fmt.Sprintf("%.0f", v)
}

func millis(v float64) string {
	if v < 1 {
		return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
	}
	if v >= 10 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.1f", v)
}

func megabytes(v float64) string { return fmt.Sprintf("%.0f MB", v) }
