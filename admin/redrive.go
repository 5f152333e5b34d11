package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/control"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/rules"
)

// This file implements `pgscribe deadletters retry` and `discard`.
//
// A retry is queued in the retry_requests table and run by the node that
// holds the version's lock: it re-evaluates each selected dead letter with
// the rules it runs and applies it through its stream's partition, in
// per-stream position order, each in one transaction with the removal of
// its row and the move of its cursor's count from dead_lettered to applied.
// The command waits for the outcome. With no engine running the version,
// the request stays queued and the next node to run it does it. -dry-run
// evaluates the events with the configured rules here and prints the
// intents; it writes nothing and needs no engine.
//
// A discard deletes the selected rows itself (no engine needed) and moves
// their cursors' counts from dead_lettered to skipped in the same
// transaction, so conservation still holds and every dead_lettered count
// stays a row in the table.

// ErrDiscardNotConfirmed is returned (wrapped) by DiscardDeadLetters
// without Yes: it printed what it would discard and changed nothing.
var ErrDiscardNotConfirmed = errors.New("nothing was discarded: rerun with -yes to discard")

// RetryOptions selects the dead letters to retry.
type RetryOptions struct {
	Filter deadletter.Filter // Projection, Version, IDs, StreamID, ErrorKind
	DryRun bool
	// Skip drops the dead letters instead, through the active node, and
	// releases the streams they parked (`deadletters skip`).
	Skip bool
	// Programs are cfg's compiled rules, in cfg.Projections order (for
	// -dry-run).
	Programs []*rules.Program
	// By says who asked, recorded with the request; empty is the CLI on
	// this node.
	By string
}

// versionsOf lists the projection versions that have dead letters matching
// f, with their counts; when there are none it says so on w.
func versionsOf(ctx context.Context, q deadletter.Querier, schema string, f deadletter.Filter, w io.Writer) ([]deadletter.ProjCount, error) {
	st, err := deadletter.GetStats(ctx, q, schema, f)
	if err != nil {
		return nil, err
	}
	if len(st.ByProjection) == 0 {
		_, err = fmt.Fprintln(w, "no dead letters match")
	}
	return st.ByProjection, err
}

// RetryDeadLetters retries the selected dead letters (see the file
// comment) and writes what became of them to w.
func RetryDeadLetters(ctx context.Context, cfg *config.Config, o RetryOptions, w io.Writer) error {
	return withTarget(ctx, cfg, func(conn *pgx.Conn, schema string) error {
		versions, err := versionsOf(ctx, conn, schema, o.Filter, w)
		if err != nil {
			return err
		}
		for _, v := range versions {
			name := fmt.Sprintf("%s v%d", v.Projection, v.Version)
			prog := programOf(cfg, o.Programs, v.Projection, v.Version)
			if prog == nil {
				fmt.Fprintf(w, "%s: not configured here: its %d dead letter(s) are left alone\n", name, v.Count)
				continue
			}
			f := o.Filter
			f.Projection, f.Version = v.Projection, v.Version
			if o.DryRun && !o.Skip {
				if err := dryRun(ctx, conn, schema, f, prog, w); err != nil {
					return err
				}
				continue
			}
			if err := retryVersion(ctx, conn, cfg, f, o.Skip, v.Count, o.By, w); err != nil {
				return err
			}
		}
		return nil
	})
}

func programOf(cfg *config.Config, progs []*rules.Program, name string, version int64) *rules.Program {
	for i, spec := range cfg.Projections {
		if spec.Name == name && spec.Version == version && i < len(progs) {
			return progs[i]
		}
	}
	return nil
}

func specOf(cfg *config.Config, name string, version int64) (rules.Spec, bool) {
	for _, spec := range cfg.Projections {
		if spec.Name == name && spec.Version == version {
			return spec, true
		}
	}
	return rules.Spec{}, false
}

// ErrWrongCommand is returned (wrapped) when a command does not fit the
// projection version (discard on a parking one).
var ErrWrongCommand = errors.New("wrong command for this projection")

func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrWrongCommand}, args...)...)
}

// retryPoll is how often the command looks whether its request ran.
const retryPoll = 200 * time.Millisecond

func retryVersion(ctx context.Context, conn *pgx.Conn, cfg *config.Config, f deadletter.Filter, skip bool, count int64, by string, w io.Writer) error {
	schema := cfg.Engine.Schema
	if by == "" {
		by = "pgscribe deadletters retry on " + cfg.Engine.Node
	}
	name := fmt.Sprintf("%s v%d", f.Projection, f.Version)
	id, err := control.RequestRetry(ctx, conn, schema, control.Retry{Projection: f.Projection, Version: f.Version,
		IDs: f.IDs, ErrorKind: f.ErrorKind, StreamID: f.StreamID, Skip: skip, RequestedBy: by})
	if err != nil {
		return err
	}
	for {
		r, err := control.LoadRetry(ctx, conn, schema, id)
		if err != nil {
			return err
		}
		if r.DoneAt != nil {
			if r.Error != "" {
				return fmt.Errorf("%s: retry request %d failed: %s", name, id, r.Error)
			}
			if skip {
				_, err := fmt.Fprintf(w, "%s: %d dead letter(s) skipped on node %s (counted as skipped); the streams they parked are released\n",
					name, r.Applied, r.Node)
				return err
			}
			_, err := fmt.Fprintf(w, "%s: %d dead letter(s) retried on node %s: %d applied, %d failed again (kept with their new reason: pgscribe deadletters list -projection %s -version %d)\n",
				name, r.Selected, r.Node, r.Applied, r.Failed, f.Projection, f.Version)
			return err
		}
		pid, err := leader.Holder(ctx, conn, schema, f.Projection, f.Version)
		if err != nil {
			return err
		}
		if pid == 0 {
			_, err := fmt.Fprintf(w, "%s: no engine runs it now: retry request %d (%d dead letter(s)) is queued; the next node to run it does it\n",
				name, id, count)
			return err
		}
		if l, ok, err := leader.Load(ctx, conn, schema, f.Projection, f.Version); err != nil {
			return err
		} else if ok && l.HaltedAt != nil {
			_, err := fmt.Fprintf(w, "%s is halted: retry request %d is queued and runs after pgscribe resume -projection %s -version %d\n",
				name, id, f.Projection, f.Version)
			return err
		}
		st, err := control.Load(ctx, conn, schema, f.Projection, f.Version)
		if err != nil {
			return err
		}
		if st.Paused() {
			_, err := fmt.Fprintf(w, "%s is paused: retry request %d is queued and runs after pgscribe resume -projection %s -version %d\n",
				name, id, f.Projection, f.Version)
			return err
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(w, "%s: stopped waiting: retry request %d stays queued\n", name, id)
			return ctx.Err()
		case <-time.After(retryPoll):
		}
	}
}

// dryRun prints what the rules make of each selected dead letter now.
func dryRun(ctx context.Context, conn *pgx.Conn, schema string, f deadletter.Filter, prog *rules.Program, w io.Writer) error {
	var after deadletter.Row
	for {
		rows, err := deadletter.StreamOrder(ctx, conn, schema, f, after, 500)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			return nil
		}
		for _, r := range rows {
			head := fmt.Sprintf("dead letter %d (%s v%d, stream %s position %d, %s):", r.ID, r.Projection, r.Version,
				cell(r.StreamID), r.StreamPosition, cell(r.EventType))
			intents, err := prog.Eval(r.Event())
			switch {
			case err != nil:
				fmt.Fprintf(w, "%s fails again in the rules: %s\n", head, cell(err.Error()))
			case len(intents) == 0:
				fmt.Fprintf(w, "%s no rule matches now: it would count as skipped\n", head)
			default:
				fmt.Fprintf(w, "%s would write\n", head)
				for _, in := range intents {
					fmt.Fprintf(w, "  rule %s: %s\n", in.Rule, describeIntent(in))
				}
			}
		}
		after = rows[len(rows)-1]
	}
}

// DiscardOptions selects the dead letters to discard.
type DiscardOptions struct {
	Filter deadletter.Filter
	Yes    bool
}

// DiscardDeadLetters drops the selected dead letters (see the file
// comment), or without Yes prints what it would drop.
func DiscardDeadLetters(ctx context.Context, cfg *config.Config, o DiscardOptions, w io.Writer) error {
	return withTarget(ctx, cfg, func(conn *pgx.Conn, schema string) error {
		versions, err := versionsOf(ctx, conn, schema, o.Filter, w)
		if err != nil || len(versions) == 0 {
			return err
		}
		for _, v := range versions {
			// A parked stream waits for its dead letter: dropping the row
			// alone would leave it parked for good.
			if spec, ok := specOf(cfg, v.Projection, v.Version); ok && spec.OnError == rules.OnErrorPark {
				return usageErrorf("%s v%d parks streams (on_error = \"park\"): use pgscribe deadletters skip, which drops the dead letters and releases their streams", v.Projection, v.Version)
			}
		}
		if !o.Yes {
			for _, v := range versions {
				fmt.Fprintf(w, "would discard %d dead letter(s) of %s v%d (counted as skipped in their cursors)\n", v.Count, v.Projection, v.Version)
			}
			return ErrDiscardNotConfirmed
		}
		var gone []deadletter.Discarded
		err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var err error
			if gone, err = deadletter.Discard(ctx, tx, schema, o.Filter); err != nil {
				return err
			}
			for _, d := range gone {
				if err := cursor.Move(ctx, tx, schema, d.Projection, d.Version, d.StreamID, cursor.OutDeadLettered, cursor.OutSkipped, d.Count); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		if len(gone) == 0 {
			_, err := fmt.Fprintln(w, "no dead letters match")
			return err
		}
		type key struct {
			p string
			v int64
		}
		var order []key
		totals := map[key]int64{}
		for _, d := range gone {
			k := key{d.Projection, d.Version}
			if _, ok := totals[k]; !ok {
				order = append(order, k)
			}
			totals[k] += d.Count
		}
		for _, k := range order {
			fmt.Fprintf(w, "discarded %d dead letter(s) of %s v%d (now counted as skipped)\n", totals[k], k.p, k.v)
		}
		return nil
	})
}
