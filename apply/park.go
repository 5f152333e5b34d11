package apply

import (
	"context"
	"errors"
	"maps"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// on_error = "park": a dead-lettered event parks its stream. The stream's
// later events are held in the parked_events table, in order, and counted
// as parked in its cursor (which advances past them as usual, so a replay
// skips them), instead of being applied; other streams go on. A retry of
// the dead letter, or a skip, releases them in order (redrive.go).
//
// A stream's parked state rides in its cursor (parked_since), so a batch
// knows it from the cursor it reads or caches anyway.

// parkedStreams returns the streams of the batch that are parked, with the
// position that parked them, read from their cursors; nil when the
// projection does not park.
func (c *Committer) parkedStreams(curs map[string]cursor.Cursor) map[string]int64 {
	if !c.opts.Park {
		return nil
	}
	parked := map[string]int64{}
	for id, cur := range curs {
		if cur.Parked {
			parked[id] = cur.ParkedSince
		}
	}
	return parked
}

// parkOf applies the park rule to one event of the batch, taken in order:
// an event after its stream's parking position is held (and reported
// true: not to be applied); a dead-lettered event parks its stream from
// its position when the stream is not parked, or parked only from a later
// position of this batch. The isolated pass finds commit-time failures
// after the rule and pre-check failures are known: a stream parked at a
// rule failure may turn out to have a CHECK violation before it, which
// must park it instead (campaign seeds 7 and 9: parking at the later one
// applied the events in between and dead-lettered the rule failure).
// A park from before the batch is below every event of it that is not a
// duplicate, so it never moves. parked nil (the projection does not park)
// does nothing.
func parkOf(p *planned, parked map[string]int64) bool {
	if parked == nil || p.out == outDuplicate {
		return false
	}
	since, ok := parked[p.ev.StreamID]
	if ok && p.ev.StreamPosition > since {
		p.out, p.intents = outPark, nil
		return true
	}
	if p.out == outDead && (!ok || p.ev.StreamPosition < since) {
		parked[p.ev.StreamID] = p.ev.StreamPosition
	}
	return false
}

// parkPlan applies the park rule to the whole batch once its outcomes are
// known, records newly parked streams in their advances and cursors, and
// returns the events to hold.
func (c *Committer) parkPlan(plan []planned, parked map[string]int64, adv map[string]*cursor.Advance, curs map[string]cursor.Cursor) []deadletter.Row {
	if parked == nil {
		return nil
	}
	var held []deadletter.Row
	for i := range plan {
		p := &plan[i]
		parkOf(p, parked)
		if p.out == outPark {
			held = append(held, deadletter.FromEvent(c.opts.Projection, c.opts.Version, p.ev, "", ""))
		}
	}
	for id, since := range parked {
		cur := curs[id]
		if !cur.Parked {
			cur.Parked, cur.ParkedSince = true, since
			curs[id] = cur
			if a := adv[id]; a != nil {
				a.Parks, a.ParkedSince = true, since
			}
		}
	}
	return held
}

// releasePage is how many held events a release reads at a time.
const releasePage = 200

// release applies the events a stream held, in order, each in a
// transaction of its own with the removal of its parked row and its count
// moved from parked to applied (or skipped), then unparks the stream. A held
// event that fails becomes the stream's dead letter and parks it again
// from there: the rest stay held. It returns an error only when the session
// must end.
func (c *Committer) release(ctx context.Context, stream string) error {
	schema, proj, ver := c.opts.Schema, c.opts.Projection, c.opts.Version
	for {
		rows, err := deadletter.Held(ctx, c.pool, schema, proj, ver, stream, releasePage)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return c.withRetry(ctx, func() error {
				return c.fenced(ctx, func(tx pgx.Tx) error {
					_, err := cursor.Unpark(ctx, tx, schema, proj, ver, stream)
					return err
				})
			})
		}
		for _, r := range rows {
			ok, err := c.releaseOne(ctx, r)
			if err != nil || !ok {
				return err
			}
		}
	}
}

// releaseOne applies one held event; false when it failed and parked the
// stream again.
func (c *Committer) releaseOne(ctx context.Context, r deadletter.Row) (bool, error) {
	schema, proj, ver := c.opts.Schema, c.opts.Projection, c.opts.Version
	ev := r.Event()
	intents, evalErr := c.eval.Eval(ev)
	var kind, msg string
	if evalErr != nil {
		kind, msg = evalFailure(evalErr)
	} else {
		to := cursor.OutApplied
		if len(intents) == 0 {
			to = cursor.OutSkipped
		}
		err := c.withRetry(ctx, func() error {
			return c.fenced(ctx, func(tx pgx.Tx) error {
				if err := c.execIntents(ctx, tx, intents); err != nil {
					return err
				}
				if _, err := deadletter.Unhold(ctx, tx, schema, r); err != nil {
					return err
				}
				return cursor.Move(ctx, tx, schema, proj, ver, r.StreamID, cursor.OutParked, to, 1)
			})
		})
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, event.ErrFenced) || ctx.Err() != nil || sqlstate.Classify(err) == sqlstate.ClassTransient:
			return false, err
		}
		kind, msg = writeFailure(err)
	}
	// It fails again: it becomes the stream's dead letter, which parks the
	// stream from its position.
	return false, c.withRetry(ctx, func() error {
		return c.fenced(ctx, func(tx pgx.Tx) error {
			if _, err := deadletter.Unhold(ctx, tx, schema, r); err != nil {
				return err
			}
			if err := deadletter.Insert(ctx, tx, schema, []deadletter.Row{deadletter.FromEvent(proj, ver, ev, kind, msg)}); err != nil {
				return err
			}
			if err := cursor.Move(ctx, tx, schema, proj, ver, r.StreamID, cursor.OutParked, cursor.OutDeadLettered, 1); err != nil {
				return err
			}
			return cursor.Park(ctx, tx, schema, proj, ver, r.StreamID, r.StreamPosition)
		})
	})
}

// withRetry retries fn through transient failures ([retry] policy).
func (c *Committer) withRetry(ctx context.Context, fn func() error) error {
	return sqlstate.Retry(ctx, c.retryPolicy(), c.log, fn)
}

// parkSavepoint is the savepoint a parking projection's isolated pass runs
// under.
const parkSavepoint = "pgscribe_park"

// isolate is applyIsolated for the batch. Isolation applies the events of
// a stream after one that fails, in order; a parking projection must not,
// so its pass runs under a savepoint: when a failure parks a stream whose
// later events applied, the pass is rolled back and run again with those
// events held. Each rerun holds more events, so it ends; without parking it
// is one pass.
func (c *Committer) isolate(ctx context.Context, tx dbtx, plan []planned, circ circuit, missing *missTally, parked map[string]int64) error {
	if parked == nil {
		return c.applyIsolated(ctx, tx, plan, circ, missing)
	}
	for i := range plan {
		parkOf(&plan[i], parked) // parked before the batch, or by a rule error
	}
	for {
		before := missTally{counts: maps.Clone(missing.counts), dead: missing.dead}
		if _, err := tx.Exec(ctx, "SAVEPOINT "+parkSavepoint); err != nil {
			return err
		}
		if err := c.applyIsolated(ctx, tx, plan, circ, missing); err != nil {
			return err
		}
		rerun := false
		for i := range plan {
			applied := plan[i].out == outApply
			if parkOf(&plan[i], parked) && applied {
				rerun = true
			}
		}
		if !rerun {
			_, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+parkSavepoint)
			return err
		}
		if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+parkSavepoint); err != nil {
			return err
		}
		*missing = before
	}
}
