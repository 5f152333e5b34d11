package lag

import (
	"time"

	"github.com/pgscribe/pgscribe/event"
)

// Local is what the node running a projection knows that the database does
// not yet: its in-memory watermark and the transactions received but not
// yet applied. A standby has no Local.
type Local struct {
	// Watermark and WatermarkTime are the tracker's contiguous watermark and
	// the source commit time of the last transaction below it (zero when it
	// has none, for example right after a backfill).
	Watermark     event.LSN
	WatermarkTime time.Time
	// Idle is true when nothing received is in flight.
	Idle bool
	// Oldest is the commit time of the oldest received transaction not yet
	// fully applied; zero when there is none (backfill pages have none).
	Oldest time.Time
	// Backfilling is true while the snapshot backfill runs.
	Backfilling bool
}

// DBView is what one probe read from PostgreSQL.
type DBView struct {
	// Valid is false when the probe failed: only Local counts then.
	Valid bool
	// Skew is the source server's clock minus this process's clock: ages
	// are measured on the server's clock, which wrote the commit times.
	Skew time.Duration
	// WAL is the source's current WAL position.
	WAL event.LSN
	// Slot: whether it exists, its confirmed_flush_lsn and restart_lsn.
	SlotExists         bool
	Confirmed, Restart event.LSN
	// CommitTS is track_commit_timestamp on the source.
	CommitTS bool
	// Events is count(*) of the events table; Accounted the sum of applied,
	// skipped and dead-lettered over the projection version's cursors.
	// Counted is false when they could not be read.
	Events, Accounted int64
	Counted           bool
	// Stored watermark row (zero values when absent).
	StoredLSN   event.LSN
	StoredTime  time.Time
	StoredPhase string
	// OldestUnaccounted is the smallest commit timestamp of an event
	// committed after the watermark's commit time; OldestRead says whether
	// the probe could read it (track_commit_timestamp on, bounded scan).
	// Read but zero: no such event (they were applied since the count).
	OldestUnaccounted time.Time
	OldestRead        bool
	// LastCommit is the newest cursor update of the version: when its last
	// batch committed, on whichever node.
	LastCommit time.Time
}

// Reading is one lag measurement, as exported in the metrics.
type Reading struct {
	LagSeconds    float64
	LagBytes      int64 // source WAL minus the slot's confirmed_flush_lsn
	RetainedBytes int64 // source WAL minus the slot's restart_lsn
	SlotKnown     bool  // false: LagBytes and RetainedBytes were not read
	Backlog       int64
	BacklogKnown  bool
	Watermark     event.LSN
	WatermarkTime time.Time // source commit time at the watermark; zero = unknown
	LastCommit    time.Time // zero = leave the gauge as it is
}

// compute derives a reading from what the database and the node know. now
// is this process's clock; clock maps WAL positions to server times.
//
// pgscribe_lag_seconds is the age of the oldest committed source event not
// yet applied. The watermark W is contiguous, so that event belongs to the
// first source transaction after W. Three cases, the largest wins:
//
//   - received, not applied (active node): the tracker holds its commit time.
//   - not received (the walsender is still decoding, or this node stands
//     by): the database holds it. With track_commit_timestamp on, the
//     probe reads the oldest commit timestamp after W's commit time, from
//     a bounded tail of the table; otherwise (or when that tail is too
//     long) the WAL clock says when the server's WAL passed W, and the
//     first transaction after W committed after that: the age is an upper
//     bound, at most a lag_interval and the non-event WAL above W too high.
//   - backfill: every snapshot event committed before the slot's
//     consistent point; the time the WAL passed it is a lower bound of
//     their age.
//
// Exactly 0 when the events table holds no event that is not accounted for
// (count of events = applied + skipped + dead_lettered + parked, read in one
// snapshot).
func compute(now time.Time, db DBView, local *Local, clock *WALClock) Reading {
	r := Reading{}
	serverNow := now.Add(db.Skew)
	age := func(t time.Time) float64 { return max(serverNow.Sub(t).Seconds(), 0) }

	r.Watermark = db.StoredLSN
	r.WatermarkTime = db.StoredTime
	if local != nil {
		r.Watermark = max(r.Watermark, local.Watermark)
		if !local.WatermarkTime.IsZero() {
			r.WatermarkTime = local.WatermarkTime
		}
	} else if db.Valid {
		r.LastCommit = db.LastCommit
	}
	r.SlotKnown = db.Valid
	if db.Valid && db.SlotExists {
		r.LagBytes = max(int64(db.WAL)-int64(db.Confirmed), 0)
		r.RetainedBytes = max(int64(db.WAL)-int64(db.Restart), 0)
	}
	if db.Valid && db.Counted {
		r.Backlog = max(db.Events-db.Accounted, 0)
		r.BacklogKnown = true
		if r.Backlog == 0 {
			return r // caught up: nothing committed is unaccounted
		}
	}

	backfilling := db.Valid && db.StoredPhase == "backfilling"
	if local != nil {
		backfilling = local.Backfilling
	}
	lag := 0.0
	if local != nil && !local.Oldest.IsZero() {
		lag = age(local.Oldest)
	}
	unreceived := r.BacklogKnown && r.Backlog > 0 && !backfilling && (local == nil || local.Idle)
	if unreceived {
		switch at, _, ok := clock.TimeAt(r.Watermark); {
		case db.OldestRead:
			if !db.OldestUnaccounted.IsZero() {
				lag = max(lag, age(db.OldestUnaccounted))
			}
		case ok:
			lag = max(lag, age(at))
		}
	}
	if backfilling {
		if at, _, ok := clock.TimeAt(r.Watermark); ok {
			lag = max(lag, age(at))
		} else if since, ok := clock.Since(); ok {
			lag = max(lag, age(since))
		}
	}
	r.LagSeconds = lag
	return r
}
