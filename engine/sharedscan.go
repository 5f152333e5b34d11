package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/rules"
)

// A group's members that backfill together share one scan of the group's
// slot: the hub creates the slot with an exported snapshot, reads each
// page of it once and hands the page to every member (its seat), each of
// which applies it in its own transactions with its own cursors and dead
// letters, as the group's stream does. At the end every member is at the
// slot's consistent point, recorded on the group's slot, and the group's
// stream starts there for all of them. Members that start later (a new
// version beside live ones, one that halted and resumed) backfill on a
// slot of their own and join the stream as before.
//
// The scan goes at the pace of its slowest member, as a catch-up of the
// group's stream does (hub.live): a page waits until every member took
// the one before. Memory stays bounded: a page is a quarter of buffer_mb,
// one waits in each member's seat and one is read ahead.

// errNotShared tells a member that asked to share the group's scan that
// it backfills on a slot of its own: a version that is not a member of the
// scan is recorded live on the group's slot (its stream needs the slot as
// it is), or too few members came to share it.
var errNotShared = errors.New("the group's scan is not shared")

// sharedScan is the group's scan while members gather for it and while it
// runs (hub.scan).
type sharedScan struct {
	seats   map[string]*seat
	started bool          // reading: a member that asks now scans alone
	done    chan struct{} // closed once every seat got the last page (or the scan failed)
}

// seat is one member's place at the group's scan.
type seat struct {
	key   string
	start chan scanStart // where the scan starts, or errNotShared (capacity 1)
	pages chan page      // the scan's pages; an empty one after the last, once the slot is free
	gone  chan struct{}  // closed when the member stops taking pages
	begun bool           // start was sent (the scan's goroutine only)
	prog  *rules.Program // the member's rules: what it reads of the documents
	once  sync.Once
	hub   *hub

	// dropped is closed when the scan drops the member for holding the
	// others back (handTo).
	dropped chan struct{}
}

// errSlowSeat ends the backfill of a member the group's scan dropped for
// holding the others back: its session starts again at once
// (activeSession, as after errSlowMember) and backfills on a slot of its
// own, its per-stream cursors skipping what it applied from the scan.
var errSlowSeat = errors.New("dropped from the group's scan: it held the others back on one page for slow_member_timeout")

// scanStart is what a member needs of the scan to record its backfill.
type scanStart struct {
	consistent event.LSN
	total      int64
	snapTime   time.Time
	from       cursor.BackfillPoint // where the scan starts (scanned.from)
	resumed    bool
	err        error
}

// shareScan seats a member that is to backfill at the group's scan: the
// one gathering, or a new one when the group's stream is not running and
// no scan is. nil says the member scans alone (the stream runs, or the
// scan already started).
func (h *hub) shareScan(spec rules.Spec, prog *rules.Program) *seat {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.scan == nil {
		if h.streaming || h.opening || len(h.attached) > 0 {
			return nil
		}
		h.scan = &sharedScan{seats: map[string]*seat{}, done: make(chan struct{})}
		h.scans.Add(1)
		go func(sc *sharedScan) {
			defer h.scans.Done()
			h.runScan(h.runCtx(), sc)
		}(h.scan)
	}
	if h.scan.started {
		return nil
	}
	st := &seat{key: memberKey(spec), prog: prog, start: make(chan scanStart, 1), pages: make(chan page, 1), gone: make(chan struct{}),
		dropped: make(chan struct{}), hub: h}
	if old := h.scan.seats[st.key]; old != nil {
		old.leave()
	}
	h.scan.seats[st.key] = st
	return st
}

// runCtx is the context the hub's scans run on: the group's active period.
func (h *hub) runCtx() context.Context {
	if h.ctx == nil {
		return context.Background()
	}
	return h.ctx
}

// scanning returns the group's scan when one gathers or runs.
func (h *hub) scanning() *sharedScan {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.scan
}

// leave says the member takes no more pages (its session ended, or its
// backfill did).
func (st *seat) leave() {
	st.once.Do(func() { close(st.gone) })
}

// next is the member's next page, its own copy of each event (a member
// decodes the documents it needs into its copy).
func (st *seat) next(ctx context.Context) ([]*event.Event, bool, error) {
	var pg page
	select {
	case pg = <-st.pages:
	case <-st.dropped:
		return nil, false, errSlowSeat
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if pg.err != nil || len(pg.evs) == 0 {
		return nil, false, pg.err // the last page comes once the slot is free
	}
	evs := make([]*event.Event, len(pg.evs))
	for i, ev := range pg.evs {
		c := *ev
		evs[i] = &c
	}
	return evs, true, nil
}

// finish has nothing to wait for: the scan sends its last page once the
// scout has let the slot go.
func (st *seat) finish(context.Context) error { return nil }

// runScan gathers the members for sc, then scans the group's slot for
// them; a failure fails every member's backfill (their sessions restart
// and share the next scan).
func (h *hub) runScan(ctx context.Context, sc *sharedScan) {
	h.gather(ctx, func() int {
		h.mu.Lock()
		defer h.mu.Unlock()
		return len(sc.seats)
	})
	h.mu.Lock()
	sc.started = true
	seats := make([]*seat, 0, len(sc.seats))
	for _, st := range sc.seats {
		seats = append(seats, st)
	}
	h.mu.Unlock()
	err := h.scanFor(ctx, seats)
	h.mu.Lock()
	h.scan = nil
	h.mu.Unlock()
	if err != nil {
		if !errors.Is(err, errNotShared) && ctx.Err() == nil {
			h.log.Warn("the group's scan failed: its members restart", "err", err)
		}
		for _, st := range seats {
			if !st.begun {
				st.start <- scanStart{err: err}
				continue
			}
			select { // the member applies pages: the error comes as one
			case st.pages <- page{err: err}:
			case <-st.gone:
			}
		}
	}
	close(sc.done)
}

// scanFor scans the group's slot for seats (errNotShared: it cannot).
func (h *hub) scanFor(ctx context.Context, seats []*seat) error {
	if len(seats) < 2 {
		return errNotShared
	}
	srcConn, err := pgx.Connect(ctx, h.cfg.sourceURL)
	if err != nil {
		return atSource(fmt.Errorf("connect source: %w", err))
	}
	defer srcConn.Close(context.WithoutCancel(ctx))
	rec, err := h.slotFree(ctx)
	if err != nil {
		return err
	}
	info, err := replication.InspectSlot(ctx, srcConn, h.cfg.slot)
	if err != nil {
		return atSource(err)
	}
	from, resume := resumePoint(rec, seats, info)
	if resume {
		if err := replication.TerminateSlotHolder(ctx, srcConn, h.cfg.slot); err != nil {
			return atSource(err)
		}
	} else if info.Exists {
		// No version streams from it (slotFree): what it kept is for
		// nobody, and the scan needs a new snapshot.
		if err := replication.TerminateSlotHolder(ctx, srcConn, h.cfg.slot); err != nil {
			return atSource(err)
		}
		if err := replication.DropSlot(ctx, srcConn, h.cfg.slot); err != nil {
			return atSource(err)
		}
	}
	replConn, err := replication.ConnectReplication(ctx, h.cfg.sourceURL)
	if err != nil {
		return atSource(err)
	}
	src := h.cfg.src
	src.Slot = h.cfg.slot
	var sc *scan
	if resume {
		sc, err = resumeScan(ctx, h.cfg.full, src, replConn, h.cfg.slot, h.log, from)
	} else {
		sc, err = openScan(ctx, h.cfg.full, src, replConn, h.cfg.slot, h.log, nil)
		from = cursor.BackfillPoint{After: math.MinInt64}
	}
	if err != nil {
		return err
	}
	defer sc.close(ctx)
	from.LSN, from.UpTo, from.Total = sc.consistent, sc.snap.UpTo, sc.total
	if resume {
		h.log.Info("one scan of the group's slot for its members, resumed where every member had accounted for every event",
			"slot", h.cfg.slot, "members", len(seats), "events", sc.total, "after_position", from.After, "events_done", from.Done)
	} else {
		h.log.Info("one scan of the group's slot for its members", "slot", h.cfg.slot, "members", len(seats), "events", sc.total)
	}
	for _, st := range seats {
		st.start <- scanStart{consistent: sc.consistent, total: sc.total, snapTime: sc.snapTime, from: from, resumed: resume}
		st.begun = true
	}
	dec := decoder{seats: seats, wants: map[string][2]event.Want{}}
	if err := eachPage(ctx, sc.next, func(evs []*event.Event) error {
		dec.decode(evs)
		return h.handOut(ctx, seats, page{evs: evs})
	}); err != nil {
		return err
	}
	if err := sc.finish(ctx, srcConn); err != nil {
		return err
	}
	h.mu.Lock()
	for _, st := range seats {
		select {
		case <-st.gone:
		default:
			h.expect[st.key] = true
		}
	}
	h.mu.Unlock()
	return h.handOut(ctx, seats, page{})
}

// handOut gives pg to every seat whose member still takes pages, waiting
// for each (handTo).
func (h *hub) handOut(ctx context.Context, seats []*seat, pg page) error {
	for _, st := range seats {
		if err := h.handTo(ctx, seats, st, pg); err != nil {
			return err
		}
	}
	return nil
}

// handTo gives pg to st once st took the page before it. While the scan
// waits for st and another member has taken every page (it waits for the
// scan), st holds that member back. One that held it back on this one
// page for a whole slow_member_timeout is stuck (a lock wait, a member
// that cannot write) and is dropped from the scan (errSlowSeat): pg is
// not given to it, the others go on, and it backfills again on a slot of
// its own. A member that is merely slower is not dropped, unlike the
// stream's (deliver): in a backfill every member is behind, and a second
// scan competes with the first for the same cores — W10's account
// projection, dropped for holding the counts projection back three
// quarters of a window, took 53 s where the pair scanning together takes
// less (bench/RESULTS.md). An error is ctx's.
func (h *hub) handTo(ctx context.Context, seats []*seat, st *seat, pg page) error {
	select {
	case st.pages <- pg:
		return nil
	case <-st.gone:
		return nil
	default:
	}
	var tick <-chan time.Time // none without a slow_member_timeout
	if h.cfg.slowAfter > 0 {
		t := time.NewTicker(min(h.cfg.slowAfter/10, 100*time.Millisecond))
		defer t.Stop()
		tick = t.C
	}
	var held time.Duration
	last := time.Now()
	for {
		select {
		case st.pages <- pg:
			return nil
		case <-st.gone:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case now := <-tick:
			if othersWait(seats, st) {
				held += now.Sub(last)
			}
			last = now
			if held >= h.cfg.slowAfter {
				h.dropSeat(st)
				return nil
			}
		}
	}
}

// othersWait says whether a member of the scan other than st has taken
// every page handed to it: it waits for the scan, which waits for st.
func othersWait(seats []*seat, st *seat) bool {
	for _, o := range seats {
		if o == st {
			continue
		}
		select {
		case <-o.gone:
			continue
		default:
		}
		if len(o.pages) == 0 {
			return true
		}
	}
	return false
}

// dropSeat drops a member that held the others back from the scan
// (handTo): it takes no more pages, and the stream does not wait for it.
func (h *hub) dropSeat(st *seat) {
	select {
	case <-st.dropped:
		return
	default:
	}
	h.log.Warn("a member held the group's scan back: dropped from it so that it does not hold the others; it backfills on a slot of its own, its cursors skipping what it applied",
		"member", st.key, "slow_member_timeout", h.cfg.slowAfter.String())
	close(st.dropped) // the scan's goroutine only
	st.leave()
}

// slotFree says errNotShared when a version that does not share the scan
// is recorded live on the group's slot: the slot cannot be made anew
// without losing its place. A member of the scan, or a version whose
// backfill was interrupted, has nothing to lose (it backfills again).
func (h *hub) slotFree(ctx context.Context) (map[string]recordedWM, error) {
	rec, err := h.recorded(ctx)
	if err != nil {
		return nil, err
	}
	var live []string
	for k, w := range rec {
		if w.phase == "live" {
			live = append(live, k)
		}
	}
	if len(live) > 0 {
		h.log.Info("the group's slot serves versions that do not share the scan: its members backfill on slots of their own", "slot", h.cfg.slot, "live", live)
		return nil, errNotShared
	}
	return rec, nil
}

// resumePoint says whether the group's scan goes on with an interrupted
// one of the group's slot, and from where: every member at the scan has a
// backfill point recorded on the slot, of the same snapshot (consistent
// point and highest position), and nothing confirmed the slot past that
// point. It resumes where every member had accounted for every event (the
// lowest point); cursors skip what a member applied above it.
func resumePoint(rec map[string]recordedWM, seats []*seat, slot replication.SlotInfo) (cursor.BackfillPoint, bool) {
	if !slot.Exists || slot.Lost() || len(seats) == 0 {
		return cursor.BackfillPoint{}, false
	}
	var from cursor.BackfillPoint
	for i, st := range seats {
		pt := rec[st.key].point
		if pt == nil || pt.LSN != slot.Confirmed {
			return cursor.BackfillPoint{}, false
		}
		if i == 0 {
			from = *pt
			continue
		}
		if pt.UpTo != from.UpTo || pt.Total != from.Total {
			return cursor.BackfillPoint{}, false
		}
		if pt.After < from.After {
			from.After, from.Done = pt.After, pt.Done
		}
	}
	return from, true
}

// decoder decodes each event's documents once for every member of the
// scan: as far as all their rules read (the union of what each would
// decode), so that a member's Eval finds them decoded and reads them
// (read only, shared between the members' copies of the event). A
// document that does not decode is left for each member to fail on,
// as it would alone. Measured (W7, 8 members): decoding in every member
// was a fifth of the engine's CPU.
type decoder struct {
	seats []*seat
	wants map[string][2]event.Want // by event type: data, metadata
}

func (d *decoder) decode(evs []*event.Event) {
	for _, ev := range evs {
		w, ok := d.wants[ev.Type]
		if !ok {
			for _, st := range d.seats {
				if st.prog == nil {
					continue
				}
				data, meta := st.prog.Uses(ev.Type)
				w[0], w[1] = w[0].Union(data), w[1].Union(meta)
			}
			d.wants[ev.Type] = w
		}
		_ = ev.DecodeDocuments(w[0], w[1])
	}
}

// unexpect says a member of the last scan will not join (its backfill
// failed): the stream does not wait for it.
func (h *hub) unexpect(spec rules.Spec) {
	h.mu.Lock()
	delete(h.expect, memberKey(spec))
	h.mu.Unlock()
}
