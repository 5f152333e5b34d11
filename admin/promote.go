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
	"github.com/pgscribe/pgscribe/engine"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// This file implements `pgscribe promote`: make a projection version the
// one readers see, by pointing each stable name (serve.<table>, a view) at
// the version's table (schema.<table>) and recording the version in the
// engine schema's served table, all in one transaction.
//
// Readers. A view is swapped under ACCESS EXCLUSIVE, which every reader of
// the view conflicts with: a statement that reads it runs entirely before
// the swap commits or entirely after, so it sees the old version's rows or
// the new one's, and because every view of the projection is swapped in the
// same transaction, a statement that reads several sees one version in all.
// A reader that waited for the lock finds the new definition (PostgreSQL
// looks a name up again after waiting for a lock that changed it, so even a
// view dropped and created again reads as the new one, not as an error).
//
// Lock order. Promote locks every view it changes in one LOCK statement, in
// name order, before changing any. A reader that reads two views locks them
// in its own order, so a reader holding view a and waiting for b while
// promote holds b and waits for a is a deadlock. Promote therefore waits
// for each lock at most lock_timeout, kept below the server's
// deadlock_timeout: it gives up (and rolls back, releasing b) before the
// deadlock detector would run in either session, so the reader is never
// the one cancelled; promote then retries the whole transaction until
// -timeout. The same bound keeps readers from queueing behind promote for
// longer than lock_timeout when a long transaction holds a view.
//
// Columns. CREATE OR REPLACE VIEW may only add columns at the end. When
// the new version's table has other columns (removed, renamed, retyped or
// reordered), promote drops the view and creates it again in the same
// transaction, and copies its grants. A reader that names the columns
// keeps working across that swap; a prepared `SELECT *` fails once with
// "cached plan must not change result type", which is why readers should
// name columns. Objects that depend on a view (another view over it) make
// the drop fail: promote says so and changes nothing.
//
// A real table where the view must go (the layout before versioned
// schemas: version 1 writes public.balances itself) is refused, never
// moved: moving it would leave the engine that writes it writing through
// the new view into the next version's table. The message says how to move
// it by hand.

// ErrRefused is returned (wrapped) by Promote and Retire when the version
// is not in a state to be promoted or retired; nothing was changed.
var ErrRefused = errors.New("refused")

// PromoteOptions selects the version to promote and how strict to be.
type PromoteOptions struct {
	Projection string
	Version    int64
	// MaxLag is the largest lag (status's LAG) a version may have to be
	// promoted; DefaultMaxLag when zero.
	MaxLag time.Duration
	// Force promotes even when the version is not live, lags or is halted;
	// the output says what was overridden.
	Force bool
	// Timeout bounds the retries of a promote that cannot get its locks
	// (readers in long transactions); DefaultPromoteTimeout when zero.
	Timeout time.Duration
}

// Defaults of PromoteOptions.
const (
	DefaultMaxLag         = 10 * time.Second
	DefaultPromoteTimeout = time.Minute
)

// promoteLockTimeout is the longest promote waits for one lock; it stays
// below deadlock_timeout (see the file comment).
const promoteLockTimeout = 200 * time.Millisecond

// promoteLock serialises promotes: two-int4 advisory key "pgsc" "prom".
const promoteLockClass, promoteLockKey int32 = 0x70677363, 0x70726f6d

// servedPrefix starts the comment promote puts on each view; it is how
// promote recognises a projection's views when a later version has fewer
// tables.
func servedPrefix(projection string) string {
	return fmt.Sprintf("pgscribe: serves projection %q v", projection)
}

// refusal is a failure of a promote attempt that retrying cannot fix.
type refusal struct{ msg string }

func (r *refusal) Error() string { return r.msg }

// Promote promotes a configured projection version (see the file comment)
// and writes what it checked and changed to w. It returns ErrRefused
// (wrapped) when a precondition fails without Force, or the database
// layout does not allow the swap; nothing is changed then.
func Promote(ctx context.Context, cfg *config.Config, o PromoteOptions, w io.Writer) error {
	if o.MaxLag <= 0 {
		o.MaxLag = DefaultMaxLag
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultPromoteTimeout
	}
	i := slices.IndexFunc(cfg.Projections, func(s rules.Spec) bool { return s.Name == o.Projection && s.Version == o.Version })
	if i < 0 {
		return fmt.Errorf("promote %s v%d: %w: not in the configuration %s", o.Projection, o.Version, ErrRefused, cfg.Path)
	}
	spec := cfg.Projections[i]
	if spec.Schema == "" || spec.Serve == "" {
		return fmt.Errorf("promote %s v%d: %w: the version needs schema (where its tables are) and serve (where readers find them) in %s",
			o.Projection, o.Version, ErrRefused, cfg.Path)
	}
	tables, outside := servedTables(spec)
	if len(tables) == 0 {
		return fmt.Errorf("promote %s v%d: %w: its rules write no table of schema %q", o.Projection, o.Version, ErrRefused, spec.Schema)
	}

	rep, err := Status(ctx, cfg)
	if err != nil {
		return err
	}
	ps := rep.Projections[slices.IndexFunc(rep.Projections, func(p ProjectionStatus) bool {
		return p.Projection == o.Projection && p.Version == o.Version
	})]
	problems := promoteProblems(ps, o.MaxLag)
	fmt.Fprintf(w, "promote %s v%d: state %s, lag %s (threshold %s)\n", o.Projection, o.Version, ps.State, lagText(ps.LagSeconds), o.MaxLag)
	for _, t := range outside {
		fmt.Fprintf(w, "  note: %s is outside schema %s: not served\n", t, spec.Schema)
	}
	if len(problems) > 0 {
		if !o.Force {
			return fmt.Errorf("promote %s v%d: %w: %s (-force overrides)", o.Projection, o.Version, ErrRefused, strings.Join(problems, "; "))
		}
		for _, p := range problems {
			fmt.Fprintf(w, "  forced: promoting although %s\n", p)
		}
	}

	c, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close(ctx)
	pr := &promotion{schema: cfg.Engine.Schema, spec: spec, tables: tables}
	deadline := time.Now().Add(o.Timeout)
	wait := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		pr.changes = nil
		err = pgx.BeginFunc(ctx, c.target, func(tx pgx.Tx) error { return pr.run(ctx, tx) })
		if err == nil {
			for _, ch := range pr.changes {
				fmt.Fprintf(w, "  %s\n", ch)
			}
			was := "none"
			if pr.previous != 0 {
				was = fmt.Sprintf("v%d", pr.previous)
			}
			_, err = fmt.Fprintf(w, "served: %s v%d in schema %s (before: %s; %d attempt(s))\n", o.Projection, o.Version, spec.Serve, was, attempt)
			return err
		}
		var r *refusal
		if errors.As(err, &r) {
			return fmt.Errorf("promote %s v%d: %w: %s", o.Projection, o.Version, ErrRefused, r.msg)
		}
		code := sqlstate.Code(err)
		if (code != "55P03" && code != "40P01") || time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("promote %s v%d (attempt %d; nothing changed): %w", o.Projection, o.Version, attempt, err)
		}
		// A lock stayed busy: readers in a transaction over a served view.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// servedTables splits the tables a version writes into those of its own
// schema (served, by their unqualified names) and the others.
func servedTables(spec rules.Spec) (served, outside []string) {
	for _, t := range spec.Tables() {
		if name, ok := strings.CutPrefix(t, spec.Schema+"."); ok && !strings.Contains(name, ".") {
			served = append(served, name)
		} else {
			outside = append(outside, t)
		}
	}
	return served, outside
}

// promoteProblems lists the preconditions ps fails.
func promoteProblems(ps ProjectionStatus, maxLag time.Duration) []string {
	var out []string
	switch {
	case ps.State == engine.StateHalted:
		out = append(out, fmt.Sprintf("it is halted (%s)", ps.HaltReason))
	case ps.State != engine.StateLive:
		out = append(out, fmt.Sprintf("it is %s, not live", ps.State))
	}
	switch {
	case ps.LagSeconds == nil:
		out = append(out, "its lag is unknown")
	case *ps.LagSeconds > maxLag.Seconds():
		out = append(out, fmt.Sprintf("its lag %s is above %s", lagText(ps.LagSeconds), maxLag))
	}
	return out
}

func lagText(s *float64) string {
	if s == nil {
		return "unknown"
	}
	return formatSeconds(*s)
}

// promotion is one promote transaction's work.
type promotion struct {
	schema string // engine schema
	spec   rules.Spec
	tables []string // unqualified, sorted

	previous int64    // version served before, 0 when none
	changes  []string // what the committed attempt did, for the output
}

// viewState is what stands at a stable name.
type viewState struct {
	name    string // unqualified
	relkind string // "" when nothing
	oid     uint32
}

func (pr *promotion) run(ctx context.Context, tx pgx.Tx) error {
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", lockTimeoutSetting(ctx, tx)); err != nil {
		return fmt.Errorf("set lock_timeout: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", promoteLockClass, promoteLockKey); err != nil {
		return fmt.Errorf("promote lock: %w", err)
	}
	served := pgx.Identifier{pr.schema, "served"}.Sanitize()
	err := tx.QueryRow(ctx, "SELECT version FROM "+served+" WHERE projection = $1", pr.spec.Name).Scan(&pr.previous)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("read served version: %w", err)
	}

	serve, vschema := pr.spec.Serve, pr.spec.Schema
	states := make([]viewState, 0, len(pr.tables))
	for _, t := range pr.tables {
		if kind, _, err := relation(ctx, tx, vschema, t); err != nil {
			return err
		} else if kind == "" {
			return &refusal{fmt.Sprintf("table %s.%s does not exist (did pgscribe migrate run the version's ddl?)", vschema, t)}
		}
		kind, oid, err := relation(ctx, tx, serve, t)
		if err != nil {
			return err
		}
		switch kind {
		case "", "v":
		case "r", "p":
			return &refusal{fmt.Sprintf("%s.%s is a table, not a view: promote replaces only views and never moves a table "+
				"(the engine writing it would then write through the view into the promoted version). To move it by hand: stop the "+
				"version that writes it, then in one transaction CREATE SCHEMA <its schema>; ALTER TABLE %[1]s.%[2]s SET SCHEMA <its schema>; "+
				"CREATE VIEW %[1]s.%[2]s AS SELECT * FROM <its schema>.%[2]s; set schema and serve on that version, start it, "+
				"and promote it (or promote this one)", serve, t)}
		default:
			return &refusal{fmt.Sprintf("%s.%s exists and is not a view (relkind %s)", serve, t, kind)}
		}
		states = append(states, viewState{name: t, relkind: kind, oid: oid})
	}
	stale, err := pr.staleViews(ctx, tx)
	if err != nil {
		return err
	}

	// Every lock first, in one statement and in name order (see the file
	// comment), then the changes.
	var lock []string
	for _, s := range states {
		if s.relkind == "v" {
			lock = append(lock, pgx.Identifier{serve, s.name}.Sanitize())
		}
	}
	for _, v := range stale {
		lock = append(lock, pgx.Identifier{serve, v}.Sanitize())
	}
	if len(lock) > 0 {
		if _, err := tx.Exec(ctx, "LOCK TABLE "+strings.Join(lock, ", ")+" IN ACCESS EXCLUSIVE MODE"); err != nil {
			return fmt.Errorf("lock served views: %w", err)
		}
	}
	for _, s := range states {
		if err := pr.point(ctx, tx, s); err != nil {
			return err
		}
	}
	for _, v := range stale {
		if _, err := tx.Exec(ctx, "DROP VIEW "+pgx.Identifier{serve, v}.Sanitize()); err != nil {
			return fmt.Errorf("drop view %s.%s, which v%d no longer writes: %w", serve, v, pr.spec.Version, err)
		}
		pr.changes = append(pr.changes, fmt.Sprintf("%s.%s dropped (v%d has no such table)", serve, v, pr.spec.Version))
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+served+` AS s (projection, version, serve_schema) VALUES ($1, $2, $3)
ON CONFLICT (projection) DO UPDATE SET version = excluded.version, serve_schema = excluded.serve_schema, promoted_at = now()`,
		pr.spec.Name, pr.spec.Version, serve); err != nil {
		return fmt.Errorf("record served version: %w", err)
	}
	return nil
}

// lockTimeoutSetting is promoteLockTimeout, or half of deadlock_timeout
// when that is shorter.
func lockTimeoutSetting(ctx context.Context, tx pgx.Tx) string {
	ms := promoteLockTimeout.Milliseconds()
	var deadlock int64
	if err := tx.QueryRow(ctx, "SELECT setting::bigint FROM pg_settings WHERE name = 'deadlock_timeout'").Scan(&deadlock); err == nil && deadlock > 0 {
		ms = min(ms, max(deadlock/2, 1))
	}
	return fmt.Sprintf("%dms", ms)
}

// relation returns the relkind and oid of schema.name, "" when absent.
func relation(ctx context.Context, q event.Querier, schema, name string) (string, uint32, error) {
	var kind string
	var oid uint32
	err := q.QueryRow(ctx, `SELECT c.relkind::text, c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`, schema, name).Scan(&kind, &oid)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("look up %s.%s: %w", schema, name, err)
	}
	return kind, oid, nil
}

// staleViews lists the views of the serve schema that an earlier promote
// of this projection created (their comment says so) for tables this
// version does not have.
func (pr *promotion) staleViews(ctx context.Context, tx pgx.Tx) ([]string, error) {
	names, err := queryStrings(ctx, tx, `SELECT c.relname::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'v' AND starts_with(coalesce(obj_description(c.oid, 'pg_class'), ''), $2)
  AND NOT (c.relname = ANY($3)) ORDER BY 1`, pr.spec.Serve, servedPrefix(pr.spec.Name), pr.tables)
	if err != nil {
		return nil, fmt.Errorf("find served views: %w", err)
	}
	return names, nil
}

// point makes serve.<s.name> a view of schema.<s.name>.
func (pr *promotion) point(ctx context.Context, tx pgx.Tx, s viewState) error {
	serve, vschema := pr.spec.Serve, pr.spec.Schema
	view := pgx.Identifier{serve, s.name}.Sanitize()
	table := pgx.Identifier{vschema, s.name}.Sanitize()
	create := "CREATE VIEW " + view + " AS SELECT * FROM " + table
	what := "created"
	var grants []string
	if s.relkind == "v" {
		keep, err := columnsExtend(ctx, tx, s.oid, table)
		if err != nil {
			return err
		}
		if keep {
			create = "CREATE OR REPLACE VIEW " + view + " AS SELECT * FROM " + table
			what = "replaced"
		} else {
			if grants, err = viewGrants(ctx, tx, s.oid, view); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DROP VIEW "+view); err != nil {
				if sqlstate.Code(err) == "2BP01" {
					return &refusal{fmt.Sprintf("the columns of %s.%s change, so its view must be dropped and created again, "+
						"but other objects depend on it: %v", serve, s.name, err)}
				}
				return fmt.Errorf("drop view %s: %w", view, err)
			}
			what = "dropped and created again (its columns change)"
			if len(grants) > 0 {
				what += fmt.Sprintf(", %d grant(s) copied", len(grants))
			}
		}
	}
	if _, err := tx.Exec(ctx, create); err != nil {
		return fmt.Errorf("point %s at %s: %w", view, table, err)
	}
	for _, g := range grants {
		if _, err := tx.Exec(ctx, g); err != nil {
			return fmt.Errorf("copy grants of %s: %w", view, err)
		}
	}
	comment := fmt.Sprintf("%s%d from %s.%s", servedPrefix(pr.spec.Name), pr.spec.Version, vschema, s.name)
	if _, err := tx.Exec(ctx, "COMMENT ON VIEW "+view+" IS "+quoteLiteral(comment)); err != nil {
		return fmt.Errorf("comment on %s: %w", view, err)
	}
	pr.changes = append(pr.changes, fmt.Sprintf("%s.%s → %s.%s: %s", serve, s.name, vschema, s.name, what))
	return nil
}

// columnsExtend reports whether the view's columns are a prefix of the
// table's (same names and types, in order): what CREATE OR REPLACE VIEW
// accepts.
func columnsExtend(ctx context.Context, tx pgx.Tx, view uint32, table string) (bool, error) {
	const cols = `SELECT coalesce(array_agg(attname::text || ' ' || format_type(atttypid, atttypmod) ORDER BY attnum), '{}')
FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 AND NOT attisdropped`
	var have, want []string
	if err := tx.QueryRow(ctx, cols, view).Scan(&have); err != nil {
		return false, fmt.Errorf("read view columns: %w", err)
	}
	if err := tx.QueryRow(ctx, strings.Replace(cols, "$1", "$1::regclass", 1), table).Scan(&want); err != nil {
		return false, fmt.Errorf("read table columns: %w", err)
	}
	return len(have) <= len(want) && slices.Equal(have, want[:len(have)]), nil
}

// viewGrants returns the GRANT statements that give view's grantees (other
// than its owner) what they have on the view now.
func viewGrants(ctx context.Context, tx pgx.Tx, oid uint32, view string) ([]string, error) {
	rows, err := tx.Query(ctx, `SELECT a.privilege_type, CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(r.rolname) END
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
WHERE c.oid = $1 AND a.grantee <> c.relowner`, oid)
	if err != nil {
		return nil, fmt.Errorf("read grants of %s: %w", view, err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var priv, grantee string
		if err := rows.Scan(&priv, &grantee); err != nil {
			return nil, fmt.Errorf("read grants of %s: %w", view, err)
		}
		// privilege_type is one of a fixed set of keywords; grantee comes
		// quoted by quote_ident.
		if !slices.Contains([]string{"SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER", "MAINTAIN"}, priv) {
			continue
		}
		out = append(out, "GRANT "+priv+" ON "+view+" TO "+grantee)
	}
	return out, rows.Err()
}

// quoteLiteral quotes s as an SQL string literal, for the statements that
// take no parameters (COMMENT).
func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
