package rules

import (
	"testing"

	"github.com/pgscribe/pgscribe/event"
)

// benchEvents is one event of each type the balances rules handle.
func benchEvents() []*event.Event {
	return []*event.Event{
		ev("AccountOpened", map[string]any{"account_id": "a1", "owner": "ann", "initial": int64(100)}),
		ev("Deposited", map[string]any{"account_id": "a1", "amount": int64(25)}),
		ev("Withdrawn", map[string]any{"account_id": "a1", "amount": int64(10)}),
	}
}

// BenchmarkEval evaluates the balances rules over a mix of the three
// event types (open, deposit, withdrawal).
func BenchmarkEval(b *testing.B) {
	p := mustCompile(b, balances())
	events := benchEvents()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := p.Eval(events[i%len(events)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEvalParallel is BenchmarkEval from GOMAXPROCS goroutines.
func BenchmarkEvalParallel(b *testing.B) {
	p := mustCompile(b, balances())
	events := benchEvents()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if _, err := p.Eval(events[i%len(events)]); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
