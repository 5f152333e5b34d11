package migrations

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// tableIdent splits a configured table name, "table" or "schema.table", into
// an identifier to be quoted with Sanitize. An unqualified name resolves
// through the search_path like any unquoted reference would.
func tableIdent(name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("table name %q: want table or schema.table", name)
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("table name %q: empty part", name)
		}
	}
	return pgx.Identifier(parts), nil
}

// CreateEventsTable creates the reference events table (README.md, "The
// events table") on the source database if it does not exist, and its
// schema when the name is qualified. An existing table is left as it is,
// whatever its shape. Safe to run concurrently (advisory lock).
func CreateEventsTable(ctx context.Context, q Querier, table string) error {
	id, err := tableIdent(table)
	if err != nil {
		return fmt.Errorf("create events table: %w", err)
	}
	ddl := "CREATE TABLE IF NOT EXISTS " + id.Sanitize() + ` (
    position        bigserial   PRIMARY KEY,
    id              uuid        NOT NULL DEFAULT gen_random_uuid() UNIQUE,
    stream_id       text        NOT NULL,
    stream_position bigint      NOT NULL,
    type            text        NOT NULL,
    data            jsonb       NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    occurred_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE (stream_id, stream_position)
)`
	if len(id) == 2 {
		ddl = "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{id[0]}.Sanitize() + ";\n" + ddl
	}
	err = inLockedTx(ctx, q, lockSource, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, ddl)
		return err
	})
	if err != nil {
		return fmt.Errorf("create events table %s: %w", id.Sanitize(), err)
	}
	return nil
}

// EnsurePublication makes publication publish inserts, and only inserts, of
// table on the source database, a partitioned table's through its root:
//
//   - absent: CREATE PUBLICATION … FOR TABLE … WITH (publish = 'insert',
//     publish_via_partition_root = true);
//   - publishing other operations (update, delete, truncate) or not inserts:
//     ALTER PUBLICATION … SET (publish = 'insert');
//   - without publish_via_partition_root (a publication made by an older
//     pgscribe, or by hand): ALTER PUBLICATION … SET
//     (publish_via_partition_root = true). Without it pgoutput names the
//     partition an event went to, not the events table, and partitions
//     attached later would need adding one by one;
//   - not covering the table: ALTER PUBLICATION … ADD TABLE. Other tables it
//     covers stay (another consumer may rely on them), but `pgscribe check`
//     reports them: the stream stops at an insert into any relation that is
//     not the events table, rather than guess;
//   - covering the table with a row filter or a column list (PostgreSQL 15+),
//     which would hide events: the table is dropped and re-added whole.
//
// A FOR ALL TABLES publication covers the table and is kept as such. The
// table must exist. Safe to run concurrently (advisory lock); idempotent.
func EnsurePublication(ctx context.Context, q Querier, publication, table string) error {
	if publication == "" {
		return errors.New("ensure publication: empty publication name")
	}
	id, err := tableIdent(table)
	if err != nil {
		return fmt.Errorf("ensure publication: %w", err)
	}
	pub, tbl := pgx.Identifier{publication}.Sanitize(), id.Sanitize()
	err = inLockedTx(ctx, q, lockSource, func(tx pgx.Tx) error {
		var st pubState
		found, err := st.load(ctx, tx, publication, tbl)
		if err != nil {
			return err
		}
		for _, stmt := range st.fixes(found, pub, tbl) {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("ensure publication %s for %s: %w", pub, tbl, err)
	}
	return nil
}

// pubState is what EnsurePublication needs to know about a publication.
type pubState struct {
	insert, update, delete, truncate, allTables bool
	viaRoot                                     bool // publish_via_partition_root
	covered                                     bool // the table is published (by FOR TABLE, TABLES IN SCHEMA or ALL TABLES)
	restricted                                  bool // …with a row filter or a column list
}

// load reads the publication's state for the table (tbl is the quoted name).
// It reports false when the publication does not exist.
func (st *pubState) load(ctx context.Context, tx pgx.Tx, publication, tbl string) (bool, error) {
	var oid uint32
	var nsp, rel string
	err := tx.QueryRow(ctx, `SELECT c.oid, n.nspname, c.relname
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`, tbl).Scan(&oid, &nsp, &rel)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("table %s does not exist", tbl)
	}
	if err != nil {
		return false, fmt.Errorf("look up table: %w", err)
	}
	// prqual and prattrs exist from PostgreSQL 15 on; reading them through
	// to_jsonb keeps the query valid on older servers. Without
	// publish_via_partition_root, pg_publication_tables lists a partitioned
	// table's partitions, not the table: those, or the table's own
	// membership, say it is covered.
	err = tx.QueryRow(ctx, `SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate, p.puballtables, p.pubviaroot,
  EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = $2)
  OR EXISTS (SELECT 1 FROM pg_publication_tables t
          JOIN pg_namespace n ON n.nspname = t.schemaname
          JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
          WHERE t.pubname = p.pubname
            AND (c.oid = $2 OR coalesce(pg_partition_root(c.oid) = $2, false))),
  EXISTS (SELECT 1 FROM pg_publication_rel r
          WHERE r.prpubid = p.oid AND r.prrelid = $2
            AND (to_jsonb(r) ->> 'prqual' IS NOT NULL OR to_jsonb(r) ->> 'prattrs' IS NOT NULL))
FROM pg_publication p WHERE p.pubname = $1`, publication, oid).Scan(
		&st.insert, &st.update, &st.delete, &st.truncate, &st.allTables, &st.viaRoot, &st.covered, &st.restricted)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up publication: %w", err)
	}
	return true, nil
}

// fixes returns the statements that bring the publication to the wanted
// state; none when it is already there.
func (st *pubState) fixes(found bool, pub, tbl string) []string {
	if !found {
		return []string{"CREATE PUBLICATION " + pub + " FOR TABLE " + tbl + " WITH (publish = 'insert', publish_via_partition_root = true)"}
	}
	var stmts []string
	if st.restricted {
		stmts = append(stmts, "ALTER PUBLICATION "+pub+" DROP TABLE "+tbl)
		st.covered = false
	}
	if !st.covered {
		stmts = append(stmts, "ALTER PUBLICATION "+pub+" ADD TABLE "+tbl)
	}
	if !st.insert || st.update || st.delete || st.truncate {
		stmts = append(stmts, "ALTER PUBLICATION "+pub+" SET (publish = 'insert')")
	}
	if !st.viaRoot {
		stmts = append(stmts, "ALTER PUBLICATION "+pub+" SET (publish_via_partition_root = true)")
	}
	return stmts
}
