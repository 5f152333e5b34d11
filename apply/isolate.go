package apply

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// Isolation: a batch whose writes failed an integrity check (class 22 or
// 23) is applied again inside one transaction, split into segments of
// events, each segment under a savepoint and written with the same
// multi-row statements as a clean batch. A segment that fails is rolled
// back to its savepoint and split in two; a single event that fails is the
// offending event and is dead-lettered. For k offending events among n that
// is O(k·log n) segment attempts instead of n savepoint round trips, and the
// good events keep their multi-row statements.
//
// Segments run left to right, each after the previous one's writes, so
// every event sees the events before it applied exactly as in a sequential
// replay, and events of a stream after a dead-lettered one still apply, in
// order. An event is always wholly inside one segment: its intents apply
// all or none.

// segmentSavepoint is the savepoint a segment attempt runs under.
const segmentSavepoint = "pgscribe_segment"

// isolation is one isolated pass over a batch.
type isolation struct {
	c    *Committer
	tx   dbtx
	plan []planned
	// circ counts consecutive failures to stop early on a schema
	// mismatch; the batch's circuit is counted afterwards (walkCircuit).
	circ circuit
	// missing collects the misses of the segments that applied.
	missing *missTally
	// open: the savepoint is established and nothing ran since (a failed
	// attempt rolled back to it), so the next attempt reuses it.
	open bool
	// applied counts events whose writes applied, failed those
	// dead-lettered for an integrity failure, attempts the segment
	// attempts made (one round trip each, two when they fail).
	applied, failed, attempts int
}

// applyIsolated finds the events of plan whose writes fail an integrity
// check and marks them dead-lettered (kind commit:<SQLSTATE> (<name>));
// the writes of every other event are applied in tx. It halts early when
// the failures alone trip circ (a copy of the partition's circuit).
// Updates and deletes of applied segments that matched no row are added
// to missing; one of an if_missing = "dead_letter" rule fails the pass with
// a *missingError, as in the pipelined path.
func (c *Committer) applyIsolated(ctx context.Context, tx dbtx, plan []planned, circ circuit, missing *missTally) error {
	var seg []int
	for i := range plan {
		if plan[i].out == outApply {
			seg = append(seg, i)
		}
	}
	// The pass's row locks first, for all of its segments: each segment
	// takes its own in order, but the segments write one after the other.
	var intents []*event.Intent
	var streams []string
	for _, i := range seg {
		for j := range plan[i].intents {
			intents = append(intents, &plan[i].intents[j])
			streams = append(streams, plan[i].ev.StreamID)
		}
	}
	if pl := (&pipeline{}); lockRows(pl, intents, streams) {
		if err := pl.send(ctx, tx); err != nil {
			return err
		}
	}
	s := &isolation{c: c, tx: tx, plan: plan, circ: circ, missing: missing}
	_, err := s.run(ctx, seg, false)
	c.obs.Isolation(s.attempts)
	c.log.Info("isolated batch", "events", len(plan), "attempts", s.attempts, "applied", s.applied, "failed", s.failed)
	return err
}

// run applies the events seg (indexes into plan, in order) and reports
// whether all of them applied. knownBad says a failure is expected in seg
// (its enclosing segment failed and the left half applied): a segment of
// several events is then split without being tried whole.
func (s *isolation) run(ctx context.Context, seg []int, knownBad bool) (clean bool, err error) {
	if len(seg) == 0 {
		return true, nil
	}
	if !knownBad || len(seg) == 1 {
		failure, err := s.try(ctx, seg)
		if err != nil {
			return false, err
		}
		if failure == nil {
			s.applied += len(seg)
			s.circ.state, s.circ.count = "", 0
			return true, nil
		}
		if len(seg) == 1 {
			return false, s.dead(seg[0], failure)
		}
	}
	mid := len(seg) / 2
	leftClean, err := s.run(ctx, seg[:mid], false)
	if err != nil {
		return false, err
	}
	// If the left half applied, the failure is in the right half (unless
	// it came from how the two halves' statements met; trying the right
	// half's halves then finds no failure, which is fine).
	_, err = s.run(ctx, seg[mid:], leftClean)
	return false, err
}

// try runs one segment attempt under a savepoint. An integrity failure is
// returned as failure, with the savepoint rolled back; any other failure
// as err.
func (s *isolation) try(ctx context.Context, seg []int) (failure, err error) {
	s.attempts++
	pl := &pipeline{}
	if !s.open {
		pl.exec("SAVEPOINT "+segmentSavepoint, "")
	}
	s.open = false
	if len(seg) == 1 {
		// One event: a statement per intent, so that a failure names
		// its rule.
		p := &s.plan[seg[0]]
		for j := range p.intents {
			in := &p.intents[j]
			n := len(pl.reads)
			if err := s.c.queueIntent(ctx, s.tx, pl, in); err != nil {
				return nil, err
			}
			for k := n; k < len(pl.reads); k++ {
				read := pl.reads[k]
				pl.reads[k] = func(br pgx.BatchResults) error {
					if err := read(br); err != nil {
						return fmt.Errorf("rule %s: %w", in.Rule, err)
					}
					return nil
				}
			}
		}
	} else {
		var intents []*event.Intent
		for _, i := range seg {
			for j := range s.plan[i].intents {
				intents = append(intents, &s.plan[i].intents[j])
			}
		}
		if err := s.c.queueWrites(ctx, s.tx, pl, intents, nil, true); err != nil {
			return nil, err
		}
	}
	pl.exec("RELEASE SAVEPOINT "+segmentSavepoint, "")
	err = pl.send(ctx, s.tx)
	if err == nil {
		if len(pl.missing.dead) > 0 {
			return nil, &missingError{intents: pl.missing.dead}
		}
		for rule, n := range pl.missing.counts {
			if s.missing.counts == nil {
				s.missing.counts = map[string]int{}
			}
			s.missing.counts[rule] += n
		}
		return nil, nil
	}
	var halt *HaltError
	if errors.As(err, &halt) || sqlstate.Classify(err) != sqlstate.ClassIntegrity {
		return nil, err
	}
	// Without arguments Exec takes the simple protocol: an aborted
	// transaction refuses to prepare statements, even this one.
	if _, err := s.tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+segmentSavepoint); err != nil {
		return nil, err
	}
	s.open = true
	return err, nil
}

// dead marks plan[i] dead-lettered for failure and counts it on the
// circuit, which halts the batch once it trips.
func (s *isolation) dead(i int, failure error) error {
	s.failed++
	state := sqlstate.Code(failure)
	if s.circ.state == state {
		s.circ.count++
	} else {
		s.circ.state, s.circ.count = state, 1
	}
	if s.circ.count >= s.c.opts.CircuitThreshold {
		return s.c.halt(fmt.Sprintf("circuit open: %d consecutive events failed with the same integrity error (schema mismatch?)", s.circ.count), failure)
	}
	s.c.markFailed(&s.plan[i], failure)
	return nil
}
