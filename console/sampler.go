package console

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/pgscribe/pgscribe/admin"
)

// sample is one reading of the status.
type sample struct {
	At     time.Time // local clock, when the reading ended
	Took   time.Duration
	Report *admin.StatusReport // nil when Err is set and no reading ever worked
	Err    error
	// CountsAt is when the report's counts were taken (database clock):
	// the events, backlogs, dead letters, parked and adopted events are
	// read every Options.Counts only (admin.StatusCounts), the rest at
	// every reading. CountsTook is what reading them took.
	CountsAt   time.Time
	CountsTook time.Duration
}

// CountsAge is how much older the counts are than the rest of the
// reading (both on the database clock), for people: "0s", "24s".
func (s sample) CountsAge() string {
	if s.Report == nil || s.CountsAt.IsZero() {
		return "–"
	}
	return admin.FormatSeconds(max(s.Report.CheckedAt.Sub(s.CountsAt).Seconds(), 0))
}

// point is one version's numbers of one sample, for the sparklines.
type point struct {
	At        time.Time
	Lag       float64 // seconds; NaN-free: HasLag says whether it is known
	HasLag    bool
	Backlog   int64
	Accounted int64 // events - backlog: its slope is the throughput
	Counted   bool  // the reading counted: Backlog and Accounted are new
}

// history is a ring of the last points of one version.
type history struct {
	pts  []point
	next int
	full bool
}

func (h *history) add(p point) {
	if h.full || len(h.pts) == cap(h.pts) {
		h.pts[h.next] = p
		h.full = true
	} else {
		h.pts = append(h.pts, p)
	}
	h.next = (h.next + 1) % cap(h.pts)
}

// ordered returns the points oldest first.
func (h *history) ordered() []point {
	if !h.full {
		return append([]point(nil), h.pts...)
	}
	return append(append([]point(nil), h.pts[h.next:]...), h.pts[:h.next]...)
}

// sampler reads the status on the console's pools and keeps the last
// reading and each version's history.
type sampler struct {
	s    *Server
	opts Options
	wake chan struct{}

	mu       sync.Mutex
	last     sample
	counts   *admin.StatusCounts // the last counts, reused until due
	counted  time.Time           // local clock, when counts were read
	recount  bool                // read the counts at the next reading (after an action)
	fresh    chan struct{}       // closed and replaced after each reading
	viewed   time.Time
	hist     map[string]*history
	readings int64
}

func newSampler(s *Server, o Options) *sampler {
	return &sampler{s: s, opts: o, wake: make(chan struct{}, 1), fresh: make(chan struct{}), hist: map[string]*history{}}
}

// paceFactor bounds the share of time the sampler spends reading: the
// next reading waits at least paceFactor times the last one's duration.
const paceFactor = 20

func versionKey(projection string, version int64) string {
	return fmt.Sprintf("%s/%d", projection, version)
}

// run reads the status until ctx ends: every Interval while a page was
// viewed in the last minute, every Idle until Sleep after the last view,
// and then (as before the first view) only when a view asks for it.
func (sm *sampler) run(ctx context.Context) {
	for {
		sm.mu.Lock()
		interval := sm.opts.Idle
		if time.Since(sm.viewed) < time.Minute {
			interval = sm.opts.Interval
		}
		// A reading that takes long (one that counted a large table, or
		// many versions) spaces the next ones out, so that the console
		// never keeps the databases busy more than 1/paceFactor of the
		// time; the counts are paced on their own too (countsDue).
		interval = max(interval, paceFactor*sm.last.Took)
		// Every node runs a console by default: unwatched, it must cost
		// the databases nothing.
		asleep := sm.viewed.IsZero() || time.Since(sm.viewed) > sm.opts.Sleep
		sm.mu.Unlock()
		var tick <-chan time.Time
		t := time.NewTimer(interval)
		if !asleep {
			tick = t.C
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-sm.wake:
		case <-tick:
		}
		t.Stop()
		sm.read(ctx)
	}
}

// read takes one reading of the status on pooled connections: the
// counts too when they are due (countsDue).
func (sm *sampler) read(ctx context.Context) {
	start := time.Now()
	sm.mu.Lock()
	counts, recount := sm.counts, sm.countsDue(start)
	sm.recount = false
	sm.mu.Unlock()
	rep, counts, countsTook, err := sm.status(ctx, counts, recount)
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	sm.mu.Lock()
	defer sm.mu.Unlock()
	sm.readings++
	if err != nil {
		sm.last.Err, sm.last.At, sm.last.Took = err, now, now.Sub(start)
		if recount {
			sm.recount = true // try again at the next reading
		}
		sm.s.log.Warn("console: status", "err", err)
	} else {
		if recount {
			sm.counts, sm.counted = counts, start
		} else {
			countsTook = sm.last.CountsTook
		}
		sm.last = sample{At: now, Took: now.Sub(start), Report: rep, CountsAt: counts.At, CountsTook: countsTook}
		for _, p := range rep.Projections {
			k := versionKey(p.Projection, p.Version)
			h := sm.hist[k]
			if h == nil {
				h = &history{pts: make([]point, 0, sm.opts.History)}
				sm.hist[k] = h
			}
			pt := point{At: now, Backlog: p.BacklogEvents, Accounted: rep.Events - p.BacklogEvents, Counted: recount}
			if p.LagSeconds != nil {
				pt.Lag, pt.HasLag = *p.LagSeconds, true
			}
			h.add(pt)
		}
	}
	close(sm.fresh)
	sm.fresh = make(chan struct{})
}

// countsDue says whether a reading at now must read the counts too: there
// are none yet, an action asked, or they are Options.Counts old (and, when
// counting takes long, paceFactor times what it took). Called with mu held.
func (sm *sampler) countsDue(now time.Time) bool {
	return sm.counts == nil || sm.recount || now.Sub(sm.counted) >= max(sm.opts.Counts, paceFactor*sm.last.CountsTook)
}

// status reads the status, with new counts when recount is set (it returns
// them and what they took), else with counts.
func (sm *sampler) status(ctx context.Context, counts *admin.StatusCounts, recount bool) (*admin.StatusReport, *admin.StatusCounts, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	target, err := sm.s.target.Acquire(ctx)
	if err != nil {
		return nil, nil, 0, fmt.Errorf("connect target: %w", err)
	}
	defer target.Release()
	source := target
	if sm.s.source != sm.s.target {
		if source, err = sm.s.source.Acquire(ctx); err != nil {
			return nil, nil, 0, fmt.Errorf("connect source: %w", err)
		}
		defer source.Release()
	}
	var took time.Duration
	if recount {
		start := time.Now()
		if counts, err = admin.ReadStatusCounts(ctx, sm.s.cfg, target.Conn(), source.Conn()); err != nil {
			return nil, nil, 0, err
		}
		took = time.Since(start)
	}
	rep, err := admin.StatusWith(ctx, sm.s.cfg, target.Conn(), source.Conn(), counts)
	return rep, counts, took, err
}

// refresh asks for a reading now, with new counts: an action changed what
// they count.
func (sm *sampler) refresh() {
	sm.mu.Lock()
	sm.recount = true
	sm.mu.Unlock()
	select {
	case sm.wake <- struct{}{}:
	default:
	}
}

// current returns the latest reading for a page view. A view makes the
// sampler read every Interval for the next minute; when the latest
// reading is older than three intervals and than twice its pacing (or
// there is none yet) it asks for a new one and waits for it, at most until
// ctx ends or 5 seconds pass.
func (sm *sampler) current(ctx context.Context) sample {
	sm.mu.Lock()
	sm.viewed = time.Now()
	last, fresh := sm.last, sm.fresh
	sm.mu.Unlock()
	if !last.At.IsZero() && time.Since(last.At) < max(3*sm.opts.Interval, 2*paceFactor*last.Took) {
		return last
	}
	select {
	case sm.wake <- struct{}{}:
	default:
	}
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-fresh:
	case <-ctx.Done():
	case <-t.C:
	}
	sm.mu.Lock()
	defer sm.mu.Unlock()
	return sm.last
}

// points returns a version's history, oldest first.
func (sm *sampler) points(projection string, version int64) []point {
	sm.mu.Lock()
	defer sm.mu.Unlock()
	if h := sm.hist[versionKey(projection, version)]; h != nil {
		return h.ordered()
	}
	return nil
}
