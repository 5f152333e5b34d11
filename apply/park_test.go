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
	curs := map[string]cursor.Cursor{"s": {StreamPosition: 4}, "t": {StreamPosition: 1}, "u": {StreamPosition: 6, ParkedSince: 5}}
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
	if adv["s"].ParkedSince != 2 || curs["s"].ParkedSince != 2 {
		t.Errorf("s parked since advance %d, cursor %d; want 2", adv["s"].ParkedSince, curs["s"].ParkedSince)
	}
	if adv["u"].ParkedSince != 0 || adv["t"].ParkedSince != 0 {
		t.Errorf("u (parked before the batch) and t (not parked) must not be parked again: %+v %+v", adv["u"], adv["t"])
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
