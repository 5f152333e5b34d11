package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/rules"
)

// hub is a group's shared source during one active period of the group on
// this node: one replication connection on the group's slot, one decode,
// fanned out to the member sessions attached to it. Each member keeps its
// own ledger, partitions, cursors and transactions; the hub hands it every
// transaction that commits at or after the member's next position through
// a bounded queue of its own, and confirms the slot only up to the lowest
// member's watermark.
//
// Joining is exact. A member attaches directly when the stream has not
// started yet, or when the stream has begun no transaction at or after the
// member's position; otherwise it catches up on a slot of its own (a
// building version's backfill slot, or a copy of the group slot) and joins
// at a transaction boundary of that stream where the same condition holds:
// every transaction the hub began commits before the member's position,
// which its own stream delivered, and every later one the hub will deliver.
type hub struct {
	cfg     groupConfig
	ctx     context.Context // the group's active period on this node: shared scans run on it
	scans   sync.WaitGroup  // shared scans running
	log     *slog.Logger
	members int    // configured members on this node
	saver   *saver // the members' watermark saves, together
	// keepAlive sends the stream's standby status when due (set by the
	// stream for holdForJoiners; the stream's goroutine only).
	keepAlive func() error

	mu        sync.Mutex
	attached  map[string]*member      // by member key
	held      map[string]event.LSN    // in-group members not attached: their watermark holds the slot back
	served    map[string]bool         // members this hub's streams ever served: they may have recorded a join
	waiting   map[string]time.Time    // members on a slot of their own asking to join, since when
	slow      map[string]*slowMark    // members detached for holding the others back (deliver)
	streaming bool                    // a stream runs: startLSN and lastBegun are valid
	startLSN  event.LSN               // the stream delivers transactions committing at or after it
	lastBegun event.LSN               // commit LSN of the stream's last transaction begun (0: none)
	txAt      time.Time               // commit time of the transaction being delivered (the stream's goroutine only)
	skew      time.Duration           // this machine's clock less the server's, as of the stream's last message (its goroutine only)
	sent      event.LSN               // the stream sent every transaction below it
	confirmed event.LSN               // the highest position the slot may be confirmed to (what streams sent, or found)
	scan      *sharedScan             // the members' shared backfill, while it gathers or runs
	opening   bool                    // the run loop starts or runs a stream: no scan may start
	expect    map[string]bool         // members that shared the last scan and have not joined or failed: the stream's next start waits for them
	demand    chan struct{}           // a member wants the stream (capacity 1)
	stop      context.CancelCauseFunc // ends the running stream (join: errRestart)
	ended     chan struct{}           // closed when the running stream has ended

	// Used by the stream goroutine only.
	tx        []*member       // members receiving the current transaction
	cur       *event.Event    // the event being delivered
	pend      []*member       // members that have not yet taken cur
	conn      *pgconn.PgConn  // the replication connection of the last stream
	streamCtx context.Context // the current stream's
}

// groupConfig is what the hub needs of the configuration.
type groupConfig struct {
	name         string
	slot         string
	sourceURL    string
	targetURL    string
	schema       string
	leaseTimeout time.Duration
	slowAfter    time.Duration // [engine] slow_member_timeout: how long a member's queue may stay full
	src          replication.Source
	opts         replication.StreamOptions
	full         *config.Config // the whole configuration: what a shared scan reads with
}

// gatherWindow is how long a starting stream waits for the group's
// members to attach, so that a node that starts (or takes the group over)
// decodes once for all of them instead of once and then again for each
// member that came a moment late.
const gatherWindow = 2 * time.Second

// gatherGap ends the gathering early when no member attached for that
// long: members that restart together attach within it.
const gatherGap = 300 * time.Millisecond

// memberQueue is how many messages (begin, event, commit, keepalive) wait
// for one member. A member whose queue is full makes the hub wait (memory
// stays bounded); one that holds the others back that way for
// slow_member_timeout is detached (deliver, errSlowMember).
const memberQueue = 1024

// errSlowMember ends the session of a member the group's stream detached
// because its queue stayed full for slow_member_timeout. The session
// starts again at once (activeSession): the stream has passed it, so it
// catches up on a copy of the group's slot from its own watermark and
// joins again once its own stream reaches the group's.
var errSlowMember = errors.New("detached from the group's stream: its queue stayed full for slow_member_timeout")

// errBehind refuses a join: the stream has passed the member's position.
var errBehind = errors.New("the group's stream is past this position")

// errRestart ends a stream that no member reads when a member behind it
// joins: the next stream starts at the slot's confirmed position, which
// the member's recorded watermark held, so that it joins at once instead
// of catching up on a copy of the slot. For a group of one this is the
// only way back (its slot is the group's: there is nothing to copy).
var errRestart = errors.New("restarting the group's stream for a member behind it that no other member holds back")

// errUnread ends a stream once its last attached member left: a stream
// nobody reads only holds the slot, which a node that took a member's
// lock over must be able to stream (a group of one has no group lock).
// The next member that joins starts it again at the slot's confirmed
// position.
var errUnread = errors.New("no member reads the group's stream")

// quiet says err ends a stream on purpose (errRestart, errUnread): the
// members are not failed and the hub waits for the next to join.
func quiet(err error) bool { return errors.Is(err, errRestart) || errors.Is(err, errUnread) }

// newHub makes the hub of a group; log names the group already.
func newHub(cfg groupConfig, members int, log *slog.Logger) *hub {
	return &hub{cfg: cfg, log: log, members: members, saver: newSaver(cfg.targetURL, cfg.leaseTimeout, log),
		attached: map[string]*member{}, held: map[string]event.LSN{}, served: map[string]bool{}, waiting: map[string]time.Time{},
		slow: map[string]*slowMark{}, expect: map[string]bool{}, demand: make(chan struct{}, 1)}
}

func memberKey(spec rules.Spec) string { return fmt.Sprintf("%s/%d", spec.Name, spec.Version) }

// member is one session attached to the hub.
type member struct {
	key  string
	sink replication.Sink
	next event.LSN // the lowest commit LSN it still needs (under hub.mu)
	ch   chan hubMsg
	done chan struct{} // closed when detached
	once sync.Once
	err  error // why the hub detached it (set before done closes)
	fed  chan error

	// slow measures how long the stream waited for the member while it
	// held the others back (deliver). The stream's goroutine only.
	slow slowWindow

	ownSlot  string     // the member's own slot, "" when its watermark is on the group's
	accepted bool       // the stream serves it (under hub.mu)
	started  chan error // nil once the stream serves it, errBehind if it refused it
}

type msgKind uint8

const (
	msgBegin msgKind = iota
	msgEvent
	msgCommit
	msgIdle
)

type hubMsg struct {
	kind msgKind
	lsn  event.LSN
	at   time.Time
	ev   *event.Event
}

// deliver queues msg for m unless m was detached, waiting while m's queue
// is full. A member holds the group back when the stream waits for it
// while another member's queue runs low (that one waits for the stream).
// Over windows of slowAfter, a member that held the others back for
// 1/slowShare of a window is detached at that moment with
// errSlowMember and the message dropped for it: a member that keeps up only in bursts (its partitions
// take a batch, its queue empties, fills again) is as slow as one that
// never does. A catch-up where every queue is full holds nobody back: the
// group goes at its pace. The stream's goroutine only. An error is ctx's:
// msg was not queued.
func (h *hub) deliver(ctx context.Context, m *member, msg hubMsg) error {
	select {
	case m.ch <- msg:
		return nil
	case <-m.done:
		return nil
	default:
	}
	tick, stop := m.slow.begin(h.cfg.slowAfter)
	defer stop()
	// account says whether m is to be detached: as soon as the window
	// holds its share, not when the window ends (waiting for the end let
	// the others wait 5 s in W7).
	account := func() bool {
		now := time.Now()
		return m.slow.add(now, h.live(msg, now) && h.holdsOthers(m), h.cfg.slowAfter, h.cfg.slowAfter/slowShare)
	}
	for {
		select {
		case m.ch <- msg:
			if tick != nil && account() {
				h.detachSlow(m)
			}
			return nil
		case <-m.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			if account() {
				h.detachSlow(m)
				return nil
			}
		}
	}
}

// live says whether the stream delivers msg live: a transaction committed
// less than a fifth of slow_member_timeout ago (1 s by default), or a
// keepalive. In a catch-up the members' queues fill and drain with their
// batches' commits, and one waiting for another for a moment is not slow:
// W7's catch-up of 8 detached a member 0.4 s after the group started,
// which then decoded the same WAL on a slot of its own (9.5 s against
// 5.2; with the whole timeout as the horizon, still 4 detaches in the
// backlog's last seconds). A member that makes a live stream wait is
// detached long before the stream is that far behind (it waits 100 ms at
// most). The stream's goroutine only.
func (h *hub) live(msg hubMsg, now time.Time) bool {
	return msg.kind == msgIdle || h.txAt.IsZero() || now.Sub(h.txAt)-h.skew < h.cfg.slowAfter/5
}

// holdsOthers says whether another attached member's queue is at most a
// quarter full while the stream waits for m: m holds it back.
func (h *hub) holdsOthers(m *member) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, o := range h.attached {
		if o != m && len(o.ch) <= cap(o.ch)/4 {
			return true
		}
	}
	return false
}

// slowShare: a member that held the others back for 1/slowShare of a
// window of slow_member_timeout (100 ms of 5 s) is detached. Its queue
// (1,024 messages, a second or more of a busy stream) absorbs a member's
// hiccups before it can hold anyone; once it does, every moment the
// stream waits for it delays every event of the others by as much, so
// the share is small. Measured in W7 (8 members, one sleeping 1 ms per
// event at 1,000 events/s; the others' p99 without it 6.1 ms): half a
// window detached at the window's end let the others' p99 reach 1.8 s, a
// tenth detached at once 21.9 ms (two waits of 300 ms).
const slowShare = 50

// slowWindow measures, over windows of slow_member_timeout, how long the
// group's stream (or its scan) waited for a member while the member held
// the others back.
type slowWindow struct {
	from time.Time     // the current window's start
	held time.Duration // how long in it the member held the others back
	last time.Time     // the end of the wait accounted last
}

// begin starts a wait for the member: a new window if there is none yet
// or the last one is stale. It returns the ticker's channel on which
// the waiter accounts (nil without a window: slow_member_timeout 0) and
// what stops the ticker.
func (w *slowWindow) begin(window time.Duration) (<-chan time.Time, func()) {
	if window <= 0 {
		return nil, func() {}
	}
	now := time.Now()
	w.last = now
	if w.from.IsZero() || now.Sub(w.from) > 2*window {
		w.from, w.held = now, 0
	}
	t := time.NewTicker(min(window/10, 100*time.Millisecond))
	return t.C, t.Stop
}

// add accounts the wait since the last call, as held when holding, and
// says whether the window holds limit; a window that passed without
// reaching it starts a new one.
func (w *slowWindow) add(now time.Time, holding bool, window, limit time.Duration) bool {
	if holding {
		w.held += now.Sub(w.last)
	}
	w.last = now
	if w.held >= limit {
		return true
	}
	if now.Sub(w.from) >= window {
		w.from, w.held = now, 0
	}
	return false
}

// slowMark is a member detached for holding the others back: how often,
// and until when it may not join again.
type slowMark struct {
	detaches int
	until    time.Time
}

// slowCooldownMax bounds a slow member's cooldown.
const slowCooldownMax = 5 * time.Minute

// detachSlow detaches a member that held the others back (deliver). It
// may join again after a cooldown of slow_member_timeout, doubled at each
// detach (at most slowCooldownMax): a member that stays slower than the
// group's stream costs the others at most a tenth of a window each time.
func (h *hub) detachSlow(m *member) {
	h.mu.Lock()
	h.unattach(m)
	sm := h.slow[m.key]
	if sm == nil {
		sm = &slowMark{}
		h.slow[m.key] = sm
	}
	sm.detaches++
	cool := min(h.cfg.slowAfter<<min(sm.detaches-1, 16), slowCooldownMax)
	sm.until = time.Now().Add(cool)
	h.mu.Unlock()
	h.log.Warn("a member's queue stayed full: detached from the group's stream so that it does not hold the others; it catches up on a copy of the group's slot and joins again",
		"member", m.key, "slow_member_timeout", h.cfg.slowAfter.String(), "rejoin_after", cool.String(), "detaches", sm.detaches)
	m.detach(errSlowMember)
}

// unattach removes m from the attached members, its ledger's watermark
// holding the slot back from then on (under h.mu).
func (h *hub) unattach(m *member) {
	if h.attached[m.key] != m {
		return
	}
	delete(h.attached, m.key)
	if c := m.sink.Confirmable(); m.accepted && c > h.held[m.key] {
		h.held[m.key] = c
	}
}

func (m *member) detach(err error) {
	m.once.Do(func() {
		m.err = err
		close(m.done)
	})
}

// feed hands the member's queue to its sink until ctx ends or the hub
// detaches it.
func (m *member) feed(ctx context.Context) error {
	var tok uint64
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-m.done:
			return m.err
		case msg := <-m.ch:
			switch msg.kind {
			case msgBegin:
				tok = m.sink.Begin(msg.lsn, msg.at)
			case msgEvent:
				// Each member decodes the documents it needs into its own
				// copy: the decoded event is shared, read only.
				ev := *msg.ev
				if err := m.sink.Event(ctx, tok, &ev); err != nil {
					return err
				}
			case msgCommit:
				m.sink.Commit(tok, msg.lsn)
			case msgIdle:
				m.sink.AdvanceIdle(msg.lsn)
			}
		}
	}
}

// wait blocks until the member's feed ends and returns why.
func (m *member) wait() error { return <-m.fed }

// join attaches a session's sink from position from (it needs every
// transaction committing at or after it). ownSlot is the session's own
// slot when it streams (or would stream) from one, "" for a version whose
// watermark is on the group's slot.
//
// While the group's stream runs, join takes the member only if the stream
// started at or below from and has begun no transaction at or after it;
// otherwise it returns errBehind. boundary says the caller streams its own
// slot and asks at one of its transaction boundaries. Before the stream
// runs, a member is taken provisionally: the stream starts at the group
// slot's confirmed position (or, when there is no group slot and no
// version is recorded on one, at a copy of the lowest provisional
// member's own slot) and then takes or refuses (errBehind) each
// provisional member by the same rule. started tells the member which.
// The feed runs on ctx.
func (h *hub) join(ctx context.Context, spec rules.Spec, sink replication.Sink, from event.LSN, ownSlot string, boundary bool) (*member, error) {
	h.mu.Lock()
	// The slot may already be confirmed past what the member has made
	// durable (its batches in flight): joining then would let a crash lose
	// them, since a restart resumes from the slot's confirmed position.
	durable := sink.Confirmable()
	// A member detached as slow stays away for its cooldown: its own
	// stream reads ahead of what it applies, and joining as soon as that
	// stream reaches the group's would hold the others back again at once.
	cooling := false
	if sm := h.slow[memberKey(spec)]; sm != nil && time.Now().Before(sm.until) {
		cooling = true
	}
	behind := h.streaming && !(h.startLSN <= from && h.lastBegun < from && durable >= h.confirmed)
	if behind && !boundary && ownSlot == "" && h.unread(memberKey(spec)) {
		// Nobody reads the stream: start it again where the slot is.
		stop, ended := h.stop, h.ended
		h.mu.Unlock()
		h.log.Info("restarting the group's stream: a member behind it joins and no other member reads it", "member", memberKey(spec))
		stop(errRestart)
		select {
		case <-ended:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return h.join(ctx, spec, sink, from, ownSlot, boundary)
	}
	if boundary && (!h.streaming || cooling) || behind {
		if _, ok := h.waiting[memberKey(spec)]; boundary && !ok {
			h.waiting[memberKey(spec)] = time.Now()
		}
		h.mu.Unlock()
		h.wake()
		return nil, errBehind
	}
	delete(h.waiting, memberKey(spec))
	delete(h.expect, memberKey(spec))
	m := &member{key: memberKey(spec), sink: sink, next: from, ownSlot: ownSlot, ch: make(chan hubMsg, memberQueue),
		done: make(chan struct{}), fed: make(chan error, 1), started: make(chan error, 1)}
	if old := h.attached[m.key]; old != nil {
		old.detach(errors.New("replaced by a new session of the same version"))
	}
	h.attached[m.key] = m
	if h.streaming {
		m.accepted = true
		h.served[m.key] = true
		m.started <- nil
	}
	h.mu.Unlock()
	h.wake()
	go func() {
		err := m.feed(ctx)
		h.detach(m)
		m.fed <- err
	}()
	return m, nil
}

// unread says no member but key's (a session of it that is going) reads
// the running stream (under h.mu).
func (h *hub) unread(key string) bool {
	for k := range h.attached {
		if k != key {
			return false
		}
	}
	return h.stop != nil
}

// unwait says the member stopped asking to join (its session ended).
func (h *hub) unwait(spec rules.Spec) {
	h.mu.Lock()
	delete(h.waiting, memberKey(spec))
	h.mu.Unlock()
}

// joinPatience is how long a member may ask to join in vain before the
// group's stream waits for it: a stream the engine only just keeps up
// with stays ahead of a member catching up on a slot of its own forever.
// holdMax bounds each wait (the others' latency grows by it meanwhile).
const (
	joinPatience = 5 * time.Second
	holdMax      = 30 * time.Second
)

// holdForJoiners waits, before the stream begins its next transaction,
// while a member has been asking to join for longer than joinPatience
// (holdMax at a time, then joinPatience for the others, and again): the
// member's own stream then reaches the group's and it joins at the next
// boundary.
func (h *hub) holdForJoiners(ctx context.Context) {
	logged := false
	for {
		h.mu.Lock()
		hold := ""
		for k, since := range h.waiting {
			if h.slow[k] != nil {
				continue // the others never wait for a member detached as slow to join
			}
			switch d := time.Since(since); {
			case d >= joinPatience+holdMax:
				h.waiting[k] = time.Now() // let the others go on, then wait again
			case d > joinPatience:
				hold = k
			}
		}
		h.mu.Unlock()
		if hold == "" {
			return
		}
		if !logged {
			h.log.Info("the group's stream waits for a member to catch up and join", "member", hold)
			logged = true
		}
		if h.keepAlive != nil {
			if err := h.keepAlive(); err != nil {
				return // the stream fails at its next read
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func (h *hub) wake() {
	select {
	case h.demand <- struct{}{}:
	default:
	}
}

// detach removes the member from the stream; until its session records a
// final watermark (hold), what its ledger confirms holds the slot back.
func (h *hub) detach(m *member) {
	h.mu.Lock()
	h.unattach(m)
	if len(h.attached) == 0 && h.stop != nil {
		h.stop(errUnread)
	}
	h.mu.Unlock()
	m.detach(context.Canceled)
}

// hold records an in-group member's watermark at the end of its session.
func (h *hub) hold(spec rules.Spec, lsn event.LSN) {
	h.mu.Lock()
	if _, attached := h.attached[memberKey(spec)]; !attached && lsn > h.held[memberKey(spec)] {
		h.held[memberKey(spec)] = lsn
	}
	h.mu.Unlock()
}

// forget drops a member that left the group (it streams from a slot of its
// own now): it no longer holds the group's slot back.
func (h *hub) forget(spec rules.Spec) {
	h.mu.Lock()
	delete(h.held, memberKey(spec))
	delete(h.served, memberKey(spec))
	h.mu.Unlock()
}

// confirmable is the lowest watermark of the group's members: attached
// members' ledgers, and the recorded watermarks of members that are not
// attached. With no member at all, what the stream sent.
func (h *hub) confirmable() event.LSN {
	h.mu.Lock()
	defer h.mu.Unlock()
	var low event.LSN
	first := true
	for _, m := range h.attached {
		if c := m.sink.Confirmable(); first || c < low {
			low, first = c, false
		}
	}
	for _, c := range h.held {
		if first || c < low {
			low, first = c, false
		}
	}
	if first {
		return h.sent
	}
	return low
}

// run serves the group's stream until ctx ends, then, once every member
// session ended (membersDone), confirms the slot to the lowest watermark.
func (h *hub) run(ctx context.Context, membersDone <-chan struct{}) {
	defer func() {
		<-membersDone
		h.scans.Wait()
		if h.conn != nil {
			if err := h.refreshHeld(context.WithoutCancel(ctx)); err != nil {
				h.log.Warn("read the members' watermarks", "err", err)
			}
			if lsn := (*hubSink)(h).Confirmable(); lsn > 0 {
				_ = confirmSlot(context.WithoutCancel(ctx), h.conn, lsn)
			}
			h.conn.Close(context.WithoutCancel(ctx))
		}
	}()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			return
		case <-h.demand:
		}
		if sc := h.scanning(); sc != nil {
			// The members' shared scan holds the group's slot: the
			// stream starts once it let the slot go.
			select {
			case <-sc.done:
			case <-ctx.Done():
				return
			}
		}
		h.gather(ctx, func() int {
			h.mu.Lock()
			defer h.mu.Unlock()
			return len(h.attached)
		})
		h.mu.Lock()
		switch {
		case h.scan != nil:
			// A scan gathered meanwhile: it creates the group's slot,
			// and the stream waits for it to let the slot go.
			h.mu.Unlock()
			h.wake()
			continue
		case len(h.attached) == 0 && len(h.waiting) == 0:
			// Nobody reads the stream or asks to join it (the demand
			// was a member's that has failed since; a member catching
			// up on its own slot waits to join, and needs the stream
			// running to do so): a stream now would create the
			// slot that a scan of the members' resync is about to
			// create: the scan failed with 42710 and both members halted
			// (TestFaultDroppedSlot/member, 3 in 40 runs under CPU load).
			h.mu.Unlock()
			continue
		}
		// From here until the stream ends no scan starts (shareScan).
		h.opening = true
		// The scan's members are waited for at one start only: one that
		// never came (stopped between its backfill and its join) must not
		// delay every later start of the stream.
		clear(h.expect)
		h.mu.Unlock()
		err := h.stream(ctx)
		h.mu.Lock()
		h.opening = false
		h.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if quiet(err) {
			continue // a member that asked is waiting (join), or none reads it
		}
		h.log.Warn("group stream ended; its members restart", "err", err)
		h.failAll(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// gather waits for the configured members to come (count): until all
// have, or none came for gatherGap, or gatherWindow passed. Members that
// shared the group's scan and have not joined yet (expect) are waited
// for up to expectWindow: each joins once its last batches committed.
func (h *hub) gather(ctx context.Context, count func() int) {
	began := time.Now()
	last, seen := began, -1
	for {
		n := count()
		if n >= h.members {
			return
		}
		h.mu.Lock()
		expecting := len(h.expect) > 0
		h.mu.Unlock()
		now := time.Now()
		if n != seen {
			last, seen = now, n
		}
		switch {
		case expecting && now.Sub(began) < expectWindow:
		case now.Sub(began) >= gatherWindow || now.Sub(last) >= gatherGap:
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// expectWindow bounds how long the group's stream waits for the members
// of a shared scan to join: one that comes later catches up on a copy of
// the group's slot.
const expectWindow = 30 * time.Second

// failAll detaches every attached member with err (their sessions end
// with it and restart, or halt, by its class).
func (h *hub) failAll(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.attached {
		h.unattach(m)
		m.detach(err)
	}
}

// refreshHeld reads the watermarks of every version recorded on the group
// slot: those not attached hold the slot back at their recorded position;
// a held version whose row moved to another slot (it left the group) or
// went away (reset, retired) no longer does.
func (h *hub) refreshHeld(ctx context.Context) error {
	rec, err := h.recorded(ctx)
	if err != nil {
		return err
	}
	recorded := make(map[string]event.LSN, len(rec))
	for k, w := range rec {
		recorded[k] = w.lsn
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.held {
		if _, ok := recorded[k]; !ok {
			delete(h.held, k)
		}
	}
	for k, l := range recorded {
		if _, ok := h.attached[k]; ok {
			continue
		}
		if cur, ok := h.held[k]; !ok || l > cur {
			h.held[k] = l
		}
	}
	return nil
}

// recordedWM is a version's watermark row on the group's slot.
type recordedWM struct {
	lsn   event.LSN
	phase string
	point *cursor.BackfillPoint // a backfill's, while one is recorded (cursor.Store.LoadBackfillPoint)
}

// recorded reads the watermarks of every version recorded on the group's
// slot, by member key.
func (h *hub) recorded(ctx context.Context) (map[string]recordedWM, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, h.cfg.targetURL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	rows, err := conn.Query(cctx, `SELECT projection || '/' || version, COALESCE(lsn, '0/0')::text, phase,
  backfill_lsn::text, backfill_upto, coalesce(backfill_after, -9223372036854775808), coalesce(backfill_done, 0), coalesce(backfill_total, 0)
FROM `+pgx.Identifier{h.cfg.schema, "watermarks"}.Sanitize()+` WHERE slot_name = $1`, h.cfg.slot)
	if err != nil {
		return nil, err
	}
	out := map[string]recordedWM{}
	var k, l, phase string
	var pl *string
	var upTo *int64
	var pt cursor.BackfillPoint
	_, err = pgx.ForEachRow(rows, []any{&k, &l, &phase, &pl, &upTo, &pt.After, &pt.Done, &pt.Total}, func() error {
		lsn, err := event.ParseLSN(l)
		if err != nil {
			return err
		}
		w := recordedWM{lsn: lsn, phase: phase}
		if phase == "backfilling" && pl != nil && upTo != nil {
			p := pt
			p.UpTo = *upTo
			if p.LSN, err = event.ParseLSN(*pl); err != nil {
				return err
			}
			w.point = &p
		}
		out[k] = w
		return nil
	})
	return out, err
}

// errGroupSlotLost ends an in-group member's session when the group's
// slot is gone or invalidated: the member resyncs on a slot of its own.
var errGroupSlotLost = errors.New("the group's replication slot is missing or invalidated")

// stream opens the group slot (creating it when no version is recorded on
// it) and streams it to the attached members until ctx ends or it fails.
func (h *hub) stream(ctx context.Context) error {
	if err := h.refreshHeld(ctx); err != nil {
		return atSource(fmt.Errorf("read the members' watermarks: %w", err))
	}
	srcConn, err := pgx.Connect(ctx, h.cfg.sourceURL)
	if err != nil {
		return atSource(fmt.Errorf("connect source: %w", err))
	}
	defer srcConn.Close(context.WithoutCancel(ctx))
	info, err := replication.InspectSlot(ctx, srcConn, h.cfg.slot)
	if err != nil {
		return atSource(err)
	}
	if h.conn != nil {
		h.conn.Close(context.WithoutCancel(ctx))
		h.conn = nil
	}
	if info.Exists && !info.Lost() {
		if err := replication.TerminateSlotHolder(ctx, srcConn, h.cfg.slot); err != nil {
			return atSource(err)
		}
	}
	conn, err := replication.ConnectReplication(ctx, h.cfg.sourceURL)
	if err != nil {
		return atSource(err)
	}
	h.conn = conn
	start := info.Confirmed
	h.mu.Lock()
	// Every version recorded on the slot, and every one this hub served
	// (its record may be on the way): none may lose the slot.
	inGroup := len(h.held)
	for k := range h.served {
		if _, held := h.held[k]; !held {
			inGroup++
		}
	}
	var lowest *member // the provisional member from a slot of its own with the lowest position
	for _, m := range h.attached {
		switch {
		case m.ownSlot == "":
			inGroup++
		case lowest == nil || m.next < lowest.next:
			lowest = m
		}
	}
	h.mu.Unlock()
	if info.Exists && !info.Lost() && inGroup == 0 && lowest != nil && info.Confirmed != lowest.next {
		// No version is recorded on the slot (all were reset, retired or
		// moved, or crashed before recording the join): start it afresh
		// where the members are, so that they all join now, rather than
		// decode WAL kept for nobody or catch up alone.
		if err := replication.DropSlot(ctx, srcConn, h.cfg.slot); err != nil {
			return atSource(err)
		}
		info = replication.SlotInfo{}
	}
	if !info.Exists || info.Lost() {
		if inGroup > 0 {
			h.refuse(start, true)
			return atSlot(fmt.Errorf("%w (slot %s) while %d versions are recorded on it: they resync", errGroupSlotLost, h.cfg.slot, inGroup))
		}
		if info.Lost() {
			if err := replication.DropSlot(ctx, srcConn, h.cfg.slot); err != nil {
				return atSource(err)
			}
		}
		if lowest != nil {
			// Start where the lowest member's own slot is: every
			// provisional member joins now, none catches up alone.
			if start, err = replication.CopySlot(ctx, srcConn, lowest.ownSlot, h.cfg.slot); err != nil {
				return atSource(err)
			}
			h.log.Info("created the group's slot as a copy of a member's", "slot", h.cfg.slot, "from_slot", lowest.ownSlot, "confirmed_lsn", start.String())
		} else {
			if start, err = replication.CreateSlotAt(ctx, conn, h.cfg.slot); err != nil {
				return atSource(err)
			}
			h.log.Info("created the group's slot", "slot", h.cfg.slot, "consistent_lsn", start.String())
		}
	}
	// The refresh ends with the stream (sctx), not with the hub: the
	// stream's end waits for it, and a failed stream must reach the
	// members at once (a refresh bound to the hub's context kept every
	// failed group stream, and its members, waiting until shutdown).
	sctx, cancel := context.WithCancelCause(ctx)
	ended := make(chan struct{})
	h.mu.Lock()
	h.streaming, h.startLSN, h.lastBegun, h.sent = true, start, 0, start
	h.confirmed = max(h.confirmed, info.Confirmed, start)
	h.stop, h.ended = cancel, ended
	h.mu.Unlock()
	h.refuse(start, false)
	defer func() {
		h.mu.Lock()
		h.streaming, h.stop, h.ended = false, nil, nil
		h.mu.Unlock()
		close(ended)
	}()
	h.log.Info("group stream started", "slot", h.cfg.slot, "from", start.String())
	src := h.cfg.src
	src.Slot = h.cfg.slot
	refresh := make(chan struct{})
	go func() {
		defer close(refresh)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if err := h.refreshHeld(sctx); err != nil && sctx.Err() == nil {
					h.log.Warn("read the members' watermarks", "err", err)
				}
			}
		}
	}()
	defer func() { cancel(nil); <-refresh }()
	h.streamCtx = sctx
	err = replication.Stream(sctx, conn, src, (*hubSink)(h), h.cfg.opts)
	if c := context.Cause(sctx); quiet(c) && ctx.Err() == nil {
		h.letGo(ctx)
		return c
	}
	return sourceHalt(atSlot(err))
}

// letGo confirms what the members made durable and closes the connection
// of a stream ended on purpose. A walsender left open and unread holds
// the slot, and holds a server's shutdown for wal_sender_timeout: it
// waits for its client to confirm what it sent (TestFaultServerRestart,
// a group of one whose member left when the server went down: the
// restart took 60 s).
func (h *hub) letGo(ctx context.Context) {
	if h.conn == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if lsn := (*hubSink)(h).Confirmable(); lsn > 0 {
		if err := confirmSlot(cctx, h.conn, lsn); err != nil {
			h.log.Debug("confirm the group's slot as its stream ends", "err", err)
		}
	}
	h.conn.Close(cctx)
	h.conn = nil
}

// refuse settles the provisional members as a stream starts at start:
// those at or above it are served; below it, a member from a slot of its
// own is refused (it catches up there and joins later), and one whose
// watermark is on the group's slot, or every member when all is set, is
// detached: the slot cannot serve it.
func (h *hub) refuse(start event.LSN, all bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k, m := range h.attached {
		if m.accepted {
			continue
		}
		var why error
		switch {
		case !all && m.next >= start:
			m.accepted = true
			h.served[m.key] = true
			m.started <- nil
			continue
		case m.ownSlot != "":
			why = errBehind
		default:
			why = atSlot(errGroupSlotLost)
		}
		m.started <- why
		delete(h.attached, k)
		m.detach(why)
	}
}

// hubSink is the hub as the stream's sink: it fans each transaction out.
type hubSink hub

// SetKeepAlive keeps the stream's standby status going while Begin holds
// the stream for a joiner (holdForJoiners); the stream's goroutine sets it
// at each start, and only that goroutine calls Begin.
func (s *hubSink) SetKeepAlive(keepAlive func() error) { (*hub)(s).keepAlive = keepAlive }

// ServerClock keeps the skew between this machine's clock and the
// server's, which stamps commit times: live reads a commit's age on the
// server's clock, so that a node whose clock is a second off neither
// takes a live stream for a catch-up nor the reverse. The skew includes
// the message's way over the network, a few ms at most.
func (s *hubSink) ServerClock(t time.Time) {
	if !t.IsZero() {
		(*hub)(s).skew = time.Since(t)
	}
}

func (s *hubSink) Begin(commit event.LSN, at time.Time) uint64 {
	h := (*hub)(s)
	if h.streamCtx != nil {
		h.holdForJoiners(h.streamCtx)
	}
	h.txAt = at
	h.mu.Lock()
	h.lastBegun = commit
	h.tx = h.tx[:0]
	for _, m := range h.attached {
		if commit >= m.next {
			h.tx = append(h.tx, m)
		}
	}
	h.mu.Unlock()
	for _, m := range h.tx {
		_ = h.deliver(context.Background(), m, hubMsg{kind: msgBegin, lsn: commit, at: at})
	}
	return 0
}

func (s *hubSink) Event(ctx context.Context, _ uint64, ev *event.Event) error {
	h := (*hub)(s)
	if ev != h.cur {
		h.cur = ev
		h.pend = append(h.pend[:0], h.tx...)
	}
	for len(h.pend) > 0 {
		if err := h.deliver(ctx, h.pend[0], hubMsg{kind: msgEvent, ev: ev}); err != nil {
			return err // offered again: only to the members that have not taken it
		}
		h.pend = h.pend[1:]
	}
	return nil
}

func (s *hubSink) Commit(_ uint64, end event.LSN) {
	h := (*hub)(s)
	for _, m := range h.tx {
		_ = h.deliver(context.Background(), m, hubMsg{kind: msgCommit, lsn: end})
	}
	h.mu.Lock()
	for _, m := range h.tx {
		m.next = end
	}
	if end > h.sent {
		h.sent = end
	}
	h.mu.Unlock()
	h.tx = h.tx[:0]
}

// Confirmable is what the stream confirms to the server: the slot's
// confirmed position is never above the highest value it returned.
func (s *hubSink) Confirmable() event.LSN {
	h := (*hub)(s)
	c := h.confirmable()
	h.mu.Lock()
	h.confirmed = max(h.confirmed, c)
	h.mu.Unlock()
	return c
}

func (s *hubSink) AdvanceIdle(walEnd event.LSN) {
	h := (*hub)(s)
	h.mu.Lock()
	if walEnd > h.sent {
		h.sent = walEnd
	}
	var to []*member
	for _, m := range h.attached {
		if walEnd >= m.next {
			m.next = walEnd
			to = append(to, m)
		}
	}
	h.mu.Unlock()
	for _, m := range to {
		_ = h.deliver(context.Background(), m, hubMsg{kind: msgIdle, lsn: walEnd})
	}
}

// joinSink is the sink of a member streaming on a slot of its own: it
// passes on the transactions committing at or after from, and at each
// transaction boundary tries to join the group's stream; once joined it
// passes on nothing more and ends its stream (cancel), the hub delivering
// from there.
type joinSink struct {
	*ledgerSink
	hub     *hub
	ctx     context.Context // the session's: the member's feed runs on it
	spec    rules.Spec
	ownSlot string
	cancel  context.CancelFunc
	from    event.LSN // transactions committing below it were applied before
	at      event.LSN // the own stream delivered every transaction below it
	skip    bool      // the current transaction commits below from
	m       *member   // set once joined
	next    time.Time // when to try again
}

func (j *joinSink) try() bool {
	if j.m != nil {
		return true
	}
	if time.Now().Before(j.next) {
		return false
	}
	m, err := j.hub.join(j.ctx, j.spec, j.ledgerSink, max(j.at, j.from), j.ownSlot, true)
	if err != nil {
		j.next = time.Now().Add(10 * time.Millisecond)
		return false
	}
	j.m = m
	j.cancel()
	return true
}

func (j *joinSink) Begin(commit event.LSN, at time.Time) uint64 {
	if j.try() {
		return 0
	}
	j.skip = commit < j.from
	if j.skip {
		return 0
	}
	return j.ledgerSink.Begin(commit, at)
}

func (j *joinSink) Event(ctx context.Context, tok uint64, ev *event.Event) error {
	switch {
	case j.m != nil:
		return context.Canceled
	case j.skip:
		return nil
	}
	return j.ledgerSink.Event(ctx, tok, ev)
}

func (j *joinSink) Commit(tok uint64, end event.LSN) {
	if j.m != nil {
		return
	}
	if !j.skip {
		j.ledgerSink.Commit(tok, end)
	}
	j.skip = false
	if end > j.at {
		j.at = end
	}
}

func (j *joinSink) AdvanceIdle(walEnd event.LSN) {
	if j.m != nil {
		return
	}
	if walEnd >= j.from {
		j.ledgerSink.AdvanceIdle(walEnd)
	}
	if walEnd > j.at {
		j.at = walEnd
	}
	j.try()
}
