package engine

import (
	"context"
	"time"

	"github.com/pgscribe/pgscribe/lag"
)

// newProbe returns a lag probe of this projection version on its own
// connections. Its measurement history lives in p.metrics, so it carries
// over from standby to active periods and across pipeline restarts.
func (p *Projection) newProbe() *lag.Probe {
	return lag.NewProbe(lag.ProbeConfig{
		SourceURL:  p.cfg.Database.URL,
		TargetURL:  p.cfg.TargetURL(),
		Schema:     p.cfg.Engine.Schema,
		Projection: p.spec.Name,
		Version:    p.spec.Version,
		Slot:       p.slot,
		SlotOf:     p.probeSlot,
		Table:      p.cfg.Source.Table,
		Position:   p.cfg.Source.Columns.Position,
		// The first probe of a process counts the whole events table
		// (about 6 s per 100 M rows); later ones read only its tail.
		Timeout: max(p.cfg.Engine.LagInterval, 5*time.Minute),
		Logger:  p.log,
	}, p.metrics)
}

// probeSlot is the slot the version streams from: its group's or its own.
func (p *Projection) probeSlot() string {
	if p.onGroup.Load() {
		return p.cfg.FeedSlot(p.spec)
	}
	return p.slot
}

// reportLag refreshes the lag metrics and the stored watermark every
// lag_interval while this node is active, busy or idle. The first
// measurement is taken at once, so that a scrape right after a takeover
// already sees numbers from this node.
func (s *session) reportLag(ctx context.Context) {
	probe := s.newProbe()
	defer probe.Close(ctx)
	t := time.NewTicker(s.cfg.Engine.LagInterval)
	defer t.Stop()
	tracker := s.ledger.tracker
	for {
		lsn, wmTime, idle := tracker.Watermark()
		local := &lag.Local{Watermark: lsn, WatermarkTime: wmTime, Idle: idle, Backfilling: s.backfilling.Load()}
		if oldest, ok := tracker.Oldest(); ok {
			local.Oldest = oldest
		}
		// Readiness first: it must not wait for a slow probe (the first
		// one counts the whole events table). The ledger saves the
		// watermark on its own as it moves, and with each measurement.
		s.caught.Store(idle && !local.Backfilling)
		if r, _ := probe.Tick(ctx, local); ctx.Err() == nil {
			s.ledger.measured(r, time.Now())
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reportStandby starts reporting lag from the database while this node is
// not active for the projection (standing by for its lock, or for a free
// max_active_projections slot), so that every node answers "how far
// behind" with the same numbers and pgscribe_active 0. stop ends it and
// waits for it to finish; it is safe to call more than once.
func (p *Projection) reportStandby(ctx context.Context) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		probe := p.newProbe()
		defer probe.Close(ctx)
		t := time.NewTicker(p.cfg.Engine.LagInterval)
		defer t.Stop()
		// A node that gets the lock at once never needs these numbers:
		// give acquire a moment before the first (possibly full-table)
		// count.
		select {
		case <-ctx.Done():
			return
		case <-time.After(min(p.cfg.Engine.LagInterval, time.Second)):
		}
		for {
			_, _ = probe.Tick(ctx, nil)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
