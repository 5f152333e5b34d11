package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/admin"
)

// scratchLockClass is admin's advisory lock class of scratch schemas
// ("pgsx"), held by the session of the process that owns one.
const scratchLockClass = 0x70677378

// progressLine is verify's periodic rebuild progress on stderr.
var progressLine = regexp.MustCompile(`verify: rebuilding: \d+ of (\d+) events \(\d+\.\d%\), \d+ events/s, eta \S+`)

// startVerify starts `pgscribe verify` reporting progress every 50ms and
// returns once it printed a progress line (the rebuild is under way), with
// the process and the rest of its stderr.
func (e *cliEnv) startVerify(cfg string) (*os.Process, <-chan error, *strings.Builder) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	e.t.Cleanup(cancel)
	cmd := cliCommand(ctx, e.bin, "verify", "-config", cfg, "-projection", "balances", "-version", "1", "-progress", "50ms")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	var seen strings.Builder
	lines := bufio.NewScanner(stderr)
	found := false
	for !found && lines.Scan() {
		seen.WriteString(lines.Text() + "\n")
		found = progressLine.MatchString(lines.Text())
	}
	if !found {
		_ = cmd.Wait()
		e.t.Fatalf("verify printed no rebuild progress line:\n%s", seen.String())
	}
	done := make(chan error, 1)
	go func() {
		_, _ = io.Copy(io.Discard, stderr)
		done <- cmd.Wait()
	}()
	return cmd.Process, done, &seen
}

// An interrupted verify leaves no scratch schema behind: Ctrl-C drops it
// on the way out; kill -9 cannot, and the next verify drops it (its owner's
// advisory lock went with the owner's session). A long verify reports its
// progress on stderr, and -json gives the result to scripts.
func TestCLIVerifyInterrupted(t *testing.T) {
	const accounts = 100
	e, cfg := newCLIAccounts(t, "verify", "parallelism = 2\nbatch_size = 20", cliBalances, accounts, 300)
	p := e.start(cfg)
	e.waitAccounted(p, "balances", 1)
	p.stop()
	events := e.queryInt(`SELECT count(*) FROM events`)
	schemas := func() int64 {
		return e.queryInt(`SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgscribe\_verify\_%'`)
	}

	// Ctrl-C: verify drops its schema itself.
	proc, done, seen := e.startVerify(cfg)
	if m := progressLine.FindStringSubmatch(seen.String()); m == nil || m[1] != fmt.Sprint(events) {
		t.Errorf("want the progress of %d events in %q", events, seen)
	}
	if err := proc.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err == nil {
		t.Error("verify interrupted by SIGINT exited 0")
	}
	if n := schemas(); n != 0 {
		t.Errorf("after Ctrl-C: %d scratch schemas left behind", n)
	}

	// kill -9: the schema stays until the next verify.
	proc, done, _ = e.startVerify(cfg)
	if err := proc.Kill(); err != nil {
		t.Fatal(err)
	}
	<-done
	if n := schemas(); n != 1 {
		t.Fatalf("after kill -9: %d scratch schemas, want the killed verify's", n)
	}
	// The killed verify's backends end when they notice their client is
	// gone (client_connection_check_interval): then its lock is free.
	waitFor(t, 30*time.Second, "the killed verify's lock released", func() bool {
		return e.queryInt(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::bigint::oid`, scratchLockClass) == 0
	})
	r := e.mustRun(0, "verify", "-config", cfg, "-projection", "balances", "-version", "1", "-json")
	if n := schemas(); n != 0 {
		t.Errorf("the next verify left %d scratch schemas (it should drop the killed one's and its own)", n)
	}

	var res admin.VerifyResult
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("-json: %v\n%s", err, r)
	}
	if res.Projection != "balances" || res.Version != 1 || res.Events != events || res.Streams != accounts || res.Drift != 0 ||
		len(res.Tables) != 1 || res.Tables[0].Table != "balances" || strings.Join(res.Tables[0].Key, ",") != "account_id" || res.Seconds <= 0 {
		t.Errorf("-json: unexpected result %+v", res)
	}
	// The JSON keys scripts read, spelled out.
	var raw map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"projection", "version", "events", "streams", "drift", "shared_legitimate", "undecidable", "tables", "accounting", "seconds"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("-json: no key %q in %s", k, r.stdout)
		}
	}

	// Drift in -json: the row, and exit 1.
	e.exec(`UPDATE balances SET balance = balance + 1 WHERE account_id = 'acct-5'`)
	r = e.mustRun(1, "verify", "-config", cfg, "-projection", "balances", "-version", "1", "-json")
	res = admin.VerifyResult{}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("-json: %v\n%s", err, r)
	}
	if res.Drift != 1 || len(res.Tables[0].Rows) != 1 || res.Tables[0].Rows[0].Kind != "different" || !res.Tables[0].Rows[0].Drift ||
		res.Tables[0].Rows[0].Live["account_id"] != "acct-5" {
		t.Errorf("-json with one drifted row: %+v", res)
	}
}
