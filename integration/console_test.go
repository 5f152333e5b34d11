package integration

// The web console (package console) in a real browser: headless Chromium,
// driven with chromedp, against `pgscribe run` on a real PostgreSQL. The
// overview must show a live projection's watermark moving without a
// reload, a halted one's reason and a dead letter's event JSON whose
// markup stays text; an action must be refused without the token and work
// with it. Screenshots at desktop and phone width go to a temporary
// directory, or to $PGSCRIBE_CONSOLE_SCREENSHOTS (docs/img to refresh the
// README's).

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// consoleInjection is event data that tries to run script in the console.
const consoleInjection = `<script>alert(1)</script><img src=x onerror="alert(2)">`

// chromium returns the browser's path. Under CI=true a missing browser
// fails the test (.ci/run installs it); elsewhere it skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (apt-get install chromium): the console's browser test cannot run")
	}
	t.Skip("chromium is not installed (apt-get install chromium)")
	return ""
}

func TestConsoleBrowser(t *testing.T) {
	browser := chromium(t)
	e := newCLIEnv(t)
	const token = "console-test-token"
	halting := projectionKeysTOML("halting", 1, "halt", []string{`group = "halting"`},
		rule{name: "reject", on: "Bogus", op: "fail", message: "'cannot take ' + data.note"})
	audit := projectionKeysTOML("audit", 1, "", []string{`group = "audit"`},
		rule{name: "audit_bogus", on: "Bogus", op: "fail", message: "'audit rejects ' + data.note"})
	cfgText := newConfig(e.dsn, e.prefix).with("engine", map[string]string{
		"node": `"console-node"`, "standby_poll": `"200ms"`, "lag_interval": `"200ms"`, "status_interval": `"1s"`,
	}).set("metrics", "console_token", fmt.Sprintf("%q", token)).add(cliBalances, audit, halting)
	cfg := cfgText.write(t, filepath.Join(e.dir, "console.toml"))
	e.setup(cfg)
	e.openAccounts(20)
	e.moves(20, 1, 4)
	e.exec(`INSERT INTO events (stream_id, stream_position, type, data) VALUES ('junk-1', 1, 'Bogus', jsonb_build_object('note', $1::text))`, consoleInjection)
	p := e.start(cfg)
	base := "http://" + p.metricsAddr()
	e.waitAccounted(p, "balances", 1)
	e.waitAccounted(p, "audit", 1)

	// Chromium as root (CI) needs --no-sandbox.
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("disable-dev-shm-usage", true))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancelCtx := chromedp.NewContext(actx)
	defer cancelCtx()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	var dialogs atomic.Int32 // an alert() would mean injected script ran
	if err := chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
			go func() {
				_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
			}()
		}
	}); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v\n%s", what, err, p.tail(30))
		}
	}
	get := func(what string, a chromedp.Action[string]) string {
		t.Helper()
		v, err := chromedp.Run(ctx, a)
		if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, p.tail(30))
		}
		return v
	}
	// try reads without failing: the live swap may replace the node
	// between the query and the read.
	try := func(a chromedp.Action[string]) string {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		v, _ := chromedp.Run(qctx, a)
		return v
	}
	state := func(id string) string {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		v, _ := chromedp.Run(qctx, chromedp.AttributeValue(chromedp.CSS("#"+id), "data-state"))
		return v.Value
	}

	// The overview: the halted version's reason, with its payload as text.
	do("open the overview", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS(`#v-balances-1`)))
	waitFor(t, waitLong, "the overview to show halting v1 halted", func() bool { return state("v-halting-1") == "halted" })
	reason := try(chromedp.Text(chromedp.CSS(`#v-halting-1 .reason`)))
	if !strings.Contains(reason, "halted") || !strings.Contains(reason, "cannot take "+consoleInjection) {
		t.Errorf("halted reason on the overview = %q, want the halt and its message (payload as text)", reason)
	}

	// Live: the watermark moves as events arrive, with no reload.
	get("mark the page", chromedp.Evaluate[string](`window.consoleLoaded = "yes"`))
	before := get("read the watermark", chromedp.Text(chromedp.CSS(`#v-balances-1 .watermark`)))
	e.moves(20, 5, 8)
	var after string
	waitFor(t, waitLong, "the overview's watermark of balances v1 to move without a reload", func() bool {
		after = try(chromedp.Text(chromedp.CSS(`#v-balances-1 .watermark`)))
		return after != "" && after != before
	})
	if loaded := get("check for a reload", chromedp.Evaluate[string](`window.consoleLoaded || "reloaded"`)); loaded != "yes" {
		t.Errorf("the page reloaded (window.consoleLoaded = %q): live updates must swap, not reload", loaded)
	}
	t.Logf("watermark of balances v1 moved live: %q → %q", before, after)
	shots := screenshotDir(t)
	shot := func(name string, width, height int64) {
		t.Helper()
		do("viewport for "+name, chromedp.EmulateViewport(width, height), chromedp.Sleep(500*time.Millisecond))
		buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	shot("console-overview-desktop.png", 1280, 900)
	shot("console-overview-phone.png", 375, 800)
	dark := func(on bool) {
		t.Helper()
		f := []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "light"}}
		if on {
			f[0].Value = "dark"
		}
		if _, err := chromedp.Call(ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: f}); err != nil {
			t.Fatalf("emulate prefers-color-scheme: %v", err)
		}
	}
	dark(true)
	shot("console-overview-dark.png", 1280, 900)
	dark(false)

	// A dead letter's event JSON on the version page, the payload as text.
	do("open audit v1", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(base+"/v/audit/1"),
		chromedp.WaitVisible(chromedp.CSS(`.dl-item`)), chromedp.Click(chromedp.CSS(`.dl-item summary`)))
	data := get("read the event JSON", chromedp.Text(chromedp.CSS(`.dl-item .dl-data`)))
	message := get("read the error", chromedp.Text(chromedp.CSS(`.dl-item .dl-error`)))
	images := get("count images", chromedp.Evaluate[string](`String(document.querySelectorAll('img').length)`))
	if !strings.Contains(data, `"note": "<script>alert(1)</script>`) {
		t.Errorf("dead letter JSON = %q, want the event's data with the payload as text", data)
	}
	if message != "audit rejects "+consoleInjection {
		t.Errorf("dead letter error = %q", message)
	}
	if images != "0" {
		t.Errorf("%s img elements on the page: the payload became markup", images)
	}
	shot("console-version-desktop.png", 1280, 900)
	shot("console-version-phone.png", 375, 800)

	// An action without the token is refused and changes nothing.
	resp, err := http.PostForm(base+"/v/balances/1/pause", url.Values{"reason": {"no token"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("pause without the token = %d, want 403", resp.StatusCode)
	}
	if n := e.queryInt(`SELECT count(*) FROM pgscribe.controls WHERE projection = 'balances' AND paused_at IS NOT NULL`); n != 0 {
		t.Errorf("pause without the token paused balances v1 (%d control rows)", n)
	}

	// With it, through the confirmation form: retry the dead letter (the
	// dry run shows first), then pause.
	id := e.queryInt(`SELECT min(id) FROM pgscribe.dead_letters WHERE projection = 'audit'`)
	do("open the retry confirmation", chromedp.Navigate(fmt.Sprintf("%s/v/audit/1/retry?id=%d", base, id)),
		chromedp.WaitVisible(chromedp.CSS(`form.confirm`)))
	preview := get("read the dry run", chromedp.Text(chromedp.CSS(`pre.preview`)))
	do("retry through the form", chromedp.SendKeys(chromedp.CSS(`input[name=token]`), token),
		chromedp.Submit(chromedp.CSS(`form.confirm`)), chromedp.WaitVisible(chromedp.CSS(`#action-ok`)))
	outcome := get("read the outcome", chromedp.Text(chromedp.CSS(`#action-output`)))
	if !strings.Contains(preview, fmt.Sprintf("dead letter %d", id)) {
		t.Errorf("retry dry run = %q, want it to name dead letter %d", preview, id)
	}
	if !strings.Contains(outcome, "retried on node console-node") {
		t.Errorf("retry outcome = %q", outcome)
	}
	do("pause through the form", chromedp.Navigate(base+"/v/balances/1/pause"),
		chromedp.WaitVisible(chromedp.CSS(`form.confirm`)),
		chromedp.SendKeys(chromedp.CSS(`input[name=reason]`), "browser test"),
		chromedp.SendKeys(chromedp.CSS(`input[name=token]`), token),
		chromedp.Submit(chromedp.CSS(`form.confirm`)),
		chromedp.WaitVisible(chromedp.CSS(`#action-ok`)))
	by := scalar[string](t, e.conn, `SELECT paused_by FROM pgscribe.controls WHERE projection = 'balances' AND version = 1`)
	if !strings.Contains(by, "pgscribe console: token holder at 127.0.0.1") {
		t.Errorf("paused_by = %q, want the console and who", by)
	}
	do("open the overview", chromedp.Navigate(base+"/"))
	waitFor(t, waitLong, "the overview to show balances v1 paused", func() bool { return state("v-balances-1") == "paused" })
	if p.findLog(func(r map[string]any) bool {
		return r["msg"] == "console action" && r["action"] == "pause" && r["who"] == "token holder at 127.0.0.1"
	}) == nil {
		t.Errorf("no log line of the pause with who did it:\n%s", p.tail(20))
	}
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d dialogs opened: injected script ran", n)
	}
	p.stop()
}

// screenshotDir is where the test writes its screenshots:
// $PGSCRIBE_CONSOLE_SCREENSHOTS when set (make console-screenshots sets
// docs/img), else a temporary directory.
func screenshotDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("PGSCRIBE_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return t.TempDir()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestConsoleStandalone: `pgscribe console` serves the console on its own
// listener with no engine running; the versions show as stopped, with
// their dead letters, and Ctrl-C (SIGINT) ends it with exit 0.
func TestConsoleStandalone(t *testing.T) {
	e, cfg := newCLIAccounts(t, "standalone", "", cliBalances, 5, 15)
	p := e.start(cfg)
	e.waitAccounted(p, "balances", 1)
	p.stop()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := cliCommand(ctx, e.bin, "console", "-config", cfg, "-listen", "127.0.0.1:0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("pgscribe console printed no address: %v\n%s", err, stderr.String())
	}
	base, ok := strings.CutPrefix(strings.Fields(line + " x x x")[3], "http://")
	if !ok {
		t.Fatalf("pgscribe console: first line %q, want its URL", line)
	}
	base = "http://" + strings.TrimSuffix(base, "/")
	body := httpGet(t, base+"/")
	for _, want := range []string{`id="v-balances-1" data-state="stopped"`, `class="deadletters warn">5<`} {
		if !strings.Contains(body, want) {
			t.Errorf("the standalone overview lacks %q:\n%s", want, body)
		}
	}
	if v := httpGet(t, base+"/v/balances/1"); !strings.Contains(v, "non-positive withdrawal: 0") {
		t.Errorf("the version page lacks the dead letters' error:\n%s", v)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("pgscribe console after SIGINT: %v\n%s", err, stderr.String())
	}
}

// httpGet returns the body of a 200 answer to GET url.
func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v\n%s", url, resp.StatusCode, err, b)
	}
	return string(b)
}
