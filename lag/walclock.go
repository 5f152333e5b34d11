package lag

import (
	"sort"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

// walClockSize bounds the samples a WALClock keeps. When full, the older
// half is thinned (every other sample dropped), so the clock always covers
// the whole time since it started, recent history at lag_interval
// resolution and older history coarser.
const walClockSize = 2048

// walSample is the source server's WAL insert position at a server time.
type walSample struct {
	lsn event.LSN
	at  time.Time
}

// WALClock maps a WAL position to the time the source server wrote it, from
// samples of (pg_current_wal_lsn(), clock_timestamp()) taken every
// lag_interval. PostgreSQL's walsender keeps the same kind of table to
// compute pg_stat_replication's lag columns. It answers "when did the WAL
// pass this LSN", which bounds the commit time of the first transaction
// after a watermark without reading the events table.
//
// WALClock is not safe for concurrent use; one reporting goroutine owns it
// at a time.
type WALClock struct {
	samples []walSample // ascending by lsn and time
}

// Observe records that the server's WAL was at lsn at time at. Samples that
// do not move forward in both LSN and time are ignored (a restarted or
// different server starts the clock again when its WAL is behind ours).
func (c *WALClock) Observe(lsn event.LSN, at time.Time) {
	if n := len(c.samples); n > 0 {
		last := c.samples[n-1]
		if lsn < last.lsn {
			c.samples = c.samples[:0] // another timeline: history is void
		} else if lsn == last.lsn || !at.After(last.at) {
			return
		}
	}
	if len(c.samples) == walClockSize {
		half := walClockSize / 2
		kept := c.samples[:0]
		for i, s := range c.samples {
			if i >= half || i%2 == 0 {
				kept = append(kept, s)
			}
		}
		c.samples = kept
	}
	c.samples = append(c.samples, walSample{lsn: lsn, at: at})
}

// Since returns the time of the first sample: how far back the clock sees.
func (c *WALClock) Since() (time.Time, bool) {
	if len(c.samples) == 0 {
		return time.Time{}, false
	}
	return c.samples[0].at, true
}

// TimeAt estimates when the server's WAL passed lsn, interpolating linearly
// between the samples around it. exact is false when lsn is older than
// every sample: the answer is then the first sample's time, which is later
// than the truth. ok is false when there are no samples, or lsn is at or
// beyond the newest one (the WAL has not been seen to pass it).
func (c *WALClock) TimeAt(lsn event.LSN) (at time.Time, exact, ok bool) {
	n := len(c.samples)
	if n == 0 || lsn >= c.samples[n-1].lsn {
		return time.Time{}, false, false
	}
	// First sample strictly beyond lsn.
	i := sort.Search(n, func(i int) bool { return c.samples[i].lsn > lsn })
	if i == 0 {
		return c.samples[0].at, false, true
	}
	lo, hi := c.samples[i-1], c.samples[i]
	frac := float64(lsn-lo.lsn) / float64(hi.lsn-lo.lsn)
	return lo.at.Add(time.Duration(frac * float64(hi.at.Sub(lo.at)))), true, true
}

// Len is the number of samples held.
func (c *WALClock) Len() int { return len(c.samples) }
