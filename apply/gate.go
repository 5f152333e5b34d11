package apply

import (
	"context"
	"sync"
)

// gate holds the partition workers between batches while closed (a paused
// backfill): an in-flight batch commits, the next one waits.
type gate struct {
	mu   sync.Mutex
	open chan struct{} // nil while open; closed when the gate opens again
}

// Hold closes (on) or opens the gate of every worker. Workers finish the
// batch in flight and take no other until it opens.
func (p *Partitions) Hold(on bool) {
	g := &p.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case on && g.open == nil:
		g.open = make(chan struct{})
	case !on && g.open != nil:
		close(g.open)
		g.open = nil
	}
}

// pass waits while the gate is closed; false when ctx or stop ended the
// wait.
func (g *gate) pass(ctx context.Context, stop <-chan struct{}) bool {
	g.mu.Lock()
	ch := g.open
	g.mu.Unlock()
	if ch == nil {
		return true
	}
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	case <-stop:
		return false
	}
}
