package apply

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

// bigEvent is an event of about n bytes of JSON in stream s.
func bigEvent(s string, n int) *event.Event {
	return &event.Event{StreamID: s, RawData: []byte(`{"doc":"` + strings.Repeat("x", n) + `"}`)}
}

// TestPartitionsBoundBytes: the events dispatched and not committed weigh
// at most Bytes, whatever room the queues have; a batch's commit gives
// its weight back; an event heavier than the bound passes alone.
func TestPartitionsBoundBytes(t *testing.T) {
	const bound = 11 << 10
	p := NewPartitions(nil, PartitionOptions{Count: 2, QueueSize: 100, BatchSize: func() int { return 10 }, Bytes: bound})
	four := bigEvent("a", 4<<10) // 4 KiB and the overhead: two fit in 11 KiB, not three
	if !p.TryDispatch(Input{Event: four}) || !p.TryDispatch(Input{Event: four}) {
		t.Fatal("two events of 5 KiB refused under a bound of 11 KiB")
	}
	if p.TryDispatch(Input{Event: four}) {
		t.Fatal("a third event of 5 KiB queued under a bound of 11 KiB")
	}
	if !p.TryDispatch(Input{Event: four, Redrive: &Redrive{}}) {
		t.Fatal("a redrive weighs nothing, but was refused")
	}
	// Dispatch waits for the bound, not only for room in the queue.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Dispatch(ctx, Input{Event: four}); err == nil {
		t.Fatal("Dispatch queued past the byte bound")
	}
	// What a committed batch held comes back.
	q := p.queues[Partition("a", 2)]
	batch := []Input{<-q, <-q}
	p.released(batch)
	if !p.TryDispatch(Input{Event: four}) {
		t.Fatal("the bound was not given back by the committed batch")
	}
	p.released([]Input{<-q, <-q}) // the redrive, and the last one

	// Heavier than the whole bound: it waits until nothing else is held,
	// then passes alone.
	huge := bigEvent("b", 64<<10)
	if !p.TryDispatch(Input{Event: huge}) {
		t.Fatal("an event heavier than the bound refused with nothing held")
	}
	if p.TryDispatch(Input{Event: bigEvent("c", 10)}) {
		t.Fatal("an event queued beside one that holds the whole bound")
	}
	p.released([]Input{<-p.queues[Partition("b", 2)]})
	if !p.TryDispatch(Input{Event: bigEvent("c", 10)}) {
		t.Fatal("the heavy event's bound was not given back")
	}
}

// TestPartitionsWithoutBytes: no bound, only the queues.
func TestPartitionsWithoutBytes(t *testing.T) {
	p := NewPartitions(nil, PartitionOptions{Count: 1, QueueSize: 3, BatchSize: func() int { return 10 }})
	for i := range 3 {
		if !p.TryDispatch(Input{Event: bigEvent("a", 1<<20)}) {
			t.Fatalf("event %d refused with room in the queue and no byte bound", i)
		}
	}
	if p.TryDispatch(Input{Event: bigEvent("a", 1)}) {
		t.Fatal("queued past the queue's size")
	}
}
