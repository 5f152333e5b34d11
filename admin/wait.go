package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// This file implements `pgscribe wait`, for deploy scripts: it waits with
// the SQL functions that applications call (wait_for_lsn, wait_for_stream,
// installed by migrate), in slices of at most WaitOptions.Every so that it
// can print a progress line between them.

// ErrWaitTimeout is returned by Wait when the timeout passed first.
var ErrWaitTimeout = errors.New("wait timed out")

// WaitOptions says what Wait waits for: exactly one of CaughtUp, LSN or
// Stream (with Position).
type WaitOptions struct {
	Projection string
	Version    int64
	// CaughtUp waits until every source transaction committed before Wait
	// started is accounted for (wait_for_lsn of the source's
	// pg_current_wal_lsn() at the start).
	CaughtUp bool
	// LSN waits until every source transaction committed at or before it
	// is accounted for ("0/16B3F28").
	LSN string
	// Stream and Position wait until that event is accounted for.
	Stream   string
	Position int64
	// Timeout bounds the wait (default 30s); Every is how often a progress
	// line is written to Progress while waiting (default 1s).
	Timeout  time.Duration
	Every    time.Duration
	Progress io.Writer
}

// Wait blocks until what o names is reached, writing progress lines to
// o.Progress while it waits and one line to w when it is reached: the
// event's outcome (accounted or dead_lettered) for a stream position, else
// "reached" and the LSN. It returns ErrWaitTimeout when the timeout passed
// first, and an error when the projection version is not configured.
func Wait(ctx context.Context, cfg *config.Config, o WaitOptions, w io.Writer) error {
	if !slices.ContainsFunc(cfg.Projections, func(s rules.Spec) bool { return s.Name == o.Projection && s.Version == o.Version }) {
		return fmt.Errorf("projection %s version %d is not in %s", o.Projection, o.Version, cfg.Path)
	}
	if o.Timeout <= 0 {
		o.Timeout = 30 * time.Second
	}
	if o.Every <= 0 {
		o.Every = time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	c, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close(ctx)
	if err := requireMigrated(ctx, c.target, cfg.Engine.Schema); err != nil {
		return err
	}
	started := time.Now()
	deadline := started.Add(o.Timeout)
	if o.CaughtUp {
		// The source's clock of "now": every transaction committed before
		// this point.
		if err := c.source.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&o.LSN); err != nil {
			return fmt.Errorf("read source wal position: %w", err)
		}
	}
	if o.Stream == "" {
		if _, err := event.ParseLSN(o.LSN); err != nil {
			return fmt.Errorf("wait: %w", err)
		}
	}
	schema := pgx.Identifier{cfg.Engine.Schema}.Sanitize()
	for {
		slice := min(time.Until(deadline), o.Every)
		var reached bool
		if o.Stream != "" {
			err = c.target.QueryRow(ctx, "SELECT "+schema+".wait_for_stream($1, $2, $3, $4, $5)",
				o.Projection, o.Version, o.Stream, o.Position, max(slice, 0)).Scan(&reached)
		} else {
			err = c.target.QueryRow(ctx, "SELECT "+schema+".wait_for_lsn($1, $2, $3::pg_lsn, $4)",
				o.Projection, o.Version, o.LSN, max(slice, 0)).Scan(&reached)
		}
		if err != nil {
			return fmt.Errorf("wait: %w", err)
		}
		if reached {
			return waitReached(ctx, c.target, schema, o, time.Since(started), w)
		}
		line, err := waitProgress(ctx, c.target, schema, o)
		if err != nil {
			return err
		}
		fmt.Fprintf(o.Progress, "pgscribe wait: %s v%d: %s (%s of %s)\n", o.Projection, o.Version, line,
			time.Since(started).Round(100*time.Millisecond), o.Timeout)
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%w after %s", ErrWaitTimeout, o.Timeout)
		}
	}
}

// waitReached writes the line of a reached wait.
func waitReached(ctx context.Context, q *pgx.Conn, schema string, o WaitOptions, took time.Duration, w io.Writer) error {
	took = took.Round(time.Millisecond)
	if o.Stream == "" {
		_, err := fmt.Fprintf(w, "reached %s in %s\n", o.LSN, took)
		return err
	}
	var outcome string
	if err := q.QueryRow(ctx, "SELECT "+schema+".event_outcome($1, $2, $3, $4)",
		o.Projection, o.Version, o.Stream, o.Position).Scan(&outcome); err != nil {
		return fmt.Errorf("event outcome: %w", err)
	}
	_, err := fmt.Fprintf(w, "%s in %s\n", outcome, took)
	return err
}

// waitProgress describes where the projection version is, for the
// progress line.
func waitProgress(ctx context.Context, q *pgx.Conn, schema string, o WaitOptions) (string, error) {
	var (
		state   string
		lsn     *string
		backlog *int64
		lagSecs *float64
	)
	err := q.QueryRow(ctx, "SELECT state, watermark_lsn::text, backlog_events, lag_seconds FROM "+schema+
		".progress WHERE projection = $1 AND version = $2", o.Projection, o.Version).Scan(&state, &lsn, &backlog, &lagSecs)
	if errors.Is(err, pgx.ErrNoRows) {
		return "never started", nil
	}
	if err != nil {
		return "", fmt.Errorf("read progress: %w", err)
	}
	line := state
	if o.Stream != "" {
		var at *int64
		if err := q.QueryRow(ctx, "SELECT max(stream_position) FROM "+schema+
			".cursors WHERE projection = $1 AND version = $2 AND stream_id = $3",
			o.Projection, o.Version, o.Stream).Scan(&at); err != nil {
			return "", fmt.Errorf("read cursor: %w", err)
		}
		if at == nil {
			line += fmt.Sprintf(", stream %s not seen yet, want position %d", o.Stream, o.Position)
		} else {
			line += fmt.Sprintf(", stream %s at %d of %d", o.Stream, *at, o.Position)
		}
	} else if lsn != nil {
		line += fmt.Sprintf(", watermark %s of %s", *lsn, o.LSN)
	}
	if backlog != nil {
		line += fmt.Sprintf(", backlog %d", *backlog)
	}
	if lagSecs != nil {
		line += fmt.Sprintf(", lag %.1fs", *lagSecs)
	}
	return line, nil
}
