package lag

import (
	"math"
	"time"
)

// recountEvery forces a full count of the events table now and then, so
// that a count the floor logic got wrong (see tailCounter) heals by itself.
const recountEvery = time.Hour

// floorHistory bounds the remembered floors used to limit the commit
// timestamp scan (one per promotion, at most one per lag_interval).
const floorHistory = 1024

// tailCounter counts the rows of an append-only events table without
// scanning it every time: count = below + count(position > floor), where
// below is the number of rows at or below floor, counted once and then
// never again. The floor only moves over rows that can no longer change:
//
//  1. At sample t it notes cand = max(position) visible then. Positions
//     come from a sequence, so every position <= cand was handed out
//     before sample t.
//  2. At the next sample it notes arm = the snapshot's xmax: every
//     transaction that had an xid by then is below arm. A transaction that
//     took a position before sample t has an xid one lag_interval later
//     (the INSERT that uses the position assigns it).
//  3. At a later sample whose snapshot xmin >= arm, all those transactions
//     have ended: no row at or below cand can still appear. The count of
//     (floor, cand] read in that same snapshot is final, so floor = cand.
//
// The assumption is a sequence with CACHE 1 (bigserial's default) feeding
// position. Positions set by hand, a cached sequence or deletes from the
// table break it; a negative backlog or the hourly recount repairs it.
//
// Not safe for concurrent use.
type tailCounter struct {
	floor     int64 // rows at or below floor are counted in below
	below     int64
	haveFloor bool
	cands     []tailCand
	lastFull  time.Time
	floors    []floorAt // promotions: events committed after at have position > floor
}

type tailCand struct {
	pos int64
	arm uint64 // snapshot xmax one sample later; 0 = not armed yet
}

type floorAt struct {
	at    time.Time
	floor int64
}

// query returns the parameters of the next count: count rows above floor,
// and among them those at or below cand. Without a floor (first count,
// recount) floor is math.MinInt64.
func (c *tailCounter) query(now time.Time) (floor, cand int64) {
	if !c.haveFloor || now.Sub(c.lastFull) >= recountEvery {
		c.reset()
	}
	floor = math.MinInt64
	if c.haveFloor {
		floor = c.floor
	}
	cand = floor
	if len(c.cands) > 0 && c.cands[0].arm != 0 {
		cand = c.cands[0].pos
	}
	return floor, cand
}

// tailSample is what one count query saw, all in one snapshot.
type tailSample struct {
	floor, cand int64 // as passed to the query
	above       int64 // rows with position > floor
	upToCand    int64 // rows with floor < position <= cand
	maxPos      int64 // max(position), 0 when the table is empty
	empty       bool
	xmin, xmax  uint64 // pg_current_snapshot()
	at          time.Time
}

// total folds a sample in and returns the number of rows. The sample must
// answer the parameters the last query call returned.
func (c *tailCounter) total(s tailSample) int64 {
	if s.floor == math.MinInt64 {
		c.floor, c.below, c.haveFloor = math.MinInt64, 0, true
		c.lastFull = s.at
	}
	n := c.below + s.above
	// Promote the oldest armed candidate if every transaction that could
	// still hold a position at or below it has ended.
	if len(c.cands) > 0 && c.cands[0].arm != 0 && s.cand == c.cands[0].pos && s.xmin >= c.cands[0].arm {
		if s.cand > c.floor {
			c.below += s.upToCand
			c.floor = s.cand
			// Only from this sample on is every row at or below cand
			// final: a transaction holding such a position may have
			// committed until just before it.
			c.floors = append(c.floors, floorAt{at: s.at, floor: s.cand})
			if len(c.floors) > floorHistory {
				c.floors = append(c.floors[:0:0], c.floors[len(c.floors)-floorHistory/2:]...)
			}
		}
		c.cands = c.cands[1:]
	}
	// Arm the candidates taken before this sample.
	for i := range c.cands {
		if c.cands[i].arm == 0 {
			c.cands[i].arm = s.xmax
		}
	}
	if !s.empty && s.maxPos > c.floor && (len(c.cands) == 0 || s.maxPos > c.cands[len(c.cands)-1].pos) {
		c.cands = append(c.cands, tailCand{pos: s.maxPos})
	}
	return n
}

// reset forgets the floor: the next count reads the whole table.
func (c *tailCounter) reset() {
	c.haveFloor = false
	c.floor, c.below = math.MinInt64, 0
	c.cands = nil
	c.floors = nil
}

// floorFor returns a position below every event committed after t: the
// floor promoted at the latest time not after t. ok is false when no floor
// is that old.
func (c *tailCounter) floorFor(t time.Time) (int64, bool) {
	for i := len(c.floors) - 1; i >= 0; i-- {
		if !c.floors[i].at.After(t) {
			return c.floors[i].floor, true
		}
	}
	return 0, false
}
