package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/rules"
)

// This file implements `pgscribe reset`: forget how far a projection
// version got, so that its next run rebuilds it from the events table.
//
// Reset drops the version's replication slot (terminating a walsender still
// on it), and deletes its cursors and watermark in one transaction; with
// DeadLetters also its dead letters. It never touches read-model tables:
// the rebuild writes into them as they are, so the operator truncates them
// first, or bumps the version to build into new ones.
//
// Resetting under a running engine would be undone by its next batch, so
// Reset takes the version's advisory lock itself, exactly as an engine
// does (leader.TryAcquire, which also bumps the lease epoch and so fences
// any batch still in flight from a node that lost the lock), and refuses
// with ErrActive when another session holds it. The cursor transaction
// verifies the epoch too. The transaction runs before the slot is dropped:
// if the drop then fails, the next run still rebuilds from scratch (a
// watermark-less version drops a leftover slot itself), and running reset
// again finishes the job.

// ErrNotConfirmed is returned (wrapped) by Reset without Yes: it printed
// what it would do and changed nothing.
var ErrNotConfirmed = errors.New("nothing was changed: rerun with -yes to reset")

// ErrActive is returned (wrapped) by Reset when an engine holds the
// projection version's advisory lock.
var ErrActive = errors.New("refused: an engine runs this projection version")

// ResetOptions selects the projection version to reset.
type ResetOptions struct {
	Projection string
	Version    int64
	// Yes performs the reset; without it Reset prints its plan and returns
	// ErrNotConfirmed.
	Yes bool
	// DeadLetters also deletes the version's dead letters.
	DeadLetters bool
}

// resetPlan is what exists of a projection version, hence what a reset
// removes.
type resetPlan struct {
	name       string
	version    int64
	configured bool
	slot       string
	slotExists bool
	slotPID    int32  // walsender still on the slot
	retained   *int64 // WAL the slot retains
	cursors    cursor.Totals
	watermark  *cursor.Watermark
	dead       int64
}

// Reset resets one projection version (see the file comment) and writes
// what it did, or without o.Yes what it would do, to w. The version need
// not be configured any more: resetting an old version is how its slot stops
// retaining WAL.
func Reset(ctx context.Context, cfg *config.Config, o ResetOptions, w io.Writer) error {
	return withMigrated(ctx, cfg, func(c *conns, schema string) error {

		held, plan, err := lockAndPlan(ctx, cfg, c, "reset", o.Projection, o.Version, o.Yes)
		if held != nil {
			defer held.Release(ctx)
		}
		if err != nil {
			return err
		}
		if plan.empty(o.DeadLetters) {
			_, err := fmt.Fprint(w, plan.text(false, o.DeadLetters))
			return err
		}
		if !o.Yes {
			if _, err := fmt.Fprint(w, plan.text(false, o.DeadLetters)); err != nil {
				return err
			}
			return fmt.Errorf("reset %s v%d: %w", o.Projection, o.Version, ErrNotConfirmed)
		}

		err = pgx.BeginFunc(ctx, c.target, func(tx pgx.Tx) error { return plan.clear(ctx, tx, held, schema, o.DeadLetters) })
		if err != nil {
			return fmt.Errorf("reset %s v%d: %w", o.Projection, o.Version, err)
		}
		if plan.slotExists {
			if err := replication.DropSlot(ctx, c.source, plan.slot); err != nil {
				return fmt.Errorf("reset %s v%d: cursors and watermark deleted, but: %w (run reset again)", o.Projection, o.Version, err)
			}
		}
		if _, err = fmt.Fprint(w, plan.text(true, o.DeadLetters)); err != nil {
			return err
		}
		if err := dropUnusedGroupSlot(ctx, cfg, c, schema, groupOf(cfg, o.Projection, o.Version), w); err != nil {
			return fmt.Errorf("reset %s v%d: cursors and watermark deleted, but: %w (run reset again)", o.Projection, o.Version, err)
		}
		return nil
	})
}

// lockAndPlan takes the version's lock as takeVersion does and then reads
// what exists of it. The lease it returns (with or without an error) is
// the caller's to release.
func lockAndPlan(ctx context.Context, cfg *config.Config, c *conns, command, projection string, version int64, take bool) (*leader.Lease, *resetPlan, error) {
	held, err := takeVersion(ctx, cfg, c, command, projection, version, take)
	if err != nil {
		return held, nil, err
	}
	plan := &resetPlan{name: projection, version: version, slot: cfg.SlotName(rules.Spec{Name: projection, Version: version}),
		configured: slices.ContainsFunc(cfg.Projections, func(s rules.Spec) bool { return s.Name == projection && s.Version == version })}
	return held, plan, plan.load(ctx, c, cfg.Engine.Schema)
}

// clear deletes, in tx, the version's cursors and watermark and with
// deadLetters its dead letters (counted in p.dead), after checking that
// held (nil without a lock) is still the lease.
func (p *resetPlan) clear(ctx context.Context, tx pgx.Tx, held *leader.Lease, schema string, deadLetters bool) error {
	if err := held.Check(ctx, tx); err != nil {
		return err
	}
	if err := cursor.New(schema, p.name, p.version).Reset(ctx, tx); err != nil {
		return err
	}
	// Held events (on_error = "park") are accounted for by the cursors
	// just deleted: a rebuild reads them again, a retired version needs
	// them no more.
	if _, err := deadletter.DeleteParked(ctx, tx, schema, p.name, p.version); err != nil {
		return err
	}
	if deadLetters {
		n, err := deadletter.Delete(ctx, tx, schema, p.name, p.version)
		p.dead = n
		return err
	}
	return nil
}

// takeVersion takes a projection version's advisory lock for command (a
// verb: reset, retire) exactly as an engine does, so that no engine runs it
// while the command changes its state, and returns the lease to release.
// Without take it only verifies that nobody holds the lock and returns nil.
// It returns ErrActive (wrapped) when an engine holds it.
func takeVersion(ctx context.Context, cfg *config.Config, c *conns, command, projection string, version int64, take bool) (*leader.Lease, error) {
	schema := cfg.Engine.Schema
	if take {
		held, err := leader.TryAcquire(ctx, cfg.TargetURL(), schema, projection, version, "pgscribe "+command+" on "+cfg.Engine.Node, cfg.Engine.LeaseTimeout)
		if err != nil || held != nil {
			return held, err
		}
	}
	pid, err := leader.Holder(ctx, c.target, schema, projection, version)
	if err != nil {
		return nil, err
	}
	// Without take nobody may hold it; with take TryAcquire failed, so
	// somebody did a moment ago.
	if pid != 0 || take {
		return nil, activeError(ctx, c.target, schema, command, projection, version, pid)
	}
	return nil, nil
}

// activeError explains which engine holds the lock.
func activeError(ctx context.Context, q event.Querier, schema, command, projection string, version int64, pid int32) error {
	who := "another session"
	if l, ok, err := leader.Load(ctx, q, schema, projection, version); err == nil && ok {
		who = fmt.Sprintf("node %q", l.Node)
	}
	if pid != 0 {
		who += fmt.Sprintf(" (target backend %d)", pid)
	}
	return fmt.Errorf("%s %s v%d: %w: %s holds its advisory lock; stop pgscribe on every node that runs it, then %[1]s "+
		"(under a running engine it is unsafe: its next batch would write cursors again)", command, projection, version, ErrActive, who)
}

func (p *resetPlan) load(ctx context.Context, c *conns, schema string) error {
	var wal string
	if err := c.source.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
  ELSE pg_current_wal_lsn() END::text`).Scan(&wal); err != nil {
		return fmt.Errorf("read source WAL position: %w", err)
	}
	slots, err := loadSlots(ctx, c.source, wal, []string{p.slot})
	if err != nil {
		return err
	}
	if s, ok := slots[p.slot]; ok {
		p.slotExists, p.slotPID, p.retained = true, s.ActivePID, s.retainedBytes
	}
	store := cursor.New(schema, p.name, p.version)
	if p.cursors, err = store.Totals(ctx, c.target); err != nil {
		return err
	}
	wm, ok, err := store.LoadWatermark(ctx, c.target)
	if err != nil {
		return err
	}
	if ok {
		p.watermark = &wm
	}
	st, err := deadletter.GetStats(ctx, c.target, schema, deadletter.Filter{Projection: p.name, Version: p.version})
	if err != nil {
		return err
	}
	p.dead = st.Total
	return nil
}

// empty reports whether there is nothing to reset.
func (p *resetPlan) empty(deadLetters bool) bool {
	return !p.slotExists && p.cursors.Streams == 0 && p.watermark == nil && (!deadLetters || p.dead == 0)
}

// text says what the reset does (done false) or did (done true).
func (p *resetPlan) text(done, deadLetters bool) string {
	var b []byte
	line := func(format string, args ...any) { b = fmt.Appendf(b, format+"\n", args...) }
	tense := func(would, did string) string {
		if done {
			return did
		}
		return would
	}
	if !p.configured {
		line("note: %s v%d is not in the configuration", p.name, p.version)
	}
	if p.empty(deadLetters) {
		line("%s v%d has no slot, cursors or watermark: nothing to reset", p.name, p.version)
		if p.dead > 0 {
			line("it has %d dead letters; -dead-letters deletes them", p.dead)
		}
		return string(b)
	}
	line("%s %s v%d:", tense("reset would change", "reset"), p.name, p.version)
	if p.slotExists {
		s := fmt.Sprintf("  %s replication slot %q", tense("drop", "dropped"), p.slot)
		if p.retained != nil {
			s += fmt.Sprintf(" (it retained %s of WAL)", formatBytes(*p.retained))
		}
		if p.slotPID != 0 {
			s += fmt.Sprintf(", %s its walsender (pid %d)", tense("terminating", "terminated"), p.slotPID)
		}
		line("%s", s)
	} else {
		line("  no replication slot %q to drop", p.slot)
	}
	t := p.cursors
	adopted := ""
	if t.Adopted > 0 {
		adopted = fmt.Sprintf(", %d adopted", t.Adopted)
	}
	line("  %s %d stream cursors (%d events accounted for: %d applied, %d skipped, %d dead-lettered%s)",
		tense("delete", "deleted"), t.Streams, t.Accounted(), t.Applied, t.Skipped, t.DeadLettered, adopted)
	if wm := p.watermark; wm != nil {
		line("  %s the watermark (phase %s, lsn %s)", tense("delete", "deleted"), wm.Phase, wm.LSN)
	}
	switch {
	case deadLetters:
		line("  %s %d dead letters", tense("delete", "deleted"), p.dead)
	case p.dead > 0:
		line("  %s %d dead letters: the rebuild dead-letters the same events again, so they will show twice (-dead-letters deletes them)",
			tense("keep", "kept"), p.dead)
	default:
		line("  no dead letters")
	}
	line("read-model tables are never touched: the next run rebuilds %s v%d from the events table into them as they are,", p.name, p.version)
	line("so truncate them before it starts (or bump the version to build into new tables). Stop every node that runs it first:")
	line("a node standing by takes it over, and starts the rebuild, as soon as reset releases its lock.")
	return string(b)
}
