// Package migrations creates and upgrades pgscribe's engine schema on the
// target database (`pgscribe migrate`), and creates the reference events table
// and the publication on the source database.
//
// Migrations are numbered SQL files embedded in the binary (sql/NNNN_name.sql).
// {{schema}} in a file stands for the engine schema name, which is always
// substituted quoted (pgx.Identifier), so a schema named like `Pg Scribe`
// works and a hostile name cannot inject SQL.
//
// Apply runs every missing version in one transaction that first takes a
// transaction-scoped advisory lock, so several nodes may run it at the same
// time: one applies, the others wait and then find nothing to do. The lock
// comes before creating the schema on purpose: two sessions running CREATE
// SCHEMA IF NOT EXISTS concurrently can still fail with a unique violation.
// A failed migration rolls back entirely; nothing is half applied.
package migrations

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed sql/*.sql
var files embed.FS

// schemaPlaceholder is replaced by the quoted engine schema in migration SQL.
const schemaPlaceholder = "{{schema}}"

// Advisory lock keys, in the two-int4 key space so that they can never collide
// with the single-bigint locks that guard projections. "pgsc" in ASCII, then
// "migr" for the engine schema and "srce" for source-side DDL (events table,
// publication). Source DDL has its own key so that a caller holding it in an
// open transaction cannot block Apply on the same database, or the reverse.
const (
	lockClass  int32 = 0x70677363
	lockEngine int32 = 0x6d696772
	lockSource int32 = 0x73726365
)

// ErrSchemaTooNew is returned by Apply when the engine schema carries a
// version this binary does not know: a newer pgscribe migrated it, and an
// older one must not run against it.
var ErrSchemaTooNew = errors.New("engine schema is newer than this pgscribe")

// Querier is what this package needs from a database handle. pgx.Tx,
// *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn satisfy it. Begin is needed
// because DDL that must not race runs in its own (sub)transaction under an
// advisory lock; on a pgx.Tx it is a savepoint and the lock is held until the
// caller's transaction ends.
type Querier interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

type migration struct {
	version int
	name    string
	sql     string // with the placeholder still in
}

// all holds the embedded migrations in version order. Malformed embedded files
// are a build defect; the package's unit tests catch them, so parse panics.
var all = mustParse(files)

func mustParse(fsys fs.FS) []migration {
	ms, err := parse(fsys)
	if err != nil {
		panic(err)
	}
	return ms
}

// parse reads sql/NNNN_name.sql files and checks that versions increase
// without duplicates. Gaps are allowed, so that work on separate branches
// can take numbers apart (0003, 0010, 0020) without renumbering on merge;
// a database records each version it applied, so a version merged below
// one already applied still runs.
func parse(fsys fs.FS) ([]migration, error) {
	names, err := fs.Glob(fsys, "sql/*.sql")
	if err != nil {
		return nil, err
	}
	ms := make([]migration, 0, len(names))
	for _, name := range names { // fs.Glob returns names sorted
		base := path.Base(name)
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("migration %s: name must be NNNN_description.sql", name)
		}
		if len(ms) > 0 && v <= ms[len(ms)-1].version {
			return nil, fmt.Errorf("migration %s: version %d duplicates or precedes %s", name, v, ms[len(ms)-1].name)
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		if !strings.Contains(string(b), schemaPlaceholder) {
			return nil, fmt.Errorf("migration %s: does not use %s", name, schemaPlaceholder)
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	return ms, nil
}

// Versions lists the engine schema versions this binary knows, in order.
func Versions() []int {
	vs := make([]int, len(all))
	for i, m := range all {
		vs[i] = m.version
	}
	return vs
}

// Latest is the newest engine schema version this binary knows.
func Latest() int {
	if len(all) == 0 {
		return 0
	}
	return all[len(all)-1].version
}

// Apply brings the engine schema on the target database to Latest and returns
// the versions it applied, in order (none when it was already current, so a
// second call is a no-op). It creates the schema if needed.
//
// It is safe to run concurrently from several nodes (see the package comment).
// On error nothing is applied. It returns ErrSchemaTooNew (wrapped) when the
// database was migrated by a newer pgscribe.
func Apply(ctx context.Context, conn *pgx.Conn, schema string) (applied []int, err error) {
	if schema == "" {
		return nil, errors.New("migrate: empty engine schema name")
	}
	ident := pgx.Identifier{schema}.Sanitize()
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	err = inLockedTx(ctx, conn, lockEngine, func(tx pgx.Tx) error {
		// CREATE SCHEMA needs CREATE on the database even with IF NOT EXISTS
		// and an existing schema; look first, so that a role given a schema
		// made by an administrator can still migrate it.
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists); err != nil {
			return fmt.Errorf("look up schema %s: %w", ident, err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
				return fmt.Errorf("create schema %s: %w", ident, err)
			}
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+table+" ("+
			"version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"); err != nil {
			return fmt.Errorf("create %s: %w", table, err)
		}
		done, err := appliedVersions(ctx, tx, table)
		if err != nil {
			return err
		}
		for v := range done {
			if v > Latest() {
				return fmt.Errorf("migrate %s: database at version %d, this binary knows up to %d: %w",
					ident, v, Latest(), ErrSchemaTooNew)
			}
		}
		for _, m := range all {
			if done[m.version] {
				continue
			}
			if _, err := tx.Exec(ctx, strings.ReplaceAll(m.sql, schemaPlaceholder, ident)); err != nil {
				return fmt.Errorf("migration %s: %w", m.name, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (version) VALUES ($1)", m.version); err != nil {
				return fmt.Errorf("record migration %s: %w", m.name, err)
			}
			applied = append(applied, m.version)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return applied, nil
}

func appliedVersions(ctx context.Context, tx pgx.Tx, table string) (map[int]bool, error) {
	rows, err := tx.Query(ctx, "SELECT version FROM "+table)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	done := make(map[int]bool, len(versions))
	for _, v := range versions {
		done[v] = true
	}
	return done, nil
}

// Current returns the highest applied engine schema version, or 0 when the
// schema or its schema_migrations table does not exist. It takes no lock.
func Current(ctx context.Context, q Querier, schema string) (version int, err error) {
	table := pgx.Identifier{schema, "schema_migrations"}.Sanitize()
	var exists bool
	// to_regclass takes the quoted name as a value and returns NULL (not an
	// error) when the schema or the table is missing.
	if err := q.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		return 0, fmt.Errorf("engine schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	if err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+table).Scan(&version); err != nil {
		return 0, fmt.Errorf("engine schema version: %w", err)
	}
	return version, nil
}

// inLockedTx runs fn in a transaction (a savepoint when q is a pgx.Tx) that
// holds the advisory lock (lockClass, key), and commits it. The rollback on
// failure survives a cancelled ctx.
func inLockedTx(ctx context.Context, q Querier, key int32, fn func(tx pgx.Tx) error) (err error) {
	tx, err := q.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1, $2)", lockClass, key); err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}
