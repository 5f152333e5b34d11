package console

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/admin"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/engine"
)

// injection is event data that tries to run script in the console.
const injection = `<script>alert(1)</script><img src=x onerror="alert(2)">"'&`

func newTestServer(t *testing.T, m config.Metrics) *Server {
	t.Helper()
	cfg := config.Default()
	cfg.Database.URL = "postgres://nobody@127.0.0.1:1/none"
	m.Listen = "127.0.0.1:0"
	cfg.Metrics = m
	s, err := New(cfg, nil, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.target.Close)
	return s
}

// TestVersionPageEscapesEventData renders a dead letter whose event data,
// error message, stream id and type carry markup: every one must come out
// as text.
func TestVersionPageEscapesEventData(t *testing.T) {
	s := newTestServer(t, config.Metrics{Console: true})
	data := []byte(`{"note": "` + strings.ReplaceAll(injection, `"`, `\"`) + `"}`)
	lag := 1.5
	d := versionData{page: page{Title: injection}, Projection: injection, Version: 1, Found: true,
		Card: card{ProjectionStatus: admin.ProjectionStatus{Projection: injection, Version: 1, State: engine.StateHalted,
			HaltReason: injection, Node: injection, LagSeconds: &lag, Notes: []string{injection}}, Reason: injection},
		Filter: dlFilter{Stream: injection, Kind: injection},
		Stats:  deadletter.Stats{Total: 1, ByKind: []deadletter.KindCount{{Kind: injection, Count: 1}}},
		DeadLetters: []deadletter.Row{{ID: 7, Projection: injection, Version: 1, StreamID: injection, EventType: injection,
			ErrorKind: injection, ErrorMessage: injection, EventData: data, EventMetadata: []byte(`"` + strings.ReplaceAll(injection, `"`, `\"`) + `"`),
			DeadLetteredAt: time.Now()}},
		Parked: []deadletter.ParkedStream{{StreamID: injection, Held: 2}},
	}
	var buf bytes.Buffer
	if err := s.pages["version"].Execute(&buf, d); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, bad := range []string{"<script>alert", "<img src=x", `onerror="alert`} {
		if strings.Contains(out, bad) {
			t.Errorf("the page contains %q unescaped", bad)
		}
	}
	if !strings.Contains(out, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the payload does not show as text:\n%s", out)
	}
	if n := strings.Count(out, "<script"); n != 1 { // the console's own live.js only
		t.Errorf("%d script elements, want 1", n)
	}
}

func TestOverviewServesWithoutDatabase(t *testing.T) {
	s := newTestServer(t, config.Metrics{Console: true})
	s.sampler.mu.Lock()
	s.sampler.last = sample{At: time.Now(), Err: errors.New("connect target: refused")}
	s.sampler.mu.Unlock()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET / = %d", rec.Code)
	}
	body := rec.Body.String()
	if !strings.Contains(body, "connect target: refused") {
		t.Errorf("the overview does not say why it has no status:\n%s", body)
	}
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("Content-Security-Policy = %q", csp)
	}
	for _, path := range []string{"/static/console.css", "/static/live.js"} {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != http.StatusOK || rec.Body.Len() == 0 {
			t.Errorf("GET %s = %d, %d bytes", path, rec.Code, rec.Body.Len())
		}
	}
}

// TestOverviewSaysCountsAge: the page says when the counts were taken and
// how much older they are than the rest of the reading.
func TestOverviewSaysCountsAge(t *testing.T) {
	s := newTestServer(t, config.Metrics{Console: true})
	at := time.Date(2026, 12, 3, 0, 10, 0, 0, time.UTC)
	s.sampler.mu.Lock()
	s.sampler.last = sample{At: time.Now(), Report: &admin.StatusReport{CheckedAt: at, Events: 1234},
		CountsAt: at.Add(-24 * time.Second), CountsTook: 50 * time.Millisecond}
	s.sampler.mu.Unlock()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	body := rec.Body.String()
	for _, want := range []string{"counts as of 2026-12-03 00:09:36Z (24s before)", "1234 events", "counted every 30s"} {
		if !strings.Contains(body, want) {
			t.Errorf("the overview lacks %q:\n%s", want, body)
		}
	}
}

func TestAuthorize(t *testing.T) {
	const token = "s3cret-token"
	tests := []struct {
		name    string
		metrics config.Metrics
		form    url.Values
		header  map[string]string
		wantWho string
		wantErr error
	}{
		{name: "actions off", metrics: config.Metrics{}, form: url.Values{"token": {token}}, wantErr: errActionsOff},
		{name: "no token", metrics: config.Metrics{ConsoleToken: token}, wantErr: errNoToken},
		{name: "wrong token", metrics: config.Metrics{ConsoleToken: token}, form: url.Values{"token": {"s3cret-tokeN"}}, wantErr: errNoToken},
		{name: "token prefix", metrics: config.Metrics{ConsoleToken: token}, form: url.Values{"token": {"s3cret"}}, wantErr: errNoToken},
		{name: "token in form", metrics: config.Metrics{ConsoleToken: token}, form: url.Values{"token": {token}}, wantWho: "token holder at 192.0.2.1"},
		{name: "bearer token", metrics: config.Metrics{ConsoleToken: token}, header: map[string]string{"Authorization": "Bearer " + token}, wantWho: "token holder at 192.0.2.1"},
		{name: "proxy header without form secret", metrics: config.Metrics{ConsoleAuthHeader: "X-Forwarded-User"},
			header: map[string]string{"X-Forwarded-User": "ada"}, wantErr: errBadCSRF},
		{name: "proxy header with form secret", metrics: config.Metrics{ConsoleAuthHeader: "X-Forwarded-User"},
			header: map[string]string{"X-Forwarded-User": "ada"}, form: url.Values{"csrf": {"CSRF"}}, wantWho: "ada"},
		{name: "header mode without the header", metrics: config.Metrics{ConsoleAuthHeader: "X-Forwarded-User"},
			form: url.Values{"csrf": {"CSRF"}}, wantErr: errNoToken},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestServer(t, tt.metrics)
			form := tt.form.Encode()
			form = strings.ReplaceAll(form, "CSRF", s.csrf)
			r := httptest.NewRequest("POST", "/v/p/1/pause", strings.NewReader(form))
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, v := range tt.header {
				r.Header.Set(k, v)
			}
			who, err := s.authorize(r)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("authorize: err = %v, want %v", err, tt.wantErr)
			}
			if who != tt.wantWho {
				t.Errorf("who = %q, want %q", who, tt.wantWho)
			}
		})
	}
}

// TestActionRefusedWithoutToken: a POST without the token is a 403 that
// says why, and runs nothing (the database it would need is unreachable).
func TestActionRefusedWithoutToken(t *testing.T) {
	for _, m := range []config.Metrics{{}, {ConsoleToken: "t"}} {
		s := newTestServer(t, m)
		rec := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/v/balances/1/pause", strings.NewReader("reason=x"))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		s.ServeHTTP(rec, r)
		if rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), "refused") && !strings.Contains(rec.Body.String(), "actions are off") {
			t.Errorf("token %q: POST = %d\n%s", m.ConsoleToken, rec.Code, rec.Body)
		}
	}
}

func TestHistoryRing(t *testing.T) {
	h := &history{pts: make([]point, 0, 3)}
	for i := range 5 {
		h.add(point{Backlog: int64(i)})
	}
	got := h.ordered()
	if len(got) != 3 || got[0].Backlog != 2 || got[2].Backlog != 4 {
		t.Errorf("ordered = %+v, want backlogs 2, 3, 4", got)
	}
}

func TestSparkline(t *testing.T) {
	if got := string(sparkline(nil, "x")); strings.Contains(got, "polyline") {
		t.Errorf("no values drew a line: %s", got)
	}
	got := string(sparkline([]float64{0, 5, 10}, `a"<b`))
	if !strings.Contains(got, `points="0.0,23.0 60.0,12.0 120.0,1.0 "`) {
		t.Errorf("sparkline = %s", got)
	}
	if strings.Contains(got, `a"<b`) {
		t.Errorf("label not escaped: %s", got)
	}
	// Between two counts the backlog and the accounted events are the
	// last count's: only the points that counted make the series.
	pts := []point{{At: time.Unix(0, 0), Accounted: 0, Counted: true}, {At: time.Unix(1, 0), Accounted: 0},
		{At: time.Unix(2, 0), Accounted: 10, Backlog: 3, Counted: true}, {At: time.Unix(3, 0), Accounted: 10, Backlog: 3}}
	if rates := rateValues(pts); len(rates) != 1 || rates[0] != 5 {
		t.Errorf("rateValues = %v, want [5]", rates)
	}
	if backlog := backlogValues(pts); len(backlog) != 2 || backlog[1] != 3 {
		t.Errorf("backlogValues = %v, want [0 3]", backlog)
	}
	if lags := lagValues(pts); len(lags) != 4 {
		t.Errorf("lagValues = %v, want one per sample", lags)
	}
}

// TestCountsDue: the counts are read at the first reading, after an
// action, and then every Options.Counts (later when counting took long).
func TestCountsDue(t *testing.T) {
	s := newTestServer(t, config.Metrics{Console: true})
	sm := s.sampler
	now := time.Now()
	if !sm.countsDue(now) {
		t.Error("no counts yet: not due")
	}
	sm.counts, sm.counted = &admin.StatusCounts{}, now
	if sm.countsDue(now.Add(2 * time.Second)) {
		t.Error("due 2s after the last counts (Counts is 30s)")
	}
	if !sm.countsDue(now.Add(30 * time.Second)) {
		t.Error("not due 30s after the last counts")
	}
	sm.last.CountsTook = 2 * time.Second
	if sm.countsDue(now.Add(30 * time.Second)) {
		t.Error("due 30s after counts that took 2s: they would keep the database busy 1/15 of the time")
	}
	sm.refresh()
	if !sm.countsDue(now.Add(time.Second)) {
		t.Error("not due after an action")
	}
}

// TestSamplerSleepsUnwatched: the sampler reads nothing before the first
// page view, one reading for the view, and stops again Sleep after it.
func TestSamplerSleepsUnwatched(t *testing.T) {
	s := newTestServer(t, config.Metrics{Console: true})
	s.opts.Interval, s.opts.Idle, s.opts.Sleep = 5*time.Millisecond, 5*time.Millisecond, 200*time.Millisecond
	s.sampler.opts = s.opts
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.sampler.run(ctx) }()
	defer func() { cancel(); <-done }()
	readings := func() int64 {
		s.sampler.mu.Lock()
		defer s.sampler.mu.Unlock()
		return s.sampler.readings
	}
	time.Sleep(100 * time.Millisecond)
	if n := readings(); n != 0 {
		t.Fatalf("%d readings before any view, want 0", n)
	}
	smp := s.sampler.current(ctx) // unreachable database: a reading with its error
	if smp.Err == nil || readings() < 1 {
		t.Fatalf("a view got %+v after %d readings, want a reading with an error", smp, readings())
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		before := readings()
		time.Sleep(300 * time.Millisecond)
		if readings() == before {
			break // asleep again
		}
		if time.Now().After(deadline) {
			t.Fatalf("still reading %v after the last view (Sleep is 200ms)", 10*time.Second)
		}
	}
}

func TestSelection(t *testing.T) {
	tests := []struct {
		name     string
		query    string
		wantErr  bool
		wantIDs  []int64
		wantKind string
		wantSays string
	}{
		{name: "everything", query: "", wantSays: "every dead letter of this version"},
		{name: "ids, repeated and comma-separated", query: "id=3&id=5,7", wantIDs: []int64{3, 5, 7}, wantSays: "the dead letters with id 3, 5, 7"},
		{name: "rule becomes its kind", query: "rule=open&stream=s1", wantKind: "rule:open", wantSays: "the dead letters with rule open, stream s1"},
		{name: "kind", query: "kind=commit%3A23505", wantKind: "commit:23505", wantSays: "the dead letters with kind commit:23505"},
		{name: "not an id", query: "id=x", wantErr: true},
		{name: "id zero", query: "id=0", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/v/p/1/retry?"+tt.query, nil)
			_ = r.ParseForm()
			sel, err := selectionOf(r)
			if (err != nil) != tt.wantErr {
				t.Fatalf("selectionOf: err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			f := sel.filter("p", 1)
			if f.Projection != "p" || f.Version != 1 || f.ErrorKind != tt.wantKind || fmt.Sprint(f.IDs) != fmt.Sprint(tt.wantIDs) {
				t.Errorf("filter = %+v, want kind %q, ids %v", f, tt.wantKind, tt.wantIDs)
			}
			if got := sel.Describe(); got != tt.wantSays {
				t.Errorf("Describe = %q, want %q", got, tt.wantSays)
			}
		})
	}
}

func TestFilterQuery(t *testing.T) {
	f := dlFilter{Kind: "rule:a&b", Stream: "s 1"}
	if got := string(f.Query()); got != "kind=rule%3Aa%26b&stream=s+1" {
		t.Errorf("Query = %q", got)
	}
}

func TestProgressBar(t *testing.T) {
	for _, tt := range []struct {
		percent float64
		want    string
	}{{-5, `width="0.00"`}, {42.5, `width="42.50"`}, {250, `width="100.00"`}} {
		if got := string(progressBar(tt.percent)); !strings.Contains(got, tt.want) {
			t.Errorf("progressBar(%v) = %s, want %s", tt.percent, got, tt.want)
		}
	}
}

func TestLoopback(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:9187": true, "localhost:9187": true, "[::1]:9187": true,
		":9187": false, "0.0.0.0:9187": false, "10.0.0.5:9187": false, "example.com:80": false, "nonsense": false,
	} {
		if got := Loopback(addr); got != want {
			t.Errorf("Loopback(%q) = %v, want %v", addr, got, want)
		}
	}
}
