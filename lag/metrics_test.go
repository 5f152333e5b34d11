package lag

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestMetricsContract checks every name and label set that the metrics
// table of docs/runbook.md lists, and that a projection's series exist
// before its first batch.
func TestMetricsContract(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "1.2.3")
	p := m.For("balances", 1)
	p.DeadLettered("rule:open")

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range families {
		got[f.GetName()] = f
	}
	tests := []struct {
		name   string
		typ    dto.MetricType
		labels []string
	}{
		{"pgscribe_events_total", dto.MetricType_COUNTER, []string{"outcome", "projection", "version"}},
		{"pgscribe_batches_total", dto.MetricType_COUNTER, []string{"projection", "result", "version"}},
		{"pgscribe_batch_duration_seconds", dto.MetricType_HISTOGRAM, []string{"projection", "version"}},
		{"pgscribe_batch_events", dto.MetricType_HISTOGRAM, []string{"projection", "version"}},
		{"pgscribe_lag_seconds", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_replication_lag_bytes", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_backlog_events", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_watermark_lsn", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_active", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_halted", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_dead_letters_total", dto.MetricType_COUNTER, []string{"error_kind", "projection", "version"}},
		{"pgscribe_build_info", dto.MetricType_GAUGE, []string{"goversion", "version"}},
		// Beyond §9.
		{"pgscribe_last_commit_timestamp_seconds", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_watermark_commit_timestamp_seconds", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_slot_retained_wal_bytes", dto.MetricType_GAUGE, []string{"projection", "version"}},
		{"pgscribe_lag_probe_errors_total", dto.MetricType_COUNTER, []string{"projection", "version"}},
		{"pgscribe_stream_gaps_total", dto.MetricType_COUNTER, []string{"projection", "version"}},
		{"pgscribe_restarts_total", dto.MetricType_COUNTER, []string{"projection", "version"}},
		{"pgscribe_isolation_attempts_total", dto.MetricType_COUNTER, []string{"projection", "version"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, ok := got[tt.name]
			if !ok {
				t.Fatalf("%s is not exported before the first batch", tt.name)
			}
			if f.GetType() != tt.typ {
				t.Errorf("type %v, want %v", f.GetType(), tt.typ)
			}
			for _, s := range f.GetMetric() {
				var names []string
				for _, l := range s.GetLabel() {
					names = append(names, l.GetName())
				}
				slices.Sort(names)
				if !slices.Equal(names, tt.labels) {
					t.Errorf("labels %v, want %v", names, tt.labels)
				}
			}
		})
	}
	for name := range got {
		if !strings.HasPrefix(name, "pgscribe_") {
			t.Errorf("%s: every pgscribe metric has the pgscribe_ prefix", name)
		}
	}
	// Every outcome and result starts at zero, so rate() sees the first one.
	if n := testutil.CollectAndCount(m.Events); n != 3 {
		t.Errorf("%d events_total series, want 3 outcomes", n)
	}
	if n := testutil.CollectAndCount(m.Batches); n != 4 {
		t.Errorf("%d batches_total series, want 4 results", n)
	}
}

func TestMetricsReport(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry(), "test")
	p := m.For("balances", 2)
	p.Report(Reading{LagSeconds: 1.5, LagBytes: 4096, RetainedBytes: 8192, SlotKnown: true, Backlog: 7, BacklogKnown: true,
		Watermark: 0x16B374D848, WatermarkTime: time.Unix(1700000000, 500_000_000), LastCommit: time.Unix(1700000001, 0)})
	// A reading that knows less keeps what the last one knew.
	p.Report(Reading{LagSeconds: 2, Watermark: 0x16B374D848})
	checks := []struct {
		g    *prometheus.GaugeVec
		want float64
	}{
		{m.LagSeconds, 2},
		{m.LagBytes, 4096},
		{m.SlotRetained, 8192},
		{m.Backlog, 7},
		{m.WatermarkLSN, 0x16B374D848},
		{m.WatermarkTime, 1700000000.5},
		{m.LastCommit, 1700000001},
	}
	for _, c := range checks {
		if got := testutil.ToFloat64(c.g.WithLabelValues("balances", "2")); got != c.want {
			t.Errorf("%v = %v, want %v", c.g, got, c.want)
		}
	}
	p.ProbeFailed()
	if got := testutil.ToFloat64(m.ProbeErrors.WithLabelValues("balances", "2")); got != 1 {
		t.Errorf("probe errors = %v, want 1", got)
	}
}

func TestMetricsHalt(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry(), "test")
	p := m.For("balances", 1)
	p.Halt("source", "42704")
	p.Halt("source", "42501")
	p.Halt("lock", "28P01")
	p.Halt("source", "")
	for _, c := range []struct {
		stage, class string
		want         float64
	}{{"source", "42", 2}, {"lock", "28", 1}, {"source", "none", 1}} {
		if got := testutil.ToFloat64(m.Halts.WithLabelValues("balances", "1", c.stage, c.class)); got != c.want {
			t.Errorf("pgscribe_halts_total{stage=%q,sqlstate_class=%q} = %v, want %v", c.stage, c.class, got, c.want)
		}
	}
	if n := testutil.CollectAndCount(m.Halts); n != 3 {
		t.Errorf("%d halts_total series, want 3: the label is the SQLSTATE's class, not the code", n)
	}
}
