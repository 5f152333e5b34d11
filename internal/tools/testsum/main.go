// Command testsum reads `go test -json` on stdin and prints what a person
// wants from a long run: go test's own per-package lines as they come, the
// whole output of every failed test (and of a failed package: a panic, a
// timeout, a TestMain error), every skipped test with its reason, and a last
// line of counts:
//
//	go test -json ./... | go run ./internal/tools/testsum
//	…
//	412 passed, 0 failed, 9 skipped
//
// The counts are over every test and subtest (a subtest counts on its own,
// and so does its parent). A test that started and never ended (the binary
// panicked or timed out) counts as failed. testsum exits 1 when a test or a
// package failed, 0 otherwise, so it can end a pipeline with pipefail.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

func main() {
	s := newSummary(os.Stdout)
	if err := s.read(os.Stdin); err != nil {
		fmt.Fprintf(os.Stderr, "testsum: %v\n", err)
		os.Exit(2)
	}
	if !s.finish() {
		os.Exit(1)
	}
}

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
	// ImportPath is set on build-output and build-fail events.
	ImportPath string
}

// key names a test of a package; Test is "" for the package itself.
type key struct{ pkg, test string }

type skip struct {
	key
	reason string
}

// summary accumulates the run. Output is buffered per test and printed
// only when the test fails, as go test does without -v.
type summary struct {
	w       io.Writer
	out     map[key][]string
	running map[key]bool
	order   []key // tests in the order they started, for the unfinished
	skips   []skip

	passed, failed int
	failedPkgs     []string
}

func newSummary(w io.Writer) *summary {
	return &summary{w: w, out: map[key][]string{}, running: map[key]bool{}}
}

func (s *summary) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintln(s.w, string(line)) // not test2json's: go's own message
			continue
		}
		s.add(e)
	}
	return sc.Err()
}

func (s *summary) add(e event) {
	k := key{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.w, e.Output)
	case "build-fail":
		s.failedPkgs = append(s.failedPkgs, e.ImportPath)
	case "run":
		s.running[k] = true
		s.order = append(s.order, k)
	case "output":
		if e.Test == "" && isPackageLine(e.Output) {
			fmt.Fprint(s.w, e.Output)
			return
		}
		s.out[k] = append(s.out[k], e.Output)
	case "pass", "fail", "skip":
		s.end(k, e.Action)
	}
}

// isPackageLine reports whether a package-level line is one of go test's
// one-line results ("ok", "FAIL", "?"), printed as it comes.
func isPackageLine(line string) bool {
	for _, p := range []string{"ok  \t", "FAIL\t", "?   \t"} {
		if strings.HasPrefix(line, p) {
			return true
		}
	}
	return false
}

func (s *summary) end(k key, action string) {
	delete(s.running, k)
	out := s.out[k]
	delete(s.out, k)
	if k.test == "" {
		if action == "fail" {
			s.failedPkgs = append(s.failedPkgs, k.pkg)
			s.print(out) // TestMain's messages, a panic, a timeout
		}
		return
	}
	switch action {
	case "pass":
		s.passed++
	case "fail":
		s.failed++
		s.print(out)
	case "skip":
		s.skips = append(s.skips, skip{k, skipReason(out)})
	}
}

// print writes a failed test's or package's output, without the lines
// that only say a parallel test paused or continued.
func (s *summary) print(lines []string) {
	for _, l := range lines {
		if strings.HasPrefix(l, "=== PAUSE") || strings.HasPrefix(l, "=== CONT") || strings.HasPrefix(l, "=== NAME") {
			continue
		}
		fmt.Fprint(s.w, l)
	}
}

// skipReason is what a skipped test logged, without go test's own lines:
// the message of t.Skip and anything logged before it.
func skipReason(lines []string) string {
	var parts []string
	for _, l := range lines {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- SKIP") {
			continue
		}
		parts = append(parts, t)
	}
	if len(parts) == 0 {
		return "(no reason given)"
	}
	return strings.Join(parts, " / ")
}

// finish prints the unfinished tests, the skips and the summary line, and
// reports whether the run passed.
func (s *summary) finish() bool {
	for _, k := range s.order {
		if !s.running[k] || k.test == "" {
			continue
		}
		s.failed++
		fmt.Fprintf(s.w, "--- UNFINISHED: %s (%s): the test binary ended before the test did\n", k.test, k.pkg)
		s.print(s.out[k])
	}
	if len(s.skips) > 0 {
		fmt.Fprintf(s.w, "\nskipped tests (%d):\n", len(s.skips))
		slices.SortStableFunc(s.skips, func(a, b skip) int {
			return strings.Compare(a.pkg+" "+a.test, b.pkg+" "+b.test)
		})
		for _, sk := range s.skips {
			fmt.Fprintf(s.w, "  %s %s: %s\n", sk.pkg, sk.test, sk.reason)
		}
	}
	slices.Sort(s.failedPkgs)
	s.failedPkgs = slices.Compact(s.failedPkgs)
	if len(s.failedPkgs) > 0 {
		fmt.Fprintf(s.w, "\nfailed packages: %s\n", strings.Join(s.failedPkgs, " "))
	}
	fmt.Fprintf(s.w, "\n%d passed, %d failed, %d skipped\n", s.passed, s.failed, len(s.skips))
	return s.failed == 0 && len(s.failedPkgs) == 0
}
