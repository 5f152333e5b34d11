package apply

import (
	"context"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
)

func TestParkPlan(t *testing.T) {
	c := &Committer{opts: Options{Projection: "p", Version: 1, Park: true}}
	at := func(stream string, pos int64, out outcome) planned {
		return planned{ev: &event.Event{StreamID: stream, StreamPosition: pos, Position: pos}, out: out}
	}
	plan := []planned{
		at("s", 1, outApply), at("s", 2, outDead), at("t", 1, outApply), at("s", 3, outApply),
		at("s", 4, outSkip), at("u", 6, outApply), at("u", 5, outDuplicate),
	}
	curs := map[string]cursor.Cursor{"s": {StreamPosition: 4}, "t": {StreamPosition: 1}, "u": {StreamPosition: 6, Parked: true, ParkedSince: 5}}
	adv := map[string]*cursor.Advance{"s": {StreamID: "s"}, "t": {StreamID: "t"}, "u": {StreamID: "u"}}
	parked := c.parkedStreams(curs)
	held := c.parkPlan(plan, parked, adv, curs)

	want := []outcome{outApply, outDead, outApply, outPark, outPark, outPark, outDuplicate}
	for i, p := range plan {
		if p.out != want[i] {
			t.Errorf("event %s/%d: outcome %d, want %d", p.ev.StreamID, p.ev.StreamPosition, p.out, want[i])
		}
	}
	if len(held) != 3 || held[0].StreamID != "s" || held[0].StreamPosition != 3 || held[2].StreamID != "u" {
		t.Errorf("held = %+v, want s/3, s/4, u/6", held)
	}
	if !adv["s"].Parks || adv["s"].ParkedSince != 2 || !curs["s"].Parked || curs["s"].ParkedSince != 2 {
		t.Errorf("s parked since advance %+v, cursor %+v; want 2", adv["s"], curs["s"])
	}
	if adv["u"].Parks || adv["t"].Parks {
		t.Errorf("u (parked before the batch) and t (not parked) must not be parked again: %+v %+v", adv["u"], adv["t"])
	}

	// A stream from 0 whose first event is dead-lettered is parked since
	// position 0, in this batch and, from its cursor, in the next.
	curs0 := map[string]cursor.Cursor{}
	adv0 := map[string]*cursor.Advance{"z": {StreamID: "z"}}
	plan0 := []planned{at("z", 0, outDead), at("z", 1, outApply)}
	c.parkPlan(plan0, c.parkedStreams(curs0), adv0, curs0)
	if plan0[1].out != outPark || !adv0["z"].Parks || adv0["z"].ParkedSince != 0 {
		t.Errorf("dead letter at position 0: next event %d, advance %+v; want held, parked since 0", plan0[1].out, adv0["z"])
	}
	curs0["z"] = cursor.Cursor{StreamPosition: 1, Parked: true, ParkedSince: 0}
	next := []planned{at("z", 2, outApply)}
	c.parkPlan(next, c.parkedStreams(curs0), adv0, curs0)
	if next[0].out != outPark {
		t.Errorf("a stream parked since position 0: its next batch's event %d, want held", next[0].out)
	}

	// A projection that does not park leaves the plan alone.
	c.opts.Park = false
	plan2 := []planned{at("s", 2, outDead), at("s", 3, outApply)}
	if held := c.parkPlan(plan2, c.parkedStreams(curs), adv, curs); held != nil || plan2[1].out != outApply {
		t.Errorf("without park: held %v, outcome %d", held, plan2[1].out)
	}
}

func TestGateHoldsWorkers(t *testing.T) {
	var p Partitions
	ctx := context.Background()
	if !p.gate.pass(ctx, nil) {
		t.Fatal("an open gate must pass")
	}
	p.Hold(true)
	passed := make(chan bool, 1)
	go func() { passed <- p.gate.pass(ctx, nil) }()
	select {
	case <-passed:
		t.Fatal("a held gate passed")
	case <-time.After(50 * time.Millisecond):
	}
	p.Hold(false)
	if !<-passed {
		t.Fatal("the gate did not pass once opened")
	}
	p.Hold(true)
	stop := make(chan struct{})
	close(stop)
	if p.gate.pass(ctx, stop) {
		t.Fatal("a held gate must report a stop")
	}
}

// A stream parked at a failure known before the isolated pass (a rule
// error at position 5) parks at an earlier failure the pass finds (a
// CHECK violation at 3): the event between them is held, and so is the
// rule failure (campaign seeds 7 and 9).
func TestParkMovesToAnEarlierFailure(t *testing.T) {
	at := func(pos int64, out outcome) planned {
		return planned{ev: &event.Event{StreamID: "s", StreamPosition: pos, Position: pos}, out: out}
	}
	plan := []planned{at(3, outApply), at(4, outApply), at(5, outDead), at(6, outApply)}
	parked := map[string]int64{}
	for i := range plan {
		parkOf(&plan[i], parked)
	}
	if parked["s"] != 5 || plan[3].out != outPark {
		t.Fatalf("before the isolated pass: parked %v, s/6 %d; want parked at 5, s/6 held", parked, plan[3].out)
	}
	plan[0].out = outDead // the isolated pass: s/3 violates a CHECK
	rerun := false
	for i := range plan {
		applied := plan[i].out == outApply
		if parkOf(&plan[i], parked) && applied {
			rerun = true
		}
	}
	want := []outcome{outDead, outPark, outPark, outPark}
	for i, p := range plan {
		if p.out != want[i] {
			t.Errorf("s/%d: outcome %d, want %d", p.ev.StreamPosition, p.out, want[i])
		}
	}
	if parked["s"] != 3 || !rerun {
		t.Errorf("parked since %d, rerun %v; want 3 and a rerun (s/4 had applied)", parked["s"], rerun)
	}
}
