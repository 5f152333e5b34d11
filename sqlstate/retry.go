package sqlstate

import (
	"context"
	"log/slog"
	"time"
)

// Policy is how an operation is retried after a transient failure: waits
// double from Backoff up to MaxBackoff, for at most MaxAttempts attempts
// (0 = unbounded).
type Policy struct {
	MaxAttempts         int
	Backoff, MaxBackoff time.Duration
}

// Backoff counts one operation's attempts and paces them. Not safe for
// concurrent use.
type Backoff struct {
	p       Policy
	attempt int
	wait    time.Duration
}

// Start begins the first attempt of an operation.
func (p Policy) Start() *Backoff { return &Backoff{p: p, attempt: 1, wait: p.Backoff} }

// Attempt is the number of the current attempt, from 1.
func (b *Backoff) Attempt() int { return b.attempt }

// Delay is the wait before the next attempt.
func (b *Backoff) Delay() time.Duration { return b.wait }

// Exhausted reports whether the current attempt was the last one allowed.
func (b *Backoff) Exhausted() bool { return b.p.MaxAttempts > 0 && b.attempt >= b.p.MaxAttempts }

// Reset starts over from the first attempt and the shortest wait, after
// the operation made progress.
func (b *Backoff) Reset() { b.attempt, b.wait = 1, b.p.Backoff }

// Wait logs msg with the failure err of the current attempt, sleeps the
// backoff and moves to the next attempt. It returns ctx.Err() when ctx
// ends first: cancellation is a shutdown, not something to retry.
func (b *Backoff) Wait(ctx context.Context, log *slog.Logger, msg string, err error) error {
	log.Warn(msg, "attempt", b.attempt, "sqlstate", Code(err), "backoff", b.wait, "err", err)
	t := time.NewTimer(b.wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
	}
	b.attempt++
	b.wait = min(2*b.wait, b.p.MaxBackoff)
	return nil
}

// Retry runs op until it succeeds, fails with an error that is not
// transient, ctx ends, or the policy's attempts are used up, and returns
// op's last error (or ctx's while waiting). Each retry is logged. op must
// be safe to run again.
func Retry(ctx context.Context, p Policy, log *slog.Logger, op func() error) error {
	b := p.Start()
	for {
		err := op()
		if err == nil || ctx.Err() != nil || Classify(err) != ClassTransient || b.Exhausted() {
			return err
		}
		if err := b.Wait(ctx, log, "transient failure, retrying", err); err != nil {
			return err
		}
	}
}
