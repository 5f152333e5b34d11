// Command campaign runs pgscribe's seeded fault campaign (issue 30): a
// random configuration, history and schedule of faults and operator
// actions drawn from one seed, against real PostgreSQL, checked by one
// oracle. The campaign itself is a test of package integration
// (TestCampaign, integration/campaign_test.go), because it is built on
// that package's harness; this command runs it with `go test` and the
// PGSCRIBE_CAMPAIGN_* variables, and minimises a failing schedule.
//
//	go run ./internal/tools/campaign -seed 10 -duration 2m
//	go run ./internal/tools/campaign -seed 10 -duration 2m -minimise
//	go run ./internal/tools/campaign -seed 10 -dry
//
// Without -seed it draws one from the clock and prints it. The exit code
// is 0 when the campaign passed, 1 when it found a violation (or could
// not run), 2 on a usage error. docs/testing.md#the-fault-campaign-make-campaign
// says what a replay reproduces.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("campaign", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Uint64("seed", 0, "the seed (0: one from the clock, printed)")
	duration := fs.Duration("duration", time.Minute, "how long the writers append and the schedule runs")
	skip := fs.String("skip", "", "steps of the schedule not to run, by number: 2,5")
	minimise := fs.Bool("minimise", false, "when the campaign fails, drop its steps one by one while it still fails, and print the smallest failing schedule")
	dry := fs.Bool("dry", false, "print the plan (configuration, history, schedule) and run nothing")
	goCmd := fs.String("go", "go", "the go command")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "campaign: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano()%1_000_000_000) + 1
	}
	skipped, err := parseSkip(*skip)
	if err != nil {
		fmt.Fprintf(stderr, "campaign: -skip: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "campaign: seed %d, duration %s\n", *seed, *duration)
	c := runner{goCmd: *goCmd, seed: *seed, duration: *duration, dry: *dry, out: stdout}
	failed, steps, err := c.once(skipped, true)
	if err != nil {
		fmt.Fprintf(stderr, "campaign: %v\n", err)
		return 1
	}
	if !failed {
		if !*dry {
			fmt.Fprintf(stdout, "campaign: seed %d passed\n", *seed)
		}
		return 0
	}
	fmt.Fprintf(stdout, "campaign: seed %d FAILED; replay: %smake campaign SEED=%d DURATION=%s SKIP=%s\n", *seed, parkEnv(), *seed, *duration, join(skipped))
	if !*minimise {
		return 1
	}
	// Drop the steps one by one; keep a step dropped while the campaign
	// still fails without it. PostgreSQL's timing is not the same from
	// run to run, so a flaky failure can make the result larger than need
	// be; it is never a schedule that passed.
	for i := range steps {
		if slices.Contains(skipped, i) {
			continue
		}
		try := append(slices.Clone(skipped), i)
		fmt.Fprintf(stdout, "campaign: minimise: without step %d …\n", i)
		f, _, err := c.once(try, false)
		if err != nil {
			fmt.Fprintf(stderr, "campaign: %v\n", err)
			return 1
		}
		if f {
			skipped = try
			fmt.Fprintf(stdout, "campaign: minimise: still fails without step %d\n", i)
		} else {
			fmt.Fprintf(stdout, "campaign: minimise: step %d is needed\n", i)
		}
	}
	fmt.Fprintf(stdout, "campaign: minimal failing schedule: %smake campaign SEED=%d DURATION=%s SKIP=%s\n", parkEnv(), *seed, *duration, join(skipped))
	return 1
}

// runner runs TestCampaign with go test.
type runner struct {
	goCmd    string
	seed     uint64
	duration time.Duration
	dry      bool
	out      io.Writer
}

var stepsLine = regexp.MustCompile(`campaign: (\d+) steps`)

// once runs the campaign skipping steps skip; it reports whether it
// failed and how many steps the schedule has. show copies go test's
// output to r.out (else only a failure's output is shown).
func (r runner) once(skip []int, show bool) (failed bool, steps int, err error) {
	args := []string{"test", "-race", "-count=1", "-v", "-run", "^TestCampaign$",
		"-timeout", (r.duration + 20*time.Minute).String(), "./integration/"}
	cmd := exec.Command(r.goCmd, args...)
	cmd.Env = append(os.Environ(),
		"PGSCRIBE_CAMPAIGN_SEED="+strconv.FormatUint(r.seed, 10),
		"PGSCRIBE_CAMPAIGN_DURATION="+r.duration.String(),
		"PGSCRIBE_CAMPAIGN_SKIP="+join(skip))
	if r.dry {
		cmd.Env = append(cmd.Env, "PGSCRIBE_CAMPAIGN_DRY=1")
	}
	var buf bytes.Buffer
	if show {
		cmd.Stdout = io.MultiWriter(&buf, r.out)
	} else {
		cmd.Stdout = &buf
	}
	cmd.Stderr = cmd.Stdout
	runErr := cmd.Run()
	if m := stepsLine.FindSubmatch(buf.Bytes()); m != nil {
		steps, _ = strconv.Atoi(string(m[1]))
	}
	switch {
	case runErr == nil:
		return false, steps, nil
	case bytes.Contains(buf.Bytes(), []byte("--- FAIL: TestCampaign")):
		if !show {
			if i := bytes.Index(buf.Bytes(), []byte("VIOLATION")); i >= 0 {
				line, _, _ := bytes.Cut(buf.Bytes()[i:], []byte("\n"))
				fmt.Fprintf(r.out, "campaign:   %s\n", line)
			}
		}
		return true, steps, nil
	case show:
		return false, steps, fmt.Errorf("go test did not run the campaign: %v", runErr)
	default:
		return false, steps, fmt.Errorf("go test did not run the campaign (%v):\n%s", runErr, buf.String())
	}
}

func parseSkip(s string) ([]int, error) {
	var out []int
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		i, err := strconv.Atoi(f)
		if err != nil || i < 0 {
			return nil, fmt.Errorf("%q is not a step number", f)
		}
		out = append(out, i)
	}
	return out, nil
}

func join(is []int) string {
	s := make([]string, len(is))
	for k, i := range is {
		s[k] = strconv.Itoa(i)
	}
	return strings.Join(s, ",")
}

// parkEnv is what a replay line needs before make: with
// PGSCRIBE_CAMPAIGN_PARK=0, which the test inherits from this process's
// environment, the campaign runs a drawn on_error = "park" as
// "dead_letter".
func parkEnv() string {
	if os.Getenv("PGSCRIBE_CAMPAIGN_PARK") == "0" {
		return "PGSCRIBE_CAMPAIGN_PARK=0 "
	}
	return ""
}
