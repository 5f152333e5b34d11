package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ). It
// is 100 on every Linux architecture Go supports.
const clockTick = 10 * time.Millisecond

// procStat is what /proc/<pid>/stat says of one process.
type procStat struct {
	ppid     int
	cpu      time.Duration // utime + stime
	children time.Duration // cutime + cstime: CPU of children it has reaped
}

func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// split after the last ')'. Fields then start at field 3 (state).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	n := func(k int) int64 { v, _ := strconv.ParseInt(f[k], 10, 64); return v }
	return procStat{
		ppid:     int(n(1)),
		cpu:      time.Duration(n(11)+n(12)) * clockTick,
		children: time.Duration(n(13)+n(14)) * clockTick,
	}, nil
}

// processCPU returns the user + system CPU time pid has used so far.
func processCPU(pid int) (time.Duration, error) {
	st, err := readStat(pid)
	return st.cpu, err
}

// peakRSS returns VmHWM, the peak resident set size of pid, in bytes.
func peakRSS(pid int) (int64, error) { return statusBytes(pid, "VmHWM") }

// currentRSS returns a process's resident set size now, in bytes.
func currentRSS(pid int) (int64, error) { return statusBytes(pid, "VmRSS") }

// statusBytes reads a kB field of /proc/<pid>/status, in bytes.
func statusBytes(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

// treeCPU returns the CPU time of a PostgreSQL postmaster and all its
// processes: the postmaster's own, that of its live children (backends,
// walsenders, background workers), and that of the children it has already
// reaped (cutime/cstime), so backends that came and went are counted too.
// Only meaningful where the server runs on this host's pid namespace.
func treeCPU(postmaster int) (time.Duration, error) {
	root, err := readStat(postmaster)
	if err != nil {
		return 0, err
	}
	total := root.cpu + root.children
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == postmaster {
			continue
		}
		st, err := readStat(pid)
		if err != nil || st.ppid != postmaster {
			continue // gone, or not ours
		}
		total += st.cpu
	}
	return total, nil
}

// machineBusy returns the CPU time all of the machine's cores have spent
// busy (user, nice, system, irq, softirq, steal; guest time is in user) since
// boot, from the first line of /proc/stat.
func machineBusy() (time.Duration, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	var ticks int64
	for _, k := range []int{1, 2, 3, 6, 7, 8} { // skip idle (4) and iowait (5)
		v, err := strconv.ParseInt(f[k], 10, 64)
		if err != nil {
			return 0, false
		}
		ticks += v
	}
	return time.Duration(ticks) * clockTick, true
}

// loadAverage returns the first three fields of /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// meminfoTotal returns MemTotal from /proc/meminfo in bytes.
func meminfoTotal() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "MemTotal:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cpuModel returns the first "model name" of /proc/cpuinfo.
func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// sampleLoad reads the 1-minute load average every interval until ctx ends
// or the returned function is called; that function describes the samples.
func sampleLoad(ctx context.Context, every time.Duration) func() string {
	var (
		mu   sync.Mutex
		vals []float64
	)
	read := func() {
		b, err := os.ReadFile("/proc/loadavg")
		if err != nil {
			return
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			return
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			mu.Lock()
			vals = append(vals, v)
			mu.Unlock()
		}
	}
	ctx, stop := context.WithCancel(ctx)
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			read()
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() string {
		stop()
		mu.Lock()
		defer mu.Unlock()
		if len(vals) == 0 {
			return ""
		}
		s := slices.Sorted(slices.Values(vals))
		return fmt.Sprintf("1-minute load median %.2f, max %.2f (%d samples, every %s)",
			s[len(s)/2], s[len(s)-1], len(s), every)
	}
}
