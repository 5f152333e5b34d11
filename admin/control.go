package admin

import (
	"context"
	"fmt"
	"io"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/control"
	"github.com/pgscribe/pgscribe/leader"
)

// This file implements `pgscribe pause` and `pgscribe resume`. They only
// write the controls table (package control); the node holding the
// version's lock reads it every half second and obeys, and so does any
// node that takes over later.

// ControlOptions selects the projection version of pause and resume.
type ControlOptions struct {
	Projection string
	Version    int64
	Reason     string // pause only
	// By says who paused, shown by status; empty is the CLI on this node.
	By string
}

// Pause pauses a projection version and writes what follows to w.
func Pause(ctx context.Context, cfg *config.Config, o ControlOptions, w io.Writer) error {
	return withTarget(ctx, cfg, func(conn *pgx.Conn, schema string) error {
		by := o.By
		if by == "" {
			by = "pgscribe pause on " + cfg.Engine.Node
		}
		fresh, err := control.Pause(ctx, conn, schema, o.Projection, o.Version, o.Reason, by)
		if err != nil {
			return err
		}
		name := fmt.Sprintf("%s v%d", o.Projection, o.Version)
		if !fresh {
			_, err := fmt.Fprintf(w, "%s was paused already (pgscribe status shows since when and why)\n", name)
			return err
		}
		pid, err := leader.Holder(ctx, conn, schema, o.Projection, o.Version)
		if err != nil {
			return err
		}
		if pid == 0 {
			fmt.Fprintf(w, "paused %s: no engine runs it now; the node that starts it next waits for pgscribe resume\n", name)
		} else {
			fmt.Fprintf(w, "paused %s: its active node stops applying within a second (the batches in flight commit first) and keeps its lock and slot\n", name)
		}
		_, err = fmt.Fprintf(w, "while paused the slot retains WAL on the source (pgscribe status shows how much); resume with: pgscribe resume -projection %s -version %d\n",
			o.Projection, o.Version)
		return err
	})
}

// Resume resumes a paused projection version, or wakes a halted one, and
// writes what follows to w.
func Resume(ctx context.Context, cfg *config.Config, o ControlOptions, w io.Writer) error {
	return withTarget(ctx, cfg, func(conn *pgx.Conn, schema string) error {
		wasPaused, err := control.Resume(ctx, conn, schema, o.Projection, o.Version)
		if err != nil {
			return err
		}
		pid, err := leader.Holder(ctx, conn, schema, o.Projection, o.Version)
		if err != nil {
			return err
		}
		lease, haveLease, err := leader.Load(ctx, conn, schema, o.Projection, o.Version)
		if err != nil {
			return err
		}
		halted := pid != 0 && haveLease && lease.HaltedAt != nil
		name := fmt.Sprintf("%s v%d", o.Projection, o.Version)
		switch {
		case halted:
			_, err = fmt.Fprintf(w, "resumed %s: node %s retries the halted work within a second; if the cause is still there it halts again (pgscribe status)\n", name, lease.Node)
		case wasPaused && pid != 0:
			_, err = fmt.Fprintf(w, "resumed %s: its active node goes on from where it stopped within a second\n", name)
		case wasPaused:
			_, err = fmt.Fprintf(w, "resumed %s: no engine runs it now; the next one to start applies at once\n", name)
		default:
			_, err = fmt.Fprintf(w, "%s was neither paused nor halted: nothing to resume\n", name)
		}
		return err
	})
}
