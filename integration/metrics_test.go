package integration

// Metrics and health of a running pgscribe, scraped over HTTP: lag and
// backlog during a backfill, live load, a paused apply and idleness, on the
// active node and on a standby that reads them from PostgreSQL.

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgscribe/pgscribe/lag"
	"github.com/pgscribe/pgscribe/migrations"
)

const mtProjection = "mt_counts"

// mtConfig is a pgscribe configuration with short intervals, so that the
// test sees several lag measurements per second.
func mtConfig(t *testing.T, dsn, slotPrefix, node string) string {
	t.Helper()
	return newConfig(dsn, slotPrefix).with("engine", map[string]string{
		"node": fmt.Sprintf("%q", node), "parallelism": "2", "batch_timeout": `"5ms"`, "backfill_batch_size": "500",
		"standby_poll": `"200ms"`, "lag_interval": `"200ms"`, "status_interval": `"500ms"`,
	}).add(projectionTOML(mtProjection, 1, "",
		rule{name: "count", on: "Tick", op: "upsert", table: "mt_counts", key: `stream_id = "stream_id"`, inc: `n = "1"`},
	)).write(t, filepath.Join(t.TempDir(), node+".toml"))
}

// mtStart starts a node that gets a minute to stop.
func mtStart(t *testing.T, name, config string) *node {
	t.Helper()
	n := newNode(t, name, config)
	n.stopTimeout = time.Minute
	n.start()
	return n
}

// mtScrape is a scrape read for the series of the test's projection.
type mtScrape struct{ scrape }

func mt(s scrape) mtScrape { return mtScrape{s} }

// value returns the value of the projection's series of name, with the
// extra labels given as name, value pairs; ok is false when it is absent.
func (s mtScrape) value(name string, labels ...string) (float64, bool) {
	return s.scrape.value(name, projLabels(mtProjection, labels...))
}

func (s mtScrape) must(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := s.value(name, labels...)
	if !ok {
		t.Fatalf("%s%v: no series for the projection", name, labels)
	}
	return v
}

// waitMetric scrapes until cond holds for the projection's value of name.
func (n *node) waitMetric(timeout time.Duration, what, name string, cond func(float64) bool) float64 {
	n.t.Helper()
	var last float64
	waitFor(n.t, timeout, n.name+": "+what, func() bool {
		v, ok := mt(n.scrape()).value(name)
		last = v
		return ok && cond(v)
	})
	return last
}

// TestMetricsLagLifecycle follows the lag through a blocked backfill, live
// load, a paused apply (the test holds an ACCESS EXCLUSIVE lock on the read
// model, so batches wait) and idleness, on the active node and on a
// standby, and checks the health endpoints along the way.
func TestMetricsLagLifecycle(t *testing.T) {
	dsn := newDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	prefix := uniqueID("mt")
	cfgA := mtConfig(t, dsn, prefix, "a")
	migrate(t, cfgA)
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	run := func(c *pgx.Conn, sql string, args ...any) {
		t.Helper()
		if _, err := c.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	run(db, `CREATE TABLE mt_counts (stream_id text PRIMARY KEY, n bigint NOT NULL)`)
	run(db, `CREATE TABLE mt_noise (at timestamptz NOT NULL DEFAULT now())`)
	// Each batch of events gets streams of its own, each at stream_position 1.
	appendEvents := func(c *pgx.Conn, tag string, n int) {
		t.Helper()
		run(c, `INSERT INTO events (stream_id, stream_position, type, data)
			SELECT $1 || '-' || g, 1, 'Tick', '{}' FROM generate_series(1, $2::int) AS g`, tag, n)
	}
	appendEvents(db, "seed", 2000)

	// pause blocks every batch until the returned func releases it. An
	// ACCESS EXCLUSIVE lock is WAL-logged and so takes an xid, which
	// creating a slot waits for: a backfill is paused with SHARE mode,
	// which blocks the batches' writes just as well.
	pause := func(mode string) (release func()) {
		t.Helper()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE mt_counts IN `+mode+` MODE`); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The events are appended over a second connection: db holds the lock.
	writer, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.WithoutCancel(ctx))

	// Backfill, blocked: the lag rises, the backlog is every event.
	release := pause("SHARE")
	a := mtStart(t, "a", cfgA)
	a.waitMetric(time.Minute, "active", "pgscribe_active", func(v float64) bool { return v == 1 })
	a.waitMetric(time.Minute, "backfill total known", "pgscribe_backfill_events_total", func(v float64) bool { return v == 2000 })
	a.waitMetric(time.Minute, "backlog of the whole snapshot", "pgscribe_backlog_events", func(v float64) bool { return v == 2000 })
	l1 := a.waitMetric(time.Minute, "lag during the backfill", "pgscribe_lag_seconds", func(v float64) bool { return v > 0 })
	a.waitMetric(time.Minute, "lag rising during the backfill", "pgscribe_lag_seconds", func(v float64) bool { return v >= l1+0.5 })
	if code, _ := a.get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz while backfilling: %d, want 503", code)
	}
	if code, _ := a.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while backfilling: %d, want 200", code)
	}

	// Released: caught up, lag and backlog exactly 0.
	release()
	a.waitMetric(2*time.Minute, "backlog 0 after the backfill", "pgscribe_backlog_events", func(v float64) bool { return v == 0 })
	a.waitMetric(time.Minute, "lag 0 after the backfill", "pgscribe_lag_seconds", func(v float64) bool { return v == 0 })
	waitFor(t, time.Minute, "a ready", func() bool { code, _ := a.get("/readyz"); return code == http.StatusOK })

	// Live load: one transaction of 10 events every 10 ms for 3 s.
	var load sync.WaitGroup
	load.Add(1)
	loadErr := make(chan error, 1)
	go func() {
		defer load.Done()
		for i := 0; i < 300; i++ {
			if _, err := writer.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
				SELECT 'live' || $1::int || '-' || g, 1, 'Tick', '{}' FROM generate_series(1, 10) AS g`, i); err != nil {
				loadErr <- err
				return
			}
			time.Sleep(10 * time.Millisecond) // pacing of the writer, not a wait for a condition
		}
	}()
	maxLag := 0.0
	waitFor(t, time.Minute, "live events applied", func() bool {
		s := mt(a.scrape())
		maxLag = max(maxLag, s.must(t, "pgscribe_lag_seconds"))
		return s.must(t, "pgscribe_events_total", "outcome", "applied") >= 2500
	})
	load.Wait()
	select {
	case err := <-loadErr:
		t.Fatalf("writer: %v", err)
	default:
	}
	t.Logf("largest lag seen under the live load: %.3fs", maxLag)
	if maxLag > 30 {
		t.Errorf("lag under a light live load reached %.1fs", maxLag)
	}
	// The backlog gauge is the last probe's (every lag_interval), and a
	// batch's events are counted once its commit returns: a backlog of 0
	// may be read before the last batches are counted, or be a stale 0
	// from before the writer's last transactions. Wait for both.
	var s mtScrape
	waitFor(t, time.Minute, "backlog 0 and every event counted after the load", func() bool {
		s = mt(a.scrape())
		return s.must(t, "pgscribe_backlog_events") == 0 && s.must(t, "pgscribe_events_total", "outcome", "applied") >= 5000
	})
	if got := s.must(t, "pgscribe_events_total", "outcome", "applied"); got != 5000 {
		t.Errorf("applied %v events, want 5000", got)
	}
	if got := s.must(t, "pgscribe_batch_duration_seconds"); got == 0 {
		t.Error("no batch duration observed")
	}
	if got := s.must(t, "pgscribe_batches_total", "result", "committed"); got == 0 {
		t.Error("no committed batch counted")
	}
	for _, name := range []string{"pgscribe_events_total", "pgscribe_batches_total", "pgscribe_batch_duration_seconds",
		"pgscribe_batch_events", "pgscribe_lag_seconds", "pgscribe_replication_lag_bytes", "pgscribe_backlog_events",
		"pgscribe_watermark_lsn", "pgscribe_active", "pgscribe_halted", "pgscribe_build_info", "go_goroutines",
		"process_resident_memory_bytes"} {
		if s.scrape[name] == nil {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if wm := s.must(t, "pgscribe_watermark_lsn"); wm == 0 {
		t.Error("watermark LSN is 0 while live")
	}
	if ts := s.must(t, "pgscribe_watermark_commit_timestamp_seconds"); time.Since(time.Unix(int64(ts), 0)) > 5*time.Minute {
		t.Errorf("watermark commit time %v is not recent", time.Unix(int64(ts), 0))
	}

	// A standby reads the same numbers from PostgreSQL.
	b := mtStart(t, "b", mtConfig(t, dsn, prefix, "b"))
	waitFor(t, time.Minute, "b standing by with a watermark", func() bool {
		s := mt(b.scrape())
		active, _ := s.value("pgscribe_active")
		wm, _ := s.value("pgscribe_watermark_lsn")
		return active == 0 && wm > 0
	})
	if code, _ := b.get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz on a healthy standby: %d, want 200", code)
	}
	if code, _ := b.get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz on a standby: %d, want 200", code)
	}
	sb := mt(b.scrape())
	if v := sb.must(t, "pgscribe_backlog_events"); v != 0 {
		t.Errorf("standby backlog %v, want 0", v)
	}
	if v := sb.must(t, "pgscribe_lag_seconds"); v != 0 {
		t.Errorf("standby lag %v, want 0", v)
	}

	// Paused apply while live: lag rises on both nodes, backlog is exact,
	// the slot cannot be confirmed past the blocked transaction.
	release = pause("ACCESS EXCLUSIVE")
	appendEvents(writer, "paused", 50)
	for _, n := range []*node{a, b} {
		l := n.waitMetric(time.Minute, "lag under a paused apply", "pgscribe_lag_seconds", func(v float64) bool { return v >= 0.5 })
		n.waitMetric(time.Minute, "lag rising under a paused apply", "pgscribe_lag_seconds", func(v float64) bool { return v >= l+0.5 })
		n.waitMetric(time.Minute, "backlog of the paused events", "pgscribe_backlog_events", func(v float64) bool { return v == 50 })
		t.Logf("%s under a paused apply: lag %.2fs, backlog 50", n.name, mt(n.scrape()).must(t, "pgscribe_lag_seconds"))
	}
	a.waitMetric(time.Minute, "slot not confirmed past the paused events", "pgscribe_replication_lag_bytes", func(v float64) bool { return v > 0 })
	if v := mt(a.scrape()).must(t, "pgscribe_active"); v != 1 {
		t.Errorf("a: pgscribe_active %v under a paused apply, want 1", v)
	}
	release()
	for _, n := range []*node{a, b} {
		n.waitMetric(time.Minute, "backlog 0 after the pause", "pgscribe_backlog_events", func(v float64) bool { return v == 0 })
		n.waitMetric(time.Minute, "lag 0 after the pause", "pgscribe_lag_seconds", func(v float64) bool { return v == 0 })
	}

	// Idle (no events; other tables write WAL): still measured every
	// lag_interval, the slot follows the WAL end, lag and backlog stay 0.
	a.waitMetric(time.Minute, "slot confirmed while idle", "pgscribe_replication_lag_bytes", func(v float64) bool { return v < 1<<20 })
	for range 5 {
		before := mt(a.scrape())
		run(writer, `INSERT INTO mt_noise DEFAULT VALUES`)
		waitFor(t, 10*time.Second, "another lag measurement", func() bool {
			v, _ := mt(a.scrape()).value("pgscribe_watermark_lsn")
			return v != before.must(t, "pgscribe_watermark_lsn")
		})
		for _, n := range []*node{a, b} {
			s := mt(n.scrape())
			if lag, backlog := s.must(t, "pgscribe_lag_seconds"), s.must(t, "pgscribe_backlog_events"); lag != 0 || backlog != 0 {
				t.Fatalf("%s idle: lag %v, backlog %v; want 0, 0", n.name, lag, backlog)
			}
		}
	}

	// Failover: the standby becomes active and reports from its tracker.
	a.stop()
	b.waitMetric(time.Minute, "b active after a stopped", "pgscribe_active", func(v float64) bool { return v == 1 })
	appendEvents(writer, "after", 20)
	waitFor(t, time.Minute, "events applied by b", func() bool {
		v, _ := mt(b.scrape()).value("pgscribe_events_total", "outcome", "applied")
		return v >= 20
	})
	b.waitMetric(time.Minute, "b caught up", "pgscribe_backlog_events", func(v float64) bool { return v == 0 })
	b.waitMetric(time.Minute, "b lag 0", "pgscribe_lag_seconds", func(v float64) bool { return v == 0 })
	b.stop()

	var n int64
	if err := db.QueryRow(ctx, `SELECT count(*) FROM mt_counts`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 5070 {
		t.Errorf("read model has %d streams, want 5070", n)
	}
}

// TestMetricsProbeCountsExactly runs the lag probe itself against events
// committed out of position order: a transaction holds a low position open
// while later ones commit, across many probes. The backlog (no cursors:
// every event) must equal count(*) after every probe once writers are
// quiet, although the probe counts only the table's tail.
func TestMetricsProbeCountsExactly(t *testing.T) {
	dsn := newDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	db, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.WithoutCancel(ctx))
	if _, err := migrations.Apply(ctx, db, "pgscribe"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.CreateEventsTable(ctx, db, "events"); err != nil {
		t.Fatal(err)
	}
	insert := func(q interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, tag string, n int) {
		t.Helper()
		if _, err := q.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data)
			SELECT $1 || '-' || g, 1, 'Tick', '{}' FROM generate_series(1, $2::int) AS g`, tag, n); err != nil {
			t.Fatal(err)
		}
	}
	count := func() int64 {
		t.Helper()
		var n int64
		if err := db.QueryRow(ctx, `SELECT count(*) FROM events`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	view := lag.NewMetrics(prometheus.NewRegistry(), "test").For("exact", 1)
	probe := lag.NewProbe(lag.ProbeConfig{SourceURL: dsn, Schema: "pgscribe", Projection: "exact", Version: 1,
		Slot: "none", Table: "events", Position: "position"}, view)
	defer probe.Close(ctx)
	tick := func(what string) lag.Reading {
		t.Helper()
		r, err := probe.Tick(ctx, nil)
		if err != nil {
			t.Fatalf("%s: probe: %v", what, err)
		}
		return r
	}
	check := func(what string) {
		t.Helper()
		if r, want := tick(what), count(); !r.BacklogKnown || r.Backlog != want {
			t.Fatalf("%s: backlog %d (known %v), want count(*) = %d", what, r.Backlog, r.BacklogKnown, want)
		}
	}

	insert(db, "seed", 1000)
	check("first, full count")
	held, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close(context.WithoutCancel(ctx))
	for round := range 3 {
		// A transaction takes a position and stays open while others commit
		// above it and the probe promotes floors.
		tx, err := held.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		insert(tx, fmt.Sprintf("held%d", round), 1)
		for i := range 6 {
			insert(db, fmt.Sprintf("r%d-%d", round, i), 50)
			check(fmt.Sprintf("round %d, step %d, a low position uncommitted", round, i))
		}
		if round == 1 {
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		} else if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for i := range 4 {
			check(fmt.Sprintf("round %d, after the low position ended, probe %d", round, i))
		}
	}
	if n := count(); n != 1000+3*6*50+2 {
		t.Fatalf("%d events, want %d", n, 1000+3*6*50+2)
	}
}
