package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/rules"
)

// This file implements `pgscribe retire`: remove a projection version that
// no longer serves, so that nothing of it stays behind: its replication
// slot (which would retain WAL forever), cursors, watermark, dead letters
// (they describe events of a read model nobody reads; the events
// themselves stay in the events table, and the served version has its
// own), lease row and read-model DDL record, and with DropSchema its
// schema and every table in it.
//
// Retire refuses the served version (promote another first) and, like
// reset, takes the version's advisory lock itself, so it refuses while an
// engine runs the version (stop it, or remove it from the configuration and
// restart, first). Everything but the slot goes in one transaction that
// verifies the lease epoch; the slot is dropped after it commits, and if
// that fails, running retire again finishes the job.

// RetireOptions selects the version to retire.
type RetireOptions struct {
	Projection string
	Version    int64
	// DropSchema also drops the version's schema (DROP SCHEMA … CASCADE),
	// refused when an object outside the schema depends on one in it.
	DropSchema bool
}

// Retire retires one projection version (see the file comment) and writes
// what it removed to w. The version need not be configured: its schema is
// then the one `pgscribe migrate` recorded for it. It returns ErrRefused
// (wrapped) for the served version and ErrActive (wrapped) while an engine
// runs it.
func Retire(ctx context.Context, cfg *config.Config, o RetireOptions, w io.Writer) error {
	return withMigrated(ctx, cfg, func(c *conns, schema string) error {
		fail := func(err error) error { return fmt.Errorf("retire %s v%d: %w", o.Projection, o.Version, err) }
		served, err := loadServed(ctx, c.target, schema)
		if err != nil {
			return err
		}
		if s, ok := served[o.Projection]; ok && s.Version == o.Version {
			return fail(fmt.Errorf("%w: it is the served version (in schema %s); promote another version first", ErrRefused, s.ServeSchema))
		}
		versionSchema, err := retireSchema(ctx, c.target, cfg, schema, o)
		if err != nil {
			return err
		}
		if o.DropSchema {
			if versionSchema == "" {
				return fail(fmt.Errorf("%w: -drop-schema, but the version has no schema of its own (none configured, none recorded by migrate)", ErrRefused))
			}
			if slices.ContainsFunc(cfg.Projections, func(s rules.Spec) bool {
				return s.Schema == versionSchema && !(s.Name == o.Projection && s.Version == o.Version)
			}) {
				return fail(fmt.Errorf("%w: schema %s is configured for another projection version", ErrRefused, versionSchema))
			}
			deps, err := dependentsOutside(ctx, c.target, versionSchema)
			if err != nil {
				return err
			}
			if len(deps) > 0 {
				return fail(fmt.Errorf("%w: objects outside schema %s depend on it: %s (promote the version that should serve, or drop them)",
					ErrRefused, versionSchema, strings.Join(deps, ", ")))
			}
		}

		held, plan, err := lockAndPlan(ctx, cfg, c, "retire", o.Projection, o.Version, true)
		if held != nil {
			defer held.Release(ctx)
		}
		if err != nil {
			return err
		}
		err = pgx.BeginFunc(ctx, c.target, func(tx pgx.Tx) error {
			if err := plan.clear(ctx, tx, held, schema, true); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DELETE FROM "+pgx.Identifier{schema, "read_models"}.Sanitize()+
				" WHERE projection = $1 AND version = $2", o.Projection, o.Version); err != nil {
				return fmt.Errorf("delete read-model record: %w", err)
			}
			if o.DropSchema {
				if _, err := tx.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{versionSchema}.Sanitize()+" CASCADE"); err != nil {
					return fmt.Errorf("drop schema %s: %w", versionSchema, err)
				}
			}
			return held.Forget(ctx, tx)
		})
		if err != nil {
			return fail(err)
		}
		if plan.slotExists {
			if err := replication.DropSlot(ctx, c.source, plan.slot); err != nil {
				return fail(fmt.Errorf("state deleted, but: %w (run retire again)", err))
			}
		}
		if err := dropUnusedGroupSlot(ctx, cfg, c, schema, groupOf(cfg, o.Projection, o.Version), w); err != nil {
			return fail(fmt.Errorf("state deleted, but: %w (run retire again)", err))
		}

		fmt.Fprintf(w, "retired %s v%d:\n", o.Projection, o.Version)
		if plan.slotExists {
			fmt.Fprintf(w, "  dropped replication slot %q\n", plan.slot)
		} else {
			fmt.Fprintf(w, "  no replication slot %q to drop\n", plan.slot)
		}
		fmt.Fprintf(w, "  deleted %d stream cursors, the watermark, %d dead letters and the lease\n", plan.cursors.Streams, plan.dead)
		switch {
		case o.DropSchema:
			fmt.Fprintf(w, "  dropped schema %s and its tables\n", versionSchema)
		case versionSchema != "":
			fmt.Fprintf(w, "  kept schema %s (-drop-schema drops it)\n", versionSchema)
		}
		if plan.configured {
			fmt.Fprintf(w, "  it is still in %s: remove it, or the next pgscribe run builds it again\n", cfg.Path)
		}
		return nil
	})
}

// retireSchema is the version's schema: configured, else recorded by
// migrate, else "".
func retireSchema(ctx context.Context, q event.Querier, cfg *config.Config, schema string, o RetireOptions) (string, error) {
	if i := slices.IndexFunc(cfg.Projections, func(s rules.Spec) bool { return s.Name == o.Projection && s.Version == o.Version }); i >= 0 &&
		cfg.Projections[i].Schema != "" {
		return cfg.Projections[i].Schema, nil
	}
	var s string
	err := q.QueryRow(ctx, "SELECT schema_name FROM "+pgx.Identifier{schema, "read_models"}.Sanitize()+
		" WHERE projection = $1 AND version = $2", o.Projection, o.Version).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read read-model record: %w", err)
	}
	return s, nil
}

// dependentsOutside lists the views outside schema that read a relation
// in it (a served view left pointing at it): what DROP SCHEMA … CASCADE
// would silently take with it.
func dependentsOutside(ctx context.Context, q event.Querier, schema string) ([]string, error) {
	deps, err := queryStrings(ctx, q, `SELECT DISTINCT v.oid::regclass::text FROM pg_depend d
JOIN pg_rewrite rw ON rw.oid = d.objid
JOIN pg_class v ON v.oid = rw.ev_class
JOIN pg_class t ON t.oid = d.refobjid
WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass
  AND t.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $1)
  AND v.relnamespace <> t.relnamespace
ORDER BY 1`, schema)
	if err != nil {
		return nil, fmt.Errorf("find dependents of schema %s: %w", schema, err)
	}
	return deps, nil
}

// Served is the row of the served table of one projection.
type Served struct {
	Projection  string    `json:"projection"`
	Version     int64     `json:"version"`
	ServeSchema string    `json:"serve_schema"`
	PromotedAt  time.Time `json:"promoted_at"`
}

// loadServed reads the served table, by projection.
func loadServed(ctx context.Context, q event.Querier, schema string) (map[string]Served, error) {
	list, err := event.QueryRows(ctx, q, "read served versions", pgx.RowToStructByPos[Served],
		"SELECT projection, version, serve_schema, promoted_at FROM "+pgx.Identifier{schema, "served"}.Sanitize())
	if err != nil {
		return nil, err
	}
	out := make(map[string]Served, len(list))
	for _, s := range list {
		out[s.Projection] = s
	}
	return out, nil
}

// groupOf is the configured group of a version ("" when it is not
// configured any more: the default group).
func groupOf(cfg *config.Config, projection string, version int64) string {
	for _, s := range cfg.Projections {
		if s.Name == projection && s.Version == version {
			return s.Group
		}
	}
	return ""
}

// dropUnusedGroupSlot drops the slot of group once no version's
// watermark is recorded on it (the last one was reset or retired): it
// would keep WAL for nobody.
func dropUnusedGroupSlot(ctx context.Context, cfg *config.Config, c *conns, schema, group string, w io.Writer) error {
	slot := cfg.GroupSlotName(rules.Spec{Group: group}.GroupName())
	var on int
	if err := c.target.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "watermarks"}.Sanitize()+
		" WHERE slot_name = $1", slot).Scan(&on); err != nil {
		return err
	}
	if on > 0 {
		return nil
	}
	info, err := replication.InspectSlot(ctx, c.source, slot)
	if err != nil || !info.Exists {
		return err
	}
	if err := replication.DropSlot(ctx, c.source, slot); err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "  dropped the group's replication slot %q (no version streams from it)\n", slot)
	return err
}
