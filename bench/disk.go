package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"syscall"
	"time"
)

// DiskProbe is what one 8 KiB write followed by fdatasync costs on the
// disk of the run, timed back to back for a few seconds with nothing else
// of the bench running: the cost of a commit's WAL flush, and how often the
// disk stalls one. Latency percentiles (W4) cannot be lower than a stall.
type DiskProbe struct {
	Dir        string  `json:"dir"`
	SameDevice bool    `json:"same_device_as_pgdata"` // Dir is on the device of PostgreSQL's data directory
	Seconds    float64 `json:"seconds"`
	Syncs      int     `json:"syncs"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	P999       float64 `json:"p999_ms"`
	Max        float64 `json:"max_ms"`
	Over10ms   int     `json:"over_10ms"`
	StalledMS  float64 `json:"stalled_ms"` // total time inside syncs of over 10 ms
}

// probeDisk times 8 KiB write + fdatasync cycles in dir for d.
func probeDisk(ctx context.Context, dir string, d time.Duration) (*DiskProbe, error) {
	f, err := os.CreateTemp(dir, "pgscribe-bench-fsync-")
	if err != nil {
		return nil, fmt.Errorf("disk probe: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 8192)
	var lat []float64
	start := time.Now()
	for time.Since(start) < d && ctx.Err() == nil {
		t := time.Now()
		// The same 16 pages over and over, as WAL pages are rewritten.
		if _, err := f.WriteAt(buf, int64(len(lat)%16)*8192); err != nil {
			return nil, fmt.Errorf("disk probe: %w", err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return nil, fmt.Errorf("disk probe: %w", err)
		}
		lat = append(lat, float64(time.Since(t).Microseconds())/1000)
	}
	p := &DiskProbe{Dir: dir, Seconds: time.Since(start).Seconds(), Syncs: len(lat)}
	for _, l := range lat {
		if l > 10 {
			p.Over10ms++
			p.StalledMS += l
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		p.P50, p.P99, p.P999, p.Max = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 0.999), lat[len(lat)-1]
	}
	return p, ctx.Err()
}

// sameDevice reports whether two paths are on one device.
func sameDevice(a, b string) bool {
	var sa, sb syscall.Stat_t
	return syscall.Stat(a, &sa) == nil && syscall.Stat(b, &sb) == nil && sa.Dev == sb.Dev
}

// line renders the probe for RESULTS.md.
func (p *DiskProbe) line() string {
	where := "not known to be PostgreSQL's disk"
	if p.SameDevice {
		where = "the device of PostgreSQL's data directory"
	}
	return fmt.Sprintf("8 KiB write + fdatasync, back to back for %.0f s in %s (%s), before the workloads: %s syncs, "+
		"p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms, max %.1f ms; %d took over 10 ms, %.0f ms in all",
		p.Seconds, p.Dir, where, thousands(int64(p.Syncs)), p.P50, p.P99, p.P999, p.Max, p.Over10ms, p.StalledMS)
}
