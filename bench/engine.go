package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/engine"
	"github.com/pgscribe/pgscribe/event"
)

// stopTimeout bounds a graceful stop of the engine before it is killed.
const stopTimeout = 2 * time.Minute

// engineProc is one running engine: the pgscribe binary as a child process,
// or engine.RunAll inside the bench (for CPU profiles).
type engineProc struct {
	pid       int // whose /proc entry measures it
	inProcess bool
	started   time.Time
	log       *logWatch
	done      chan struct{} // closed when the engine has exited
	exitErr   error         // valid once done is closed

	signal      func() // asks for a graceful stop
	kill        func()
	profile     *os.File // in-process CPU profile being written, or nil
	profileOnce sync.Once
}

// startBinary runs `bin run -config cfgPath`, its output to logPath.
func startBinary(bin, cfgPath, logPath string) (*engineProc, error) {
	lw, err := newLogWatch(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "run", "-config", cfgPath)
	cmd.Stdout, cmd.Stderr = lw, lw // one writer: exec serialises the writes
	if err := cmd.Start(); err != nil {
		lw.Close()
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	p := &engineProc{pid: cmd.Process.Pid, started: time.Now(), log: lw, done: make(chan struct{}),
		signal: func() { _ = cmd.Process.Signal(syscall.SIGTERM) },
		kill:   func() { _ = cmd.Process.Kill() }}
	go func() {
		p.exitErr = cmd.Wait()
		lw.Close()
		close(p.done)
	}()
	return p, nil
}

// binaryGOGC is the GC target the pgscribe binary sets for itself when GOGC
// is not in its environment (main.go). The in-process run uses it too, or
// its profile would show the garbage collector at twice the binary's rate.
const binaryGOGC = 200

// startInProcess runs engine.RunAll on cfgPath inside this process with the
// CPU profiler on, writing profilePath until stopProfile (or exit). Like the
// binary, it runs at GOGC=binaryGOGC unless GOGC is set.
func startInProcess(cfgPath, logPath, profilePath string) (*engineProc, error) {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return nil, err
	}
	lw, err := newLogWatch(logPath)
	if err != nil {
		return nil, err
	}
	prof, err := os.Create(profilePath)
	if err != nil {
		lw.Close()
		return nil, err
	}
	// The peak RSS of this run, not of the bench so far: writing 5 to
	// clear_refs resets VmHWM to the current RSS (Linux 4.0 on).
	_ = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0)
	if err := pprof.StartCPUProfile(prof); err != nil {
		prof.Close()
		lw.Close()
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	hard, hardStop := context.WithCancel(context.Background())
	p := &engineProc{pid: os.Getpid(), inProcess: true, started: time.Now(), log: lw, done: make(chan struct{}),
		signal: stop, kill: hardStop, profile: prof}
	logger := slog.New(slog.NewTextHandler(lw, nil))
	restoreGC := func() {}
	if os.Getenv("GOGC") == "" {
		old := debug.SetGCPercent(binaryGOGC)
		restoreGC = func() { debug.SetGCPercent(old) }
	}
	go func() {
		p.exitErr = engine.RunAll(ctx, cfg, engine.RunOptions{Version: "bench", Logger: logger, Hard: hard})
		p.stopProfile()
		restoreGC()
		lw.Close()
		stop()
		hardStop()
		close(p.done)
	}()
	return p, nil
}

// starter returns how a workload starts its engine: the -bin binary, or,
// with -profile where the workload asks for it (profiled), engine.RunAll
// inside this process under the CPU profiler (this tree's engine, not
// -bin), writing raw/cpu-<id>.pprof. The run's figures are then the
// in-process engine's: the bench's own CPU counts as the engine's.
func (b *bench) starter(id, cfg, logPath string, profiled bool) func() (*engineProc, error) {
	if !profiled || !b.opts.profile {
		return func() (*engineProc, error) { return startBinary(b.opts.bin, cfg, logPath) }
	}
	prof := filepath.Join(b.opts.rawDir, "cpu-"+strings.ToLower(id)+".pprof")
	say("%s: in-process under the CPU profiler, %s", id, prof)
	return func() (*engineProc, error) { return startInProcess(cfg, logPath, prof) }
}

// stopProfile ends the in-process CPU profile; a no-op otherwise.
func (p *engineProc) stopProfile() {
	if p.profile == nil {
		return
	}
	p.profileOnce.Do(func() {
		pprof.StopCPUProfile()
		_ = p.profile.Close()
	})
}

// exited reports whether the engine has stopped.
func (p *engineProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// check returns an error when the engine exited or logged an error.
func (p *engineProc) check() error {
	if p.exited() {
		return fmt.Errorf("engine exited early (%v); see %s", p.exitErr, p.log.path)
	}
	if e := p.log.firstError(); e != "" {
		return fmt.Errorf("engine logged an error: %s (see %s)", e, p.log.path)
	}
	return nil
}

// stop stops the engine gracefully (SIGTERM, or cancelling RunAll), killing
// it after stopTimeout.
func (p *engineProc) stop() error {
	p.stopProfile()
	if p.exited() {
		return p.exitErr
	}
	p.signal()
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		p.kill()
		<-p.done
		return fmt.Errorf("engine did not stop within %s; killed", stopTimeout)
	}
	return p.exitErr
}

// sample is the engine's and the server's resource use at one instant.
type sample struct {
	at    time.Time
	cpu   time.Duration // engine process CPU
	pgCPU time.Duration // PostgreSQL's CPU (0 when not measurable)
	pgOK  bool
	hwm   int64         // engine peak RSS so far
	busy  time.Duration // CPU of the whole machine (machineBusy)
	bOK   bool
}

// otherCores is how many cores, on average between s0 and s1, processes
// other than the engine and PostgreSQL kept busy: the machine's busy time
// less theirs. The bench program is among them, except in-process where it
// is the engine. Negative when not measurable.
func otherCores(s0, s1 sample) float64 {
	wall := s1.at.Sub(s0.at)
	if !s0.bOK || !s1.bOK || !s0.pgOK || !s1.pgOK || wall <= 0 {
		return -1
	}
	other := (s1.busy - s0.busy) - (s1.cpu - s0.cpu) - (s1.pgCPU - s0.pgCPU)
	return max(other.Seconds()/wall.Seconds(), 0)
}

func (b *bench) sample(p *engineProc) sample {
	s := sample{at: time.Now()}
	s.cpu, _ = processCPU(p.pid)
	s.hwm, _ = peakRSS(p.pid)
	s.pgCPU, s.pgOK = b.srv.cpu()
	s.busy, s.bOK = machineBusy()
	return s
}

// waitAccounted waits until every target has accounted for n events. It
// returns the resources sampled at that instant and, per projection, how
// long after the engine's start it got there.
//
// A backfill (fromLog) is over when the engine logs `backfill complete`
// (every event committed and the phase switched); the log is watched every
// 20 ms at no cost to the database, and the cursors are checked once at
// the end. Otherwise the watermarks are polled first, one row per target
// in one query every 20 ms: a target whose stored watermark covers the
// highest position of the events table has (barring a transaction that
// committed after a higher position's) accounted for everything, and it
// reached n when that is seen. Its cursors are then checked, and polled
// until they account for n if they do not yet (the time of reaching moves
// to then). Summing cursors scans a cursor row per stream: polled alone,
// for N targets, every 100 ms, it was the largest part of the server's
// work in W7's catch-up of 8 projections (0.3 of a core), a cost of the
// measurement that grows with N; so that poll spaces itself to at least
// five times its own duration (and 100 ms).
func (b *bench) waitAccounted(ctx context.Context, db *database, p *engineProc, targets []target, n int64, fromLog bool) (sample, map[string]time.Duration, error) {
	// Generous: a run slower than 1,000 events/s is broken, not slow.
	deadline := time.Now().Add(max(2*time.Minute, time.Duration(n/1000)*time.Second))
	reached := map[string]time.Duration{}
	if !fromLog {
		var err error
		if reached, err = b.waitWatermarks(ctx, db, p, targets, deadline); err != nil {
			return sample{}, nil, err
		}
		for _, t := range targets { // the watermark was a hint: the cursors decide
			got, err := db.accounted(ctx, t.projection, t.version)
			if err != nil {
				return sample{}, nil, err
			}
			if got < n {
				delete(reached, t.projection)
			}
		}
	}
	for len(reached) < len(targets) {
		if err := p.check(); err != nil {
			return sample{}, nil, err
		}
		if time.Now().After(deadline) {
			return sample{}, nil, fmt.Errorf("timed out waiting for %d events accounted for", n)
		}
		wait := 20 * time.Millisecond
		for _, t := range targets {
			if _, ok := reached[t.projection]; ok {
				continue
			}
			if fromLog {
				if l, ok := p.log.backfillOf(t.projection); ok {
					reached[t.projection] = l.at.Sub(p.started)
				}
				continue
			}
			q := time.Now()
			got, err := db.accounted(ctx, t.projection, t.version)
			if err != nil {
				return sample{}, nil, err
			}
			if got >= n {
				reached[t.projection] = time.Since(p.started)
			}
			wait = max(wait, 100*time.Millisecond, 5*time.Since(q))
		}
		if len(reached) == len(targets) {
			break
		}
		select {
		case <-ctx.Done():
			return sample{}, nil, ctx.Err()
		case <-time.After(wait):
		}
	}
	at := b.sample(p)
	if fromLog {
		for _, t := range targets {
			got, err := db.accounted(ctx, t.projection, t.version)
			if err != nil {
				return at, reached, err
			}
			if got != n {
				return at, reached, fmt.Errorf("%s logged its backfill complete with %d of %d events accounted for", t, got, n)
			}
		}
	}
	return at, reached, nil
}

// waitWatermarks waits until every target's stored watermark position
// covers the highest position of the events table (read once, first), and
// returns when each did, after the engine's start.
func (b *bench) waitWatermarks(ctx context.Context, db *database, p *engineProc, targets []target, deadline time.Time) (map[string]time.Duration, error) {
	var top int64
	if err := db.pool.QueryRow(ctx, "SELECT coalesce(max(position), 0) FROM events").Scan(&top); err != nil {
		return nil, fmt.Errorf("highest event position: %w", err)
	}
	names, versions := make([]string, len(targets)), make([]int64, len(targets))
	for i, t := range targets {
		names[i], versions[i] = t.projection, int64(t.version)
	}
	reached := map[string]time.Duration{}
	for {
		if err := p.check(); err != nil {
			return nil, err
		}
		done, err := event.QueryRows(ctx, db.pool, "watermarks", pgx.RowTo[string], `SELECT w.projection FROM pgscribe.watermarks AS w
			JOIN unnest($1::text[], $2::bigint[]) AS t (projection, version) USING (projection, version)
			WHERE w.position >= $3`, names, versions, top)
		if err != nil {
			return nil, err
		}
		for _, name := range done {
			if _, ok := reached[name]; !ok {
				reached[name] = time.Since(p.started)
			}
		}
		if len(reached) == len(targets) {
			return reached, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("timed out waiting for the watermarks of %d projections to reach position %d (%d did)", len(targets), top, len(reached))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// waitLive waits until every target is live (its backfill done).
func (b *bench) waitLive(ctx context.Context, db *database, p *engineProc, targets []target) error {
	return waitFor(ctx, 5*time.Minute, 100*time.Millisecond, "projections live", func() (bool, error) {
		if err := p.check(); err != nil {
			return false, err
		}
		for _, t := range targets {
			ph, err := db.phase(ctx, t.projection, t.version)
			if err != nil || ph != "live" {
				return false, err
			}
			if !p.log.live(t.projection) {
				return false, nil // stored as live, streaming not started yet
			}
		}
		return true, nil
	})
}

// backfillLog is what the engine logged when a backfill completed.
type backfillLog struct {
	at      time.Time // when the bench read the line
	events  int64
	seconds float64
	rate    float64 // events_per_second
}

// logWatch copies the engine's log to a file and picks out the lines the
// bench reads: backfill completions, state changes and errors.
type logWatch struct {
	path string
	f    *os.File

	mu       sync.Mutex
	partial  []byte
	backfill map[string]backfillLog // by projection
	isLive   map[string]bool
	errs     []string
}

func newLogWatch(path string) (*logWatch, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	return &logWatch{path: path, f: f, backfill: map[string]backfillLog{}, isLive: map[string]bool{}}, nil
}

var _ io.Writer = (*logWatch)(nil)

func (w *logWatch) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		_, _ = w.f.Write(b)
	}
	w.partial = append(w.partial, b...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			break
		}
		w.line(string(w.partial[:i]))
		w.partial = w.partial[i+1:]
	}
	return len(b), nil
}

// Close closes the copy; later writes are still parsed.
func (w *logWatch) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
}

var logField = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_.]*)=("(?:[^"\\]|\\.)*"|\S*)`)

// parseLogLine reads the key=value pairs of a slog text line.
func parseLogLine(line string) map[string]string {
	kv := map[string]string{}
	for _, m := range logField.FindAllStringSubmatch(line, -1) {
		v := m[2]
		if u, err := strconv.Unquote(v); err == nil && len(v) > 0 && v[0] == '"' {
			v = u
		}
		kv[m[1]] = v
	}
	return kv
}

func (w *logWatch) line(line string) {
	kv := parseLogLine(line)
	switch {
	case kv["level"] == "ERROR":
		w.errs = append(w.errs, kv["msg"]+": "+kv["err"])
	case kv["msg"] == "backfill complete":
		n, _ := strconv.ParseInt(kv["events"], 10, 64)
		s, _ := strconv.ParseFloat(kv["seconds"], 64)
		r, _ := strconv.ParseFloat(kv["events_per_second"], 64)
		w.backfill[kv["projection"]] = backfillLog{at: time.Now(), events: n, seconds: s, rate: r}
	case kv["msg"] == "state" && kv["state"] == "live":
		w.isLive[kv["projection"]] = true
	}
}

func (w *logWatch) firstError() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.errs) == 0 {
		return ""
	}
	return w.errs[0]
}

func (w *logWatch) live(projection string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.isLive[projection]
}

func (w *logWatch) backfillOf(projection string) (backfillLog, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b, ok := w.backfill[projection]
	return b, ok
}
