package admin

import (
	"strings"
	"testing"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/rules"
)

// A configuration needs one slot and one WAL sender per group, not per
// version: 30 versions in one group need one of each; those that exist
// (or stream) already need no room.
func TestReplicationRoom(t *testing.T) {
	cfg := &config.Config{Source: config.Source{SlotPrefix: "p"}}
	for i := range 30 {
		cfg.Projections = append(cfg.Projections, rules.Spec{Name: "v" + string(rune('a'+i%26)) + string(rune('a'+i/26)), Version: 1})
	}
	cfg.Projections = append(cfg.Projections, rules.Spec{Name: "alone", Version: 1, Group: "solo"})
	feeds := feedSlots(cfg)
	if len(feeds) != 2 || !strings.Contains(strings.Join(feeds, " "), cfg.SlotName(cfg.Projections[30])) {
		t.Fatalf("feed slots %v: want the default group's and the version alone's own", feeds)
	}
	stock := replicationRoom{maxSlots: 10, usedSlots: 8, maxSenders: 10, usedSenders: 9}
	if p := stock.problems(len(feeds)); len(p) != 1 || !strings.Contains(p[0], "max_wal_senders is 10 with 9 in use") || !strings.Contains(p[0], "raise it by 1") {
		t.Errorf("2 groups, 2 free slots, 1 free WAL sender: %q", p)
	}
	running := replicationRoom{maxSlots: 10, usedSlots: 10, ourSlots: 2, maxSenders: 10, usedSenders: 10, ourSenders: 2}
	if p := running.problems(len(feeds)); len(p) != 0 {
		t.Errorf("both groups' slots exist and stream: %q", p)
	}
	full := replicationRoom{maxSlots: 10, usedSlots: 10, maxSenders: 10}
	if p := full.problems(3); len(p) != 1 || !strings.Contains(p[0], "max_replication_slots is 10 with 10 in use") || !strings.Contains(p[0], "raise it by 3") {
		t.Errorf("3 groups, no free slot: %q", p)
	}
}
