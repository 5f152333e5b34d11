package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

// TestResourceFaultSlots: a server whose replication slots are all taken
// (max_replication_slots 3, three slots held by someone else) refuses
// the slot a first start needs (53400). The projection must not retry it
// in a loop as a transient error: it halts visibly — pgscribe_halted 1,
// /readyz 503, a log line naming max_replication_slots — and, once a slot
// is freed, resumes by itself, backfills and is exact. Alone the version
// needs its own slot; as a member, its group's scan needs the group's.
// The subtests run one after the other on a server of their own: its
// slots are shared.
func TestResourceFaultSlots(t *testing.T) {
	t.Parallel()
	pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := pgtest.Start(ctx, pgtest.Options{Settings: map[string]string{"max_replication_slots": "3"}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	inEveryFeed(t, false, func(t *testing.T) {
		proj := faultProjection{name: "room", types: []string{"Tick"}}
		e := faultEnvOn(t, pgtest.NewDatabase(t, s), 5, proj)
		e.appendEvents(t, rounds("r", 4, 20, "Tick", nil)...)
		// Every slot of the server taken by someone else.
		var dummies []string
		for i := range 3 {
			name := fmt.Sprintf("%s_other_%d", e.slotPrefix, i)
			e.exec(t, fmt.Sprintf(`SELECT pg_create_logical_replication_slot('%s', 'pgoutput')`, name))
			dummies = append(dummies, name)
		}

		p := e.start(t)
		rec := p.waitLog(waitLong, "the resource halt", logMsg("projection halted: the server has no room for it", proj.name))
		if got := logString(rec, "setting"); got != "max_replication_slots" {
			t.Errorf("halt names setting %q, want max_replication_slots: %v", got, rec)
		}
		for _, pr := range e.withPeers([]faultProjection{proj}) {
			waitMetric(t, p, "pgscribe_halted", pr.name, 1, waitLong)
		}
		if code, _ := p.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz %d while halted for want of a slot, want 503", code)
		}
		halted := time.Now()

		e.exec(t, fmt.Sprintf(`SELECT pg_drop_replication_slot('%s')`, dummies[0]))
		p.waitLog(waitLong, "the resume", logMsg("the server has room again: resuming", proj.name))
		// Halted, not retrying in a loop, for as long as no slot was free.
		if n := p.countLog(logMsg("projection halted: the server has no room for it", proj.name)); n != 1 {
			t.Errorf("%d halts of %s in the %s no slot was free, want 1", n, proj.name, time.Since(halted).Round(time.Millisecond))
		}
		if n := p.countLog(func(r map[string]any) bool {
			return logMsg("pipeline stopped, restarting", "")(r) && r["sqlstate"] == "53400"
		}); n != 0 {
			t.Errorf("%d restarts on 53400: the want of a slot was retried as a transient error", n)
		}
		e.verifyClean(t, p, proj)
		e.joined(t, p, 0, proj)
		for _, pr := range e.withPeers([]faultProjection{proj}) {
			waitMetric(t, p, "pgscribe_halted", pr.name, 0, waitLong)
		}
		p.stop()
		e.exec(t, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE '%\_other\_%'`)
	})
}

// TestCLIOnAFullServer: with every connection of the server taken, an
// operator command (pgscribe status) cannot connect: it says the server
// has no room, names max_connections and where the engine's state can be
// read meanwhile, instead of PostgreSQL's bare refusal; with a connection
// free again it answers.
func TestCLIOnAFullServer(t *testing.T) {
	t.Parallel()
	pgtest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := pgtest.Start(ctx, pgtest.Options{Settings: map[string]string{"max_connections": "12"}, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	proj := faultProjection{name: "full", types: []string{"Tick"}}
	e := faultEnvOn(t, pgtest.NewDatabase(t, s), 5, proj)
	e.operate(t, 0, "status")
	// Take every connection left (as the superuser: the reserved ones too).
	var taken []*pgx.Conn
	defer func() {
		for _, c := range taken {
			c.Close(context.Background())
		}
	}()
	for {
		c, err := pgx.Connect(ctx, e.dsn)
		if err != nil {
			if !strings.Contains(err.Error(), "53300") {
				t.Fatalf("connection %d refused with %v, want 53300", len(taken)+1, err)
			}
			break
		}
		taken = append(taken, c)
	}
	cmd := exec.CommandContext(ctx, pgscribeBinary(t), "status", "-config", e.config)
	cmd.Env = append(os.Environ(), "PGSCRIBE_DATABASE_URL="+e.dsn)
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err == nil {
		t.Errorf("status on a full server succeeded: %s", out)
	}
	for _, want := range []string{"no room for another connection", "max_connections", "/readyz", "53300"} {
		if !strings.Contains(out, want) {
			t.Errorf("status on a full server: %q does not say %q", out, want)
		}
	}
	t.Logf("status on a full server: %s", out)
	taken[0].Close(ctx)
	taken = taken[1:]
	e.operate(t, 0, "status")
}
