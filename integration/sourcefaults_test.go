package integration

// Source faults (issue 13): a source the engine can no longer read —
// publication dropped, privilege revoked, REPLICATION removed, a mapped
// column renamed, a type it cannot read, a failed password — halts the
// projection loudly (log, pgscribe_halted, pgscribe_halts_total, status,
// /readyz and /healthz 503) within 30 s, loses nothing, and resumes by
// itself once the cause is fixed, with an exact read model. Each case has
// its own database on the shared server; the ones that take a privilege
// away run the engine as a role of their own, not as a superuser.
//
// Uses the fault tests' helpers (newFaultEnv, startFault, faultEnv.start,
// appendEvents, rounds, verifyClean, terminateBackends) and the harness's
// node, waitAccounted, logMsg, logString and projLabels.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// haltVisible bounds how long a source fault may take to show.
const haltVisible = 30 * time.Second

// engineRole makes the engine run as a new login role with REPLICATION
// and every privilege it needs on e's database, and returns the role's
// name and password. The role is dropped when t ends.
func engineRole(t *testing.T, e *faultEnv) (role, password string) {
	t.Helper()
	role, password = e.slotPrefix+"_engine", uniqueID("pw")
	e.exec(t, fmt.Sprintf(`CREATE ROLE %s LOGIN REPLICATION PASSWORD '%s'`, role, password))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := e.pool.Exec(ctx, "DROP OWNED BY "+role); err != nil {
			t.Logf("drop owned by %s: %v", role, err)
		}
		if _, err := e.pool.Exec(ctx, "DROP ROLE IF EXISTS "+role); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})
	for _, schema := range []string{"public", "pgscribe"} {
		e.exec(t, fmt.Sprintf(`GRANT USAGE, CREATE ON SCHEMA %[1]s TO %[2]s;
GRANT ALL ON ALL TABLES IN SCHEMA %[1]s TO %[2]s;
GRANT ALL ON ALL SEQUENCES IN SCHEMA %[1]s TO %[2]s`, schema, role))
	}
	u, err := url.Parse(e.dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	e.dsn = u.String()
	return role, password
}

// startAsRole starts the engine as its own role (engineRole) on a new
// environment with a backlog of streams (a prefix) and waits for the
// backfill; admin is the superuser's DSN.
func startAsRole(t *testing.T, proj faultProjection, streams string) (e *faultEnv, p *node, admin, role, password string) {
	t.Helper()
	e = newFaultEnv(t, 5, proj)
	admin = e.dsn
	role, password = engineRole(t, e)
	e.appendEvents(t, rounds(streams, 4, 10, "Tick", nil)...)
	p = e.start(t)
	waitAccounted(t, e.pool, waitLong, proj.name, 1, p.brokenOrHalted)
	return e, p, admin, role, password
}

// migrateAs runs `pgscribe migrate` as the superuser (adminDSN).
func migrateAs(t *testing.T, e *faultEnv, adminDSN string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, pgscribeBinary(t), "migrate", "-config", e.config)
	cmd.Env = append(os.Environ(), "PGSCRIBE_DATABASE_URL="+adminDSN)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pgscribe migrate: %v\n%s", err, out)
	}
}

// sourceStatus is the part of `pgscribe status -json` these tests read.
type sourceStatus struct {
	Projections []sourceStatusProjection `json:"projections"`
}

// sourceStatusProjection is one projection version of sourceStatus.
type sourceStatusProjection struct {
	Projection   string   `json:"projection"`
	State        string   `json:"state"`
	HaltReason   string   `json:"halt_reason"`
	HaltStage    string   `json:"halt_stage"`
	HaltSQLState string   `json:"halt_sqlstate"`
	Notes        []string `json:"notes"`
}

// waitSourceHalt waits (haltVisible at most) until the projection shows
// as halted at stage with SQLSTATE code ("" for none) everywhere an
// operator looks: the log, pgscribe_halted, pgscribe_halts_total,
// /readyz and /healthz, and — for a halt that holds the lock — `pgscribe
// status` (text and -json, run as adminDSN).
//
// In mode feedMember the projection's peer must show the same halt: a
// fault of the group's source halts every member.
func waitSourceHalt(t *testing.T, e *faultEnv, p *node, projection, stage, code, adminDSN string) {
	t.Helper()
	for _, pr := range e.withPeers([]faultProjection{{name: projection}}) {
		waitSourceHaltOf(t, e, p, pr.name, stage, code, adminDSN)
	}
}

func waitSourceHaltOf(t *testing.T, e *faultEnv, p *node, projection, stage, code, adminDSN string) {
	t.Helper()
	rec := p.waitLog(haltVisible, "the halt of "+projection, func(r map[string]any) bool {
		return logMsg("projection halted", projection)(r) && logString(r, "stage") == stage
	})
	if got := logString(rec, "sqlstate"); got != code {
		t.Errorf("halt log sqlstate = %q, want %q: %v", got, code, rec)
	}
	class := "none"
	if code != "" {
		class = code[:2]
	}
	deadline := time.Now().Add(haltVisible)
	for {
		halted := p.metric("pgscribe_halted", projLabels(projection))
		halts := p.metric("pgscribe_halts_total", projLabels(projection, "stage", stage, "sqlstate_class", class))
		ready, _ := p.get("/readyz")
		healthy, body := p.get("/healthz")
		if halted == 1 && halts >= 1 && ready == http.StatusServiceUnavailable && healthy == http.StatusServiceUnavailable {
			if !strings.Contains(body, `"halted"`) {
				t.Errorf("/healthz does not name the halted projection: %s", body)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("halt not visible within %s: pgscribe_halted %v, pgscribe_halts_total{stage=%q,sqlstate_class=%q} %v, /readyz %d, /healthz %d",
				haltVisible, halted, stage, class, halts, ready, healthy)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if stage != "source" {
		return // no lock held: status has no lease row to read the halt from
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		cmd := exec.CommandContext(ctx, pgscribeBinary(t), "status", "-config", e.config, "-json")
		cmd.Env = append(os.Environ(), "PGSCRIBE_DATABASE_URL="+adminDSN)
		out, err := cmd.Output()
		var st sourceStatus
		if err == nil {
			err = json.Unmarshal(out, &st)
		}
		if err != nil {
			t.Fatalf("status -json: %v\n%s", err, out)
		}
		for _, ps := range st.Projections {
			if ps.Projection == projection && ps.State == "halted" {
				if ps.HaltStage != stage || ps.HaltSQLState != code || !strings.Contains(strings.Join(ps.Notes, " "), "resumes by itself") {
					t.Errorf("status -json: halt stage %q sqlstate %q notes %q, want %q %q and a note that it resumes: %s",
						ps.HaltStage, ps.HaltSQLState, ps.Notes, stage, code, ps.HaltReason)
				}
				text := exec.CommandContext(ctx, pgscribeBinary(t), "status", "-config", e.config)
				text.Env = cmd.Env
				tout, _ := text.CombinedOutput()
				if want := "source halt"; !strings.Contains(string(tout), want) || (code != "" && !strings.Contains(string(tout), code)) {
					// The two reads are moments apart: a group whose lock
					// session was cut restarts its members, and the halt
					// shows again once they halted again.
					if time.Now().Before(deadline) {
						time.Sleep(200 * time.Millisecond)
						continue
					}
					t.Errorf("status text does not show the %s with sqlstate %q:\n%s", want, code, tout)
				}
				return
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			t.Fatalf("status never showed %s halted: %s", projection, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// resumedExact waits for the log line that says the fault cleared, appends
// events that must stream, and checks the read model exact and everything
// accounted for, with nothing halted any more.
func resumedExact(t *testing.T, e *faultEnv, p *node, proj faultProjection, msgPrefix, streams string) {
	t.Helper()
	p.waitLog(waitLong, "the resume of "+proj.name, logMsg(msgPrefix, proj.name))
	e.appendEvents(t, rounds(streams, 4, 5, "Tick", nil)...)
	e.verifyClean(t, p, proj)
	p.stop()
}

func TestSourceFaultPublicationDropped(t *testing.T) {
	tickFaultTest(t, "pubdrop", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 5, "", rounds("p", 4, 10, "Tick", nil), proj)
		admin := e.dsn
		pub := scalar[string](t, e.pool, `SELECT pubname FROM pg_publication`)
		e.exec(t, "DROP PUBLICATION "+pgx.Identifier{pub}.Sanitize())
		e.appendEvents(t, rounds("p", 4, 5, "Tick", nil)...) // the stream fails on these
		waitSourceHalt(t, e, p, proj.name, "source", "42704", admin)
		e.appendEvents(t, rounds("p", 4, 5, "Tick", nil)...) // while halted

		migrateAs(t, e, admin) // the documented fix: recreate the publication
		// The slot's changes from before the new publication cannot be
		// decoded: resynced as a lost slot, once.
		p.waitLog(waitLong, "the resync", logMsg("resyncing from a new snapshot", proj.name))
		resumedExact(t, e, p, proj, "source fault cleared", "p")
		if n := p.countLog(logMsg("resyncing from a new snapshot", proj.name)); n != 1 {
			t.Errorf("resynced %d times, want once", n)
		}
	})
}

// TestSourceFaultPublicationRecreatedWhileStopped: the publication dropped
// and recreated while pgscribe was down, events appended in between — the
// slot cannot decode them (the publication is missing from the catalog
// snapshot at its position) though the source passes every check: the
// engine resyncs once at start instead of looping.
func TestSourceFaultPublicationRecreatedWhileStopped(t *testing.T) {
	tickFaultTest(t, "pubgone", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 5, "", rounds("g", 4, 10, "Tick", nil), proj)
		admin := e.dsn
		p.stop()
		e.exec(t, "DROP PUBLICATION "+pgx.Identifier{scalar[string](t, e.pool, `SELECT pubname FROM pg_publication`)}.Sanitize())
		e.appendEvents(t, rounds("g", 4, 5, "Tick", nil)...)
		migrateAs(t, e, admin)
		e.appendEvents(t, rounds("g", 4, 5, "Tick", nil)...)

		p = e.start(t)
		p.waitLog(waitLong, "the resync", logMsg("resyncing from a new snapshot", proj.name))
		e.appendEvents(t, rounds("g", 4, 5, "Tick", nil)...)
		e.verifyClean(t, p, proj)
		if n := p.countLog(logMsg("projection halted", proj.name)); n != 0 {
			t.Errorf("halted %d times; the source passes every check, the slot is resynced", n)
		}
		p.stop()
	})
}

func TestSourceFaultSelectRevokedDuringBackfill(t *testing.T) {
	tickFaultTest(t, "revoke", func(t *testing.T, proj faultProjection) {
		e := newFaultEnv(t, 5, proj)
		admin := e.dsn
		role, _ := engineRole(t, e)
		e.appendEvents(t, rounds("r", 20, 300, "Tick", nil)...) // 6,000: many snapshot pages

		// Hold the read model so that the backfill cannot get far: its reader
		// blocks on full partition queues after a page or two.
		ctx := context.Background()
		hold := e.holdRows(t, proj)
		p := e.start(t)
		p.waitLog(waitLong, "the backfill", logMsg("backfill started", proj.name))
		// A transaction that already read a table keeps its privileges (the
		// server checks them against its cached catalog): the revoke takes
		// effect on the backfill's next connection. End the engine's
		// connections, as a failover or a network cut would.
		e.exec(t, "REVOKE SELECT ON events FROM "+role)
		if _, err := e.terminateBackends(ctx, "usename = '"+role+"'"); err != nil {
			t.Fatal(err)
		}
		if err := hold.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		waitSourceHalt(t, e, p, proj.name, "source", "42501", admin)
		e.appendEvents(t, rounds("r", 20, 2, "Tick", nil)...) // while halted

		e.exec(t, "GRANT SELECT ON events TO "+role)
		resumedExact(t, e, p, proj, "source fault cleared", "r")
	})
}

func TestSourceFaultReplicationRemoved(t *testing.T) {
	tickFaultTest(t, "norepl", func(t *testing.T, proj faultProjection) {
		e, p, admin, role, _ := startAsRole(t, proj, "n")

		// Taking REPLICATION away ends nothing running: the walsender's next
		// connection is refused.
		e.exec(t, "ALTER ROLE "+role+" NOREPLICATION")
		if _, err := e.terminateBackends(context.Background(), "backend_type = 'walsender'"); err != nil {
			t.Fatal(err)
		}
		e.appendEvents(t, rounds("n", 4, 5, "Tick", nil)...)
		waitSourceHalt(t, e, p, proj.name, "source", "42501", admin)

		e.exec(t, "ALTER ROLE "+role+" REPLICATION")
		resumedExact(t, e, p, proj, "source fault cleared", "n")
	})
}

func TestSourceFaultColumnRenamed(t *testing.T) {
	tickFaultTest(t, "renamed", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 5, "", rounds("c", 4, 10, "Tick", nil), proj)
		admin := e.dsn
		// occurred_at is mapped and has a default, so events can still be
		// appended while it has another name.
		e.exec(t, "ALTER TABLE events RENAME COLUMN occurred_at TO happened_at")
		e.appendEvents(t, rounds("c", 4, 5, "Tick", nil)...)
		waitSourceHalt(t, e, p, proj.name, "source", "42703", admin)

		e.exec(t, "ALTER TABLE events RENAME COLUMN happened_at TO occurred_at")
		// The changes written under the other name stay in the slot with it:
		// resynced.
		p.waitLog(waitLong, "the resync", logMsg("resyncing from a new snapshot", proj.name))
		resumedExact(t, e, p, proj, "source fault cleared", "c")
	})
}

func TestSourceFaultUnreadableType(t *testing.T) {
	tickFaultTest(t, "interval", func(t *testing.T, proj faultProjection) {
		e := newFaultEnv(t, 5, proj)
		admin := e.dsn
		// An occurred_at that is no point in time: nothing can read it.
		e.exec(t, `ALTER TABLE events ALTER COLUMN occurred_at DROP DEFAULT,
	  ALTER COLUMN occurred_at TYPE interval USING interval '1 hour',
	  ALTER COLUMN occurred_at SET DEFAULT interval '1 hour'`)
		e.appendEvents(t, rounds("i", 4, 10, "Tick", nil)...)
		p := e.start(t)
		waitSourceHalt(t, e, p, proj.name, "source", "", admin)
		e.appendEvents(t, rounds("i", 4, 5, "Tick", nil)...) // while halted
		if n := e.accounted(t, proj.name); n != 0 {
			t.Errorf("%d events accounted for while nothing could be read", n)
		}

		e.exec(t, `ALTER TABLE events ALTER COLUMN occurred_at DROP DEFAULT,
	  ALTER COLUMN occurred_at TYPE timestamptz USING timestamptz '2026-01-01 00:00:00+00' + occurred_at,
	  ALTER COLUMN occurred_at SET DEFAULT now()`)
		resumedExact(t, e, p, proj, "source changed since the halt", "i")
	})
}

func TestSourceFaultWrongPassword(t *testing.T) {
	tickFaultTest(t, "password", func(t *testing.T, proj faultProjection) {
		e, p, _, role, password := startAsRole(t, proj, "w")
		wrong := strings.Replace(e.dsn, ":"+password+"@", ":wrong"+password+"@", 1)
		if conn, err := pgx.Connect(context.Background(), wrong); err == nil {
			conn.Close(context.Background())
			t.Skip("the server does not check passwords (trust authentication)")
		}
		p.stop()

		// The role's password changes while pgscribe is down.
		e.exec(t, fmt.Sprintf("ALTER ROLE %s PASSWORD 'changed%s'", role, password))
		e.appendEvents(t, rounds("w", 4, 5, "Tick", nil)...)
		p = e.start(t)
		waitSourceHalt(t, e, p, proj.name, "lock", "28P01", "")

		e.exec(t, fmt.Sprintf("ALTER ROLE %s PASSWORD '%s'", role, password))
		resumedExact(t, e, p, proj, "lock fault cleared", "w")
	})
}

// TestSourceReadOnlyRole: the source is read on a connection whose
// transactions are read-only by default (a role with
// default_transaction_read_only, as a reporting role often is; the read
// models written elsewhere, [database] target_url). Nothing pgscribe does
// on the source writes a table: the backfill's pages, the transaction id
// taken after each to flush the WAL position the scout waits for (a
// read-only transaction may take one), the slot's creation, copy and
// confirmation. Backfill and stream end exact.
func TestSourceReadOnlyRole(t *testing.T) {
	tickFaultTest(t, "rosrc", func(t *testing.T, proj faultProjection) {
		e := newFaultEnv(t, 5, proj)
		e.appendEvents(t, rounds("ro", 10, 100, "Tick", nil)...)
		sep := "?"
		if strings.Contains(e.dsn, "?") {
			sep = "&"
		}
		ro := e.dsn + sep + "options=" + strings.ReplaceAll(url.QueryEscape("-c default_transaction_read_only=on"), "+", "%20")
		c := faultConfig(ro, e.slotPrefix, 5).set("database", "target_url", fmt.Sprintf("%q", e.dsn))
		for _, p := range e.withPeers([]faultProjection{proj}) {
			c.add(p.toml())
		}
		c.write(t, e.config)
		p := newNode(t, "pgscribe", e.config)
		p.stopTimeout = 40 * time.Second
		p.start()
		e.appendEvents(t, rounds("ro", 10, 20, "Tick", nil)...)
		e.verifyClean(t, p, proj)
		if n := p.countLog(logMsg("backfill complete", proj.name)); n != 1 {
			t.Errorf("%d backfills completed, want 1", n)
		}
		p.stop()
	})
}

// TestSourceFaultGroupSlotUndecodable: a group of two whose slot cannot
// decode past a recreated publication while one member is paused (so that
// it stays recorded on the group's slot). The other member resyncs on a
// slot of its own; it must not rejoin the group's slot, which would fail
// again and halt it for good (campaign seed 14): the first member to
// resync drops the group's slot. The paused member resyncs when resumed,
// and both end exact.
func TestSourceFaultGroupSlotUndecodable(t *testing.T) {
	t.Parallel()
	t.Run(string(feedMember), func(t *testing.T) {
		proj := faultProjection{name: "undec", types: []string{"Tick"}}
		peer := proj.name + "_peer"
		e, p := startFault(t, 5, "", rounds("u", 4, 10, "Tick", nil), proj)
		admin := e.dsn
		e.operate(t, 0, "pause", "-projection", peer, "-version", "1")
		waitMetric(t, p, "pgscribe_paused", peer, 1, waitLong)
		e.exec(t, "DROP PUBLICATION "+pgx.Identifier{scalar[string](t, e.pool, `SELECT pubname FROM pg_publication`)}.Sanitize())
		e.appendEvents(t, rounds("u", 4, 5, "Tick", nil)...)
		waitSourceHaltOf(t, e, p, proj.name, "source", "42704", admin) // the paused peer reads nothing
		migrateAs(t, e, admin)
		p.waitLog(waitLong, "the resync", logMsg("resyncing from a new snapshot", proj.name))
		e.appendEvents(t, rounds("u", 4, 5, "Tick", nil)...)
		waitAccounted(t, e.pool, waitLong, proj.name, 1, p.broken)
		if v := p.metric("pgscribe_halted", projLabels(proj.name)); v != 0 {
			t.Errorf("%s halted again after its resync (pgscribe_halted %v): it rejoined the group's slot that cannot decode", proj.name, v)
		}
		e.operate(t, 0, "resume", "-projection", peer, "-version", "1")
		e.appendEvents(t, rounds("u", 4, 5, "Tick", nil)...)
		e.verifyClean(t, p, proj)
		p.stop()
	})
}

// TestCampaignSeed2032HaltAfterASourceHalt: a projection that halted on a
// dropped publication (and resumed once it was recreated) halts again,
// later, on a column its rule writes renamed away (42703). The engine
// recorded each halt's error in an atomic.Value, which panics when the
// second error's type differs from the first's: the node died with every
// projection on it (campaign seed 2032). It must halt visibly, stay up,
// and resume exactly once the column is back and an operator resumes it.
func TestCampaignSeed2032HaltAfterASourceHalt(t *testing.T) {
	tickFaultTest(t, "twohalts", func(t *testing.T, proj faultProjection) {
		e, p := startFault(t, 5, "", rounds("h", 4, 10, "Tick", nil), proj)
		admin := e.dsn
		pub := scalar[string](t, e.pool, `SELECT pubname FROM pg_publication`)
		e.exec(t, "DROP PUBLICATION "+pgx.Identifier{pub}.Sanitize())
		e.appendEvents(t, rounds("h", 4, 5, "Tick", nil)...)
		waitSourceHalt(t, e, p, proj.name, "source", "42704", admin)
		migrateAs(t, e, admin)
		p.waitLog(waitLong, "the source halt's end", logMsg("source fault cleared", proj.name))

		e.exec(t, "ALTER TABLE "+proj.name+"_rows RENAME COLUMN v TO v_gone")
		e.appendEvents(t, rounds("h", 4, 5, "Tick", nil)...)
		p.waitLog(waitLong, "the structural halt", logMsg("projection halted: fix the cause", proj.name))
		waitMetric(t, p, "pgscribe_halted", proj.name, 1, waitLong)
		if p.exited() {
			t.Fatalf("pgscribe exited on the second halt: %v", p.err())
		}
		if code, _ := p.get("/readyz"); code != http.StatusServiceUnavailable {
			t.Errorf("/readyz %d while halted, want 503", code)
		}
		e.exec(t, "ALTER TABLE "+proj.name+"_rows RENAME COLUMN v_gone TO v")
		e.operate(t, 0, "resume", "-projection", proj.name, "-version", "1")
		waitMetric(t, p, "pgscribe_halted", proj.name, 0, waitLong)
		e.appendEvents(t, rounds("h", 4, 5, "Tick", nil)...)
		e.verifyClean(t, p, proj)
		if p.countLog(func(r map[string]any) bool { return strings.Contains(fmt.Sprint(r["msg"]), "panic") }) > 0 {
			t.Error("a panic in the log")
		}
		p.stop()
	})
}
