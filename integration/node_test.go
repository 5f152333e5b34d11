package integration

// The pgscribe process of the harness (doc.go): node, its log and its
// HTTP listener.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// ---- the pgscribe process

// cliCommand prepares the binary with an environment that cannot override
// the test's configuration.
func cliCommand(ctx context.Context, bin string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PGSCRIBE_DATABASE_URL=") || strings.HasPrefix(kv, "PGSCRIBE_CONFIG=")
	})
	return cmd
}

// migrate runs `pgscribe migrate -events-table` with the configuration:
// the engine schema, the events table and the publication.
func migrate(t testing.TB, config string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if out, err := cliCommand(ctx, pgscribeBinary(t), "migrate", "-config", config, "-events-table").CombinedOutput(); err != nil {
		t.Fatalf("pgscribe migrate: %v\n%s", err, out)
	}
}

// node is `pgscribe run` as a child process, restartable: start runs it
// (again), every run's output is kept. JSON log lines are parsed into
// records (other lines become records with only msg); the metrics
// listener's address is read from the "metrics listening" record. When the
// test ends the process is killed, its output checked for data races and
// panics, and on failure its tail is logged and the whole saved.
type node struct {
	t      *testing.T
	name   string
	args   []string // after the binary: run -config …
	env    []string // added to the environment
	output string   // path of the file with every run's output
	// noListener: the configuration has metrics off, so start does not
	// wait for the listener.
	noListener bool
	// stopTimeout bounds stop (SIGTERM to exit); 0 means 90s.
	stopTimeout time.Duration

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current run has exited
	exitErr error
	state   *os.ProcessState
	lines   []string
	records []map[string]any
	addr    string // metrics listener of the current run
	// expectExit is set before the test stops or kills the process, so
	// that an exit does not count as broken.
	expectExit atomic.Bool
}

// newNode prepares (does not start) `pgscribe run -config config` named
// name. env is added to the environment: PGSCRIBE_DATABASE_URL and
// PGSCRIBE_CONFIG are cleared first, so the configuration file decides.
func newNode(t *testing.T, name, config string, env ...string) *node {
	t.Helper()
	n := &node{t: t, name: name, args: []string{"run", "-config", config},
		env:    append([]string{"PGSCRIBE_DATABASE_URL=", "PGSCRIBE_CONFIG=", "GORACE=atexit_sleep_ms=0 halt_on_error=0"}, env...),
		output: filepath.Join(t.TempDir(), name+".log")}
	t.Cleanup(n.cleanup)
	return n
}

// startNode is newNode and start.
func startNode(t *testing.T, name, config string, env ...string) *node {
	t.Helper()
	n := newNode(t, name, config, env...)
	n.start()
	return n
}

// start runs the process (again) and waits for its metrics listener
// (unless noListener).
func (n *node) start() {
	n.t.Helper()
	n.startNoWait()
	if !n.noListener {
		n.waitAddr()
	}
}

// startNoWait runs the process without waiting for anything.
func (n *node) startNoWait() {
	n.t.Helper()
	out, err := os.OpenFile(n.output, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(pgscribeBinary(n.t), n.args...)
	cmd.Env = append(os.Environ(), n.env...)
	cmd.Stdout = io.Discard
	stderr, err := cmd.StderrPipe()
	if err != nil {
		n.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start %s: %v", n.name, err)
	}
	exited := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.done, n.exitErr, n.state, n.addr = cmd, exited, nil, nil, ""
	n.mu.Unlock()
	n.expectExit.Store(false)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			fmt.Fprintf(out, "%s\n", sc.Bytes())
			n.addLine(sc.Text())
		}
		err := cmd.Wait()
		out.Close()
		n.mu.Lock()
		n.exitErr, n.state = err, cmd.ProcessState
		n.mu.Unlock()
		close(exited)
	}()
}

func (n *node) waitAddr() {
	n.t.Helper()
	waitFor(n.t, 60*time.Second, n.name+" to listen for metrics", func() bool {
		if !n.running() {
			n.t.Fatalf("%s exited at start-up: %v\n%s", n.name, n.err(), n.tail(20))
		}
		return n.metricsAddr() != ""
	})
}

func (n *node) addLine(line string) {
	var rec map[string]any
	if json.Unmarshal([]byte(line), &rec) != nil {
		rec = map[string]any{"msg": line, "raw": true}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lines = append(n.lines, line)
	n.records = append(n.records, rec)
	if rec["msg"] == "metrics listening" && n.addr == "" {
		n.addr, _ = rec["addr"].(string)
	}
}

func (n *node) metricsAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.addr
}

// runDone is closed when the current run exits (nil before the first).
func (n *node) runDone() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.done
}

// running reports whether the current run has not exited.
func (n *node) running() bool {
	exited := n.runDone()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// exited is !running.
func (n *node) exited() bool { return !n.running() }

// err is the current run's exit error (nil while it runs or after exit 0).
func (n *node) err() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exitErr
}

// broken says why the node can no longer make progress: it exited without
// being told to; "" if not. For waitUntil.
func (n *node) broken() string {
	if n.exited() && !n.expectExit.Load() {
		return fmt.Sprintf("%s exited unexpectedly (%v)", n.name, n.err())
	}
	return ""
}

// brokenOrHalted is broken, or a projection halted.
func (n *node) brokenOrHalted() string {
	if why := n.broken(); why != "" {
		return why
	}
	if n.logText("projection halted") > 0 {
		return n.name + " halted a projection"
	}
	return ""
}

// requireRunning fails t when the node has exited.
func (n *node) requireRunning() {
	n.t.Helper()
	if n.exited() {
		n.t.Fatalf("%s exited early: %v\n%s", n.name, n.err(), n.tail(40))
	}
}

func (n *node) pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd.Process.Pid
}

func (n *node) signal(sig syscall.Signal) {
	n.t.Helper()
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		n.expectExit.Store(true)
	}
	if err := syscall.Kill(n.pid(), sig); err != nil {
		n.t.Fatalf("signal %s to %s: %v", sig, n.name, err)
	}
}

// wait waits for the current run to exit and returns its exit code.
func (n *node) wait(timeout time.Duration) int {
	n.t.Helper()
	select {
	case <-n.runDone():
	case <-time.After(timeout):
		n.t.Fatalf("%s still running %s after being told to stop", n.name, timeout)
	}
	err := n.err()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	if err != nil {
		n.t.Fatalf("%s: %v", n.name, err)
	}
	return 0
}

// kill sends SIGKILL and waits for the process to be gone.
func (n *node) kill() {
	n.t.Helper()
	n.signal(syscall.SIGKILL)
	n.wait(30 * time.Second)
}

// terminate sends SIGTERM and requires a clean exit (code 0) within
// timeout. It returns how long the stop took.
func (n *node) terminate(timeout time.Duration) time.Duration {
	n.t.Helper()
	n.requireRunning()
	start := time.Now()
	n.signal(syscall.SIGTERM)
	code := n.wait(timeout)
	took := time.Since(start)
	if code != 0 {
		n.t.Fatalf("%s exited with code %d after SIGTERM, want 0\n%s", n.name, code, n.tail(40))
	}
	return took
}

// stop is terminate with stopTimeout (default 90s) to exit.
func (n *node) stop() {
	n.t.Helper()
	timeout := n.stopTimeout
	if timeout == 0 {
		timeout = 90 * time.Second
	}
	n.terminate(timeout)
}

// tail returns the last k output lines of every run.
func (n *node) tail(k int) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var b strings.Builder
	for _, l := range n.lines[max(0, len(n.lines)-k):] {
		fmt.Fprintf(&b, "  %s: %s\n", n.name, l)
	}
	return b.String()
}

// cleanup kills a run still going, fails the test on a data race or panic
// in any run, and on failure logs the tail of the output.
func (n *node) cleanup() {
	if n.running() {
		n.expectExit.Store(true)
		_ = syscall.Kill(n.pid(), syscall.SIGCONT) // a stopped process cannot die
		_ = syscall.Kill(n.pid(), syscall.SIGKILL)
		<-n.runDone()
	}
	n.mu.Lock()
	out := strings.Join(n.lines, "\n")
	n.mu.Unlock()
	for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
		if strings.Contains(out, bad) {
			n.t.Errorf("%s output contains %q", n.name, bad)
		}
	}
	if n.t.Failed() {
		n.t.Logf("%s (%v), last lines (all in %s):\n%s", n.name, n.err(), n.output, n.tail(60))
		if keep := filepath.Join(os.TempDir(), strings.ReplaceAll(n.t.Name(), "/", "_")+"-"+n.name+".log"); keep != "" {
			if b, err := os.ReadFile(n.output); err == nil && os.WriteFile(keep, b, 0o644) == nil {
				n.t.Logf("%s: full output kept in %s", n.name, keep)
			}
		}
	}
}

// ---- its log

// logMsg matches records by message prefix and, optionally, projection.
func logMsg(msgPrefix, projection string) func(map[string]any) bool {
	return func(r map[string]any) bool {
		m, _ := r["msg"].(string)
		return strings.HasPrefix(m, msgPrefix) && (projection == "" || r["projection"] == projection)
	}
}

// findLog returns the first record matching match, or nil.
func (n *node) findLog(match func(map[string]any) bool) map[string]any {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, r := range n.records {
		if match(r) {
			return r
		}
	}
	return nil
}

// countLog counts the records matching match.
func (n *node) countLog(match func(map[string]any) bool) int { return n.countLogAfter(0, match) }

// mark returns the number of log lines so far, for countLogAfter.
func (n *node) mark() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.records)
}

// countLogAfter counts the records after mark matching match.
func (n *node) countLogAfter(mark int, match func(map[string]any) bool) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
	for _, r := range n.records[mark:] {
		if match(r) {
			k++
		}
	}
	return k
}

// logged reports whether a record's msg contains msg.
func (n *node) logged(msg string) bool { return n.loggedAfter(0, msg) }

// loggedAfter reports whether a record after mark has a msg containing msg.
func (n *node) loggedAfter(mark int, msg string) bool {
	return n.countLogAfter(mark, func(r map[string]any) bool {
		s, _ := r["msg"].(string)
		return strings.Contains(s, msg)
	}) > 0
}

// waitLog waits for a record matching match and returns it; it fails t
// when the process exits first.
func (n *node) waitLog(timeout time.Duration, what string, match func(map[string]any) bool) map[string]any {
	n.t.Helper()
	var rec map[string]any
	waitFor(n.t, timeout, n.name+" to log "+what, func() bool {
		if rec = n.findLog(match); rec != nil {
			return true
		}
		if n.exited() {
			n.t.Fatalf("%s exited (%v) before logging %s", n.name, n.err(), what)
		}
		return false
	})
	return rec
}

// logText counts the output lines containing substr (for the rig's text
// logs, whose records are not parsed).
func (n *node) logText(substr string) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	k := 0
	for _, l := range n.lines {
		if strings.Contains(l, substr) {
			k++
		}
	}
	return k
}

// waitText waits until the output holds k lines containing substr.
func (n *node) waitText(timeout time.Duration, substr string, k int) {
	n.t.Helper()
	waitUntil(n.t, timeout, fmt.Sprintf("%s to log %q %d times", n.name, substr, k), func(context.Context) (bool, error) {
		return n.logText(substr) >= k, nil
	}, n.brokenOrHalted)
}

// logString is a record's attribute as text ("" when absent).
func logString(r map[string]any, key string) string {
	switch v := r[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		return fmt.Sprint(v)
	}
}

// ---- its HTTP listener

// getTimeout bounds a GET of the node's listener: short, because a
// frozen (SIGSTOP) node must not hold up the tests that poll it.
const getTimeout = 2 * time.Second

var nodeHTTP = &http.Client{Timeout: getTimeout}

// get returns the status and body of a path on the node's listener,
// failing t when it does not answer (retrying for a while: a scrape of a
// loaded process can take longer than one try allows).
func (n *node) get(path string) (int, string) {
	n.t.Helper()
	var code int
	var body string
	var err error
	for try := 0; try < 5; try++ {
		if code, body, err = n.tryGet(path); err == nil {
			break
		}
	}
	if err != nil {
		n.t.Fatalf("GET %s on %s: %v", path, n.name, err)
	}
	return code, body
}

// tryGet is get that reports a failure to answer.
func (n *node) tryGet(path string) (int, string, error) {
	resp, err := nodeHTTP.Get("http://" + n.metricsAddr() + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// scrape is one /metrics answer, parsed.
type scrape map[string]*dto.MetricFamily

func (n *node) scrape() scrape {
	n.t.Helper()
	code, body := n.get("/metrics")
	if code != http.StatusOK {
		n.t.Fatalf("/metrics on %s: %d", n.name, code)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		n.t.Fatalf("parse /metrics of %s: %v", n.name, err)
	}
	return fams
}

// value returns the value of the series of a gauge or counter (the sample
// count of a histogram) whose labels include labels; ok is false when
// there is none.
func (s scrape) value(name string, labels map[string]string) (float64, bool) {
series:
	for _, m := range s[name].GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if got[k] != v {
				continue series
			}
		}
		switch {
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

// metric scrapes the node and returns the value of the series of name whose
// labels include labels; -1 when there is none.
func (n *node) metric(name string, labels map[string]string) float64 {
	n.t.Helper()
	v, ok := n.scrape().value(name, labels)
	if !ok {
		return -1
	}
	return v
}

// projLabels are the labels of a projection's version 1 series, plus
// name, value pairs.
func projLabels(projection string, more ...string) map[string]string {
	m := map[string]string{"projection": projection, "version": "1"}
	for i := 0; i+1 < len(more); i += 2 {
		m[more[i]] = more[i+1]
	}
	return m
}
