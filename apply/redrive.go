package apply

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// Redrive marks an Input as a dead letter to apply again (`pgscribe
// deadletters retry`) instead of an event from the source. It goes through
// its stream's partition like any event, so it is ordered with that
// stream's other work, but it commits alone: its writes, the removal of its
// dead-letter row and its cursor's counts (dead_lettered → applied) in one
// transaction. Its Token is not the ledger's: the event was accounted for
// when it was dead-lettered.
type Redrive struct {
	DeadLetterID int64
	// Skip drops the dead letter instead (`deadletters skip`): its row goes,
	// its count moves from dead_lettered to skipped, and a parked stream is
	// released without it.
	Skip bool
	// Done is called from the worker with what became of it.
	Done func(RedriveOutcome)
}

// RedriveOutcome is what a retried dead letter came to.
type RedriveOutcome int

const (
	// RedriveApplied: the writes committed (or no rule matches the event
	// any more: it counts as skipped) and the dead-letter row is gone.
	RedriveApplied RedriveOutcome = iota
	// RedriveFailed: it failed again; the row stays with the new reason.
	RedriveFailed
	// RedriveGone: the row was gone already (retried or discarded meanwhile).
	RedriveGone
)

var errRedriveGone = errors.New("dead letter is gone")

// evalFailure names a rule error as a dead letter does: its error_kind and
// message.
func evalFailure(err error) (kind, message string) {
	kind, message = "rule", err.Error()
	var k interface{ Kind() string }
	if errors.As(err, &k) {
		kind = k.Kind()
	}
	var m interface{ Message() string }
	if errors.As(err, &m) {
		message = m.Message()
	}
	return kind, message
}

// redrive applies one retried dead letter (see Redrive). It returns an
// error only when the session must end (fenced, cancelled, retries of a
// transient failure exhausted); any other failure is recorded on the row.
func (c *Committer) redrive(ctx context.Context, in Input, part *partition) (RedriveOutcome, error) {
	out, err := c.redriveOne(ctx, in)
	if err != nil || out != RedriveApplied || !c.opts.Park {
		return out, err
	}
	// The stream's dead letter is gone: apply what it held, in order.
	part.cursors.forget(in.Event.StreamID)
	return out, c.release(ctx, in.Event.StreamID)
}

func (c *Committer) redriveOne(ctx context.Context, in Input) (RedriveOutcome, error) {
	ev, id := in.Event, in.Redrive.DeadLetterID
	var intents []event.Intent
	if !in.Redrive.Skip {
		var err error
		if intents, err = c.eval.Eval(ev); err != nil {
			kind, msg := evalFailure(err)
			return RedriveFailed, c.refail(ctx, id, kind, msg)
		}
	}
	to := cursor.OutApplied
	if len(intents) == 0 {
		to = cursor.OutSkipped
	}
	retry := c.retryPolicy().Start()
	for {
		err := c.fenced(ctx, func(tx pgx.Tx) error {
			if err := c.execIntents(ctx, tx, intents); err != nil {
				return err
			}
			ok, err := deadletter.Remove(ctx, tx, c.opts.Schema, id)
			if err != nil {
				return err
			}
			if !ok {
				return errRedriveGone
			}
			return cursor.Move(ctx, tx, c.opts.Schema, c.opts.Projection, c.opts.Version, ev.StreamID, cursor.OutDeadLettered, to, 1)
		})
		switch {
		case err == nil:
			return RedriveApplied, nil
		case errors.Is(err, errRedriveGone):
			return RedriveGone, nil
		case errors.Is(err, event.ErrFenced) || ctx.Err() != nil:
			return 0, err
		}
		if sqlstate.Classify(err) == sqlstate.ClassTransient {
			if retry.Exhausted() {
				return 0, fmt.Errorf("retry dead letter %d failed after %d attempts: %w", id, retry.Attempt(), err)
			}
			if err := retry.Wait(ctx, c.log, "transient failure, retrying dead letter", err); err != nil {
				return 0, err
			}
			continue
		}
		// Integrity, structural or a miss: the cause is still there. The
		// dead letter stays, with the new reason, and the projection goes
		// on.
		kind, msg := writeFailure(err)
		return RedriveFailed, c.refail(ctx, id, kind, msg)
	}
}

func (c *Committer) retryPolicy() sqlstate.Policy {
	return sqlstate.Policy{MaxAttempts: c.opts.MaxAttempts, Backoff: c.opts.Backoff, MaxBackoff: c.opts.MaxBackoff}
}

// execIntent runs one intent now.
func (c *Committer) execIntent(ctx context.Context, tx dbtx, in *event.Intent) error {
	pl := &pipeline{}
	if err := c.queueIntent(ctx, tx, pl, in); err != nil {
		return err
	}
	if err := pl.send(ctx, tx); err != nil {
		return err
	}
	if len(pl.missing.dead) > 0 {
		return &missingError{intents: pl.missing.dead}
	}
	return nil
}

// execIntents runs an event's intents in tx, in order.
func (c *Committer) execIntents(ctx context.Context, tx pgx.Tx, intents []event.Intent) error {
	for i := range intents {
		if err := c.execIntent(ctx, tx, &intents[i]); err != nil {
			return fmt.Errorf("rule %s: %w", intents[i].Rule, err)
		}
	}
	return nil
}

// refail records the new reason of a dead letter that failed again.
func (c *Committer) refail(ctx context.Context, id int64, kind, msg string) error {
	return c.withRetry(ctx, func() error {
		return c.fenced(ctx, func(tx pgx.Tx) error { return deadletter.Refail(ctx, tx, c.opts.Schema, id, kind, msg) })
	})
}

// fenced runs fn in a transaction that passed the fence check first.
func (c *Committer) fenced(ctx context.Context, fn func(pgx.Tx) error) error {
	return pgx.BeginFunc(ctx, c.pool, func(tx pgx.Tx) error {
		sql, args := c.fence.CheckStatement()
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return c.fence.CheckFailed(err)
		}
		return fn(tx)
	})
}
