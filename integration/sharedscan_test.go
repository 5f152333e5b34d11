package integration

import (
	"context"
	"testing"
)

// TestGroupScanDropsSlowMember: the two members of a group backfill 2,400
// events through the group's one scan; one of them cannot write (its read
// model is locked by another session). The scan must not wait for it: it
// drops that member once it held the other back on one page for
// slow_member_timeout (1 s here), the other backfills every event, goes live and
// joins the group's stream while the lock is still held; once the lock
// is gone the dropped member backfills on a slot of its own, its cursors
// skipping what it applied from the scan, and joins too. Both are exact,
// without dead letters.
func TestGroupScanDropsSlowMember(t *testing.T) {
	t.Parallel()
	t.Run(string(feedMember), func(t *testing.T) {
		proj := faultProjection{name: "scan", types: []string{"Tick"}}
		e := newFaultEnv(t, 5, proj)
		c := faultConfig(e.dsn, e.slotPrefix, 5).with("engine", map[string]string{"slow_member_timeout": `"1s"`})
		for _, p := range e.withPeers([]faultProjection{proj}) {
			c.add(p.toml())
		}
		c.write(t, e.config)
		e.appendEvents(t, rounds("s", 8, 300, "Tick", nil)...) // six pages of backfill_batch_size 400
		peer := proj
		peer.name += "_peer"
		hold := e.holdRows(t, peer)

		p := e.start(t)
		p.waitLog(waitLong, "the group's one scan", logMsg("one scan of the group's slot for its members", ""))
		rec := p.waitLog(waitLong, "the drop of the held member from the group's scan", logMsg("a member held the group's scan back", ""))
		if m := logString(rec, "member"); m != peer.name+"/1" {
			t.Errorf("dropped member %q from the group's scan, want %s/1 (the one that cannot write): %v", m, peer.name, rec)
		}
		waitAccounted(t, e.pool, waitLong, proj.name, 1, p.broken)
		waitUntil(t, waitLong, proj.name+" to join the group's stream after the scan", func(context.Context) (bool, error) {
			return p.countLog(func(r map[string]any) bool {
				return logMsg("joined the group's stream", proj.name)(r) && r["after"] == "the group's scan"
			}) > 0, nil
		}, p.broken)
		total := e.events(t)
		if n := e.scalar(t, `SELECT count(*) FROM `+peer.name+`_rows`); n != 0 {
			t.Errorf("%s wrote %d rows while its read model was locked", peer.name, n)
		}
		if err := hold.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}

		waitAccounted(t, e.pool, waitLong, peer.name, 1, p.broken)
		p.waitLog(waitLong, "the dropped member's own backfill", logMsg("backfilling on a slot of its own after a drop from the group's scan", peer.name))
		p.waitLog(waitLong, "the dropped member's plan", logMsg("backfilling again: the group's scan did not finish this version's backfill", peer.name))
		waitUntil(t, waitLong, peer.name+" to join the group's stream from its own slot", func(context.Context) (bool, error) {
			return p.countLog(func(r map[string]any) bool {
				return logMsg("joined the group's stream", peer.name)(r) && r["after"] == "its own slot"
			}) > 0, nil
		}, p.broken)
		e.joined(t, p, 0, proj)
		e.verifyClean(t, p, proj)
		if got := e.events(t); got != total {
			t.Fatalf("events table changed from %d to %d", total, got)
		}
		if n := p.countLog(logMsg("a member held the group's scan back", "")); n != 1 {
			t.Errorf("%d drops from the group's scan, want 1", n)
		}
		p.stop()
	})
}
