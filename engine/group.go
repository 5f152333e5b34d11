package engine

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// group runs the configured versions of one group, which share a slot:
// the group's (GroupSlotName) for two or more, the version's own for a
// group of one, which runs the same code. The group is the unit of
// leadership: a node takes the group's lock before any member's, so all
// members run on one node, where they share one stream (hub). Each member
// still takes its own lock and fences its own writes with its own lease
// epoch.
type group struct {
	name    string
	cfg     *config.Config
	members []*Projection
	log     *slog.Logger
	slots   chan struct{} // max_active_projections semaphore (a group takes one); nil = unlimited
}

// groupLockName is the leases-table name of a group's lock. Projection
// names cannot contain ':', so it never names a projection.
func groupLockName(group string) string { return "group:" + group }

func (g *group) hubConfig() groupConfig {
	p := g.members[0]
	return groupConfig{name: g.name, slot: g.cfg.FeedSlot(p.spec), sourceURL: g.cfg.Database.URL,
		targetURL: g.cfg.TargetURL(), schema: g.cfg.Engine.Schema, leaseTimeout: g.cfg.Engine.LeaseTimeout,
		slowAfter: g.cfg.Engine.SlowMemberTimeout, src: p.source(),
		opts: replication.StreamOptions{StatusInterval: g.cfg.Engine.StatusInterval, StallTimeout: g.cfg.Engine.StallTimeout,
			Logger: g.log}, full: g.cfg}
}

// run takes the group's lock, runs every member under it, and stands by
// again when the lock is lost, until ctx ends. A group of one takes no
// group lock: its member's own lock makes it the only reader of its slot,
// and two nodes may then run the versions of one group name that their
// configurations give each alone (a rebuild on a node of its own).
func (g *group) run(ctx context.Context) error {
	restart := sqlstate.Policy{Backoff: time.Second, MaxBackoff: time.Minute}.Start()
	solo := len(g.members) == 1
	for ctx.Err() == nil {
		var lease *leader.Lease
		gctx, cancel := context.WithCancel(ctx)
		if !solo {
			if lease = g.acquire(ctx); lease == nil {
				cancel()
				return nil
			}
			g.log.Info("acquired the group's lock", "epoch", lease.Epoch, "members", len(g.members))
			lost := make(chan error, 1)
			go func() { lost <- lease.Watch(gctx, g.cfg.Engine.LeaseTimeout/3) }()
			go func() {
				if err := <-lost; err != nil {
					g.log.Error("group lock session lost: stopping the group's projections on this node", "err", err)
					cancel()
				}
			}()
		}
		h := newHub(g.hubConfig(), len(g.members), g.log)
		h.ctx = gctx
		membersDone := make(chan struct{})
		hubDone := make(chan struct{})
		go func() { defer close(hubDone); h.run(gctx, membersDone) }()
		// The members' last watermark saves come after gctx ended: the
		// saver serves until they are done.
		svCtx, svCancel := context.WithCancel(context.WithoutCancel(ctx))
		svDone := make(chan struct{})
		go func() { defer close(svDone); h.saver.run(svCtx) }()
		var wg sync.WaitGroup
		for _, p := range g.members {
			p.hub = h
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.Run(gctx); err != nil {
					p.log.Error("projection stopped", "err", err)
				}
			}()
		}
		wg.Wait()
		svCancel()
		<-svDone
		close(membersDone)
		cancel()
		<-hubDone
		if lease != nil {
			lease.Release(context.WithoutCancel(ctx))
			g.releaseSlot()
		}
		if ctx.Err() == nil && restart.Wait(ctx, g.log, "group stopped, taking its lock again", nil) != nil {
			return nil
		}
	}
	return nil
}

func (g *group) releaseSlot() {
	if g.slots != nil {
		<-g.slots
	}
}

// acquire stands by until the group's lock is ours (nil when ctx ended).
// While it waits the members report standby and their lag from the
// database.
func (g *group) acquire(ctx context.Context) *leader.Lease {
	stops := make([]func(), len(g.members))
	for i, p := range g.members {
		p.setState(StateStandby)
		stops[i] = p.reportStandby(ctx)
	}
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	logged, halted := false, false
	for {
		if g.slots != nil {
			select {
			case g.slots <- struct{}{}:
			case <-ctx.Done():
				return nil
			}
		}
		l, err := leader.TryAcquire(ctx, g.cfg.TargetURL(), g.cfg.Engine.Schema, groupLockName(g.name), 0, g.cfg.Engine.Node, g.cfg.Engine.LeaseTimeout)
		if err == nil && halted {
			// As a projection alone says it (Projection.acquire): every
			// member halted at the lock says the fault cleared.
			halted = false
			for _, p := range g.members {
				p.log.Info("lock fault cleared: resuming", "stage", stageLock)
				p.setState(StateStandby)
			}
		}
		if l != nil {
			return l
		}
		g.releaseSlot()
		switch {
		case err != nil && ctx.Err() == nil:
			was := halted
			for _, p := range g.members {
				halted = p.lockFault(err, was) || halted
			}
		case err == nil && !logged:
			g.log.Info("standing by: another node holds the group's lock")
			logged = true
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(g.cfg.Engine.StandbyPoll):
		}
	}
}
