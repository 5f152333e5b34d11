package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/migrations"
	"github.com/pgscribe/pgscribe/replication"
	"github.com/pgscribe/pgscribe/rules"
)

// This file implements the database half of `pgscribe check`: what the
// configuration names must exist, be usable and be writable by the role
// pgscribe connects as. Each finding is a Problem; Check never changes
// anything.
//
// What is checked:
//
//   - source: wal_level is logical; the events table and its configured
//     columns exist, of types pgscribe reads (replication.ReadableType);
//     the publication exists, publishes inserts, covers the whole table (no
//     row filter or column list) through the partition root, and nothing
//     else; max_replication_slots and max_wal_senders leave room for
//     the slot and the stream of every group (replicationRoom).
//   - target: the engine schema is at migrations.Latest, and the role may
//     use it (schema USAGE; SELECT, INSERT, UPDATE on cursors, watermarks
//     and leases; SELECT and INSERT on dead_letters).
//   - every insert, upsert, update and delete rule: its table resolves
//     (to_regclass: a qualified name as written, an unqualified one through
//     the search_path) to a table; every key, set and inc column exists; an
//     inc column's type (after domains) is smallint, integer, bigint,
//     numeric, real or double precision; a written column is not generated
//     nor GENERATED ALWAYS AS IDENTITY; an insert or upsert sets every
//     NOT NULL column that has no default; an upsert's key columns are
//     exactly the key columns of a unique index or constraint that ON
//     CONFLICT can use (valid, not deferrable, no predicate, no
//     expressions); and the role holds the privileges the op's statement
//     needs (insert: INSERT on its columns; upsert: INSERT on its columns,
//     UPDATE on set and inc, SELECT on key and inc; update: UPDATE on set
//     and inc, SELECT on key and inc; delete: DELETE, SELECT on key).
//   - every sql rule: its statement prepares on the target (so the tables
//     and columns it names exist and its parameters have types) and takes
//     as many parameters as args gives.
//
// Set and key column types are not checked: a rule's values are converted
// by PostgreSQL when written, and a value that does not convert is an
// integrity error of that event (dead-lettered), not of the deployment.

// ErrProblems is returned (wrapped) by Check when it found problems; they
// were written out, one a line.
var ErrProblems = errors.New("check found problems")

// Problem is one thing wrong in the databases for the configuration.
type Problem struct {
	Scope  string // `balances v1 rule "move"`, "source" or "target"
	Object string // `table "balances" column "balance"`; may be empty
	Msg    string
}

// String renders the problem on one line, for example
// `balances v1 rule "move": table "balances" column "balance": type text cannot take inc`.
func (p Problem) String() string {
	if p.Object == "" {
		return p.Scope + ": " + p.Msg
	}
	return p.Scope + ": " + p.Object + ": " + p.Msg
}

// Check checks the source and target databases against cfg and its
// compiled programs (progs in cfg.Projections order), writes every problem
// found to w, one a line, and returns ErrProblems (wrapped) when there was
// any. Any other error means it could not check: a failed connection or
// catalog query.
func Check(ctx context.Context, cfg *config.Config, progs []*rules.Program, w io.Writer) error {
	c, err := connect(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close(ctx)
	ck := &checker{cfg: cfg, c: c, tables: map[string]*tableInfo{}}
	if err := ck.run(ctx, progs); err != nil {
		return err
	}
	for _, p := range ck.problems {
		if _, err := fmt.Fprintln(w, p.String()); err != nil {
			return err
		}
	}
	if n := len(ck.problems); n > 0 {
		return fmt.Errorf("%w: %d", ErrProblems, n)
	}
	return nil
}

type checker struct {
	cfg      *config.Config
	c        *conns
	role     string
	problems []Problem
	tables   map[string]*tableInfo // by configured name
}

func (ck *checker) add(scope, object, format string, args ...any) {
	ck.problems = append(ck.problems, Problem{Scope: scope, Object: object, Msg: fmt.Sprintf(format, args...)})
}

func (ck *checker) run(ctx context.Context, progs []*rules.Program) error {
	if err := ck.c.target.QueryRow(ctx, "SELECT current_user::text").Scan(&ck.role); err != nil {
		return fmt.Errorf("check: %w", err)
	}
	if err := ck.source(ctx); err != nil {
		return err
	}
	if err := ck.engineSchema(ctx); err != nil {
		return err
	}
	for i, prog := range progs {
		spec := ck.cfg.Projections[i]
		for _, t := range prog.Targets() {
			if err := ck.target(ctx, fmt.Sprintf("%s v%d rule %q", spec.Name, spec.Version, t.Rule), t); err != nil {
				return err
			}
		}
		for j, rs := range spec.Rules {
			if op, _ := event.Op(rs.Op).Spec(); op.Kind != event.KindStatement {
				continue
			}
			ck.sqlRule(ctx, fmt.Sprintf("%s v%d rule %q", spec.Name, spec.Version, rules.RuleName(j, rs)), rs)
		}
	}
	return nil
}

// source checks the source database: replication settings, the events
// table and the publication.
func (ck *checker) source(ctx context.Context) error {
	src := ck.c.source
	var walLevel string
	var room replicationRoom
	feeds := feedSlots(ck.cfg)
	if err := src.QueryRow(ctx, `SELECT current_setting('wal_level'),
  current_setting('max_replication_slots')::int, (SELECT count(*) FROM pg_replication_slots),
  (SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1)),
  current_setting('max_wal_senders')::int, (SELECT count(*) FROM pg_stat_replication),
  (SELECT count(*) FROM pg_replication_slots WHERE slot_name = ANY($1) AND active)`,
		feeds).Scan(&walLevel, &room.maxSlots, &room.usedSlots, &room.ourSlots, &room.maxSenders, &room.usedSenders, &room.ourSenders); err != nil {
		return fmt.Errorf("check source settings: %w", err)
	}
	if walLevel != "logical" {
		ck.add("source", "", "wal_level is %q, logical replication needs \"logical\" (set it and restart PostgreSQL)", walLevel)
	}
	for _, msg := range room.problems(len(feeds)) {
		ck.add("source", "", "%s", msg)
	}

	tableName := ck.cfg.Source.Table
	obj := fmt.Sprintf("table %q", tableName)
	ti, err := lookupTable(ctx, src, tableName)
	if err != nil {
		return err
	}
	if ti.problem != "" {
		ck.add("source", obj, "%s", ti.problem)
		return nil
	}
	cols := ck.cfg.Source.Columns
	for _, col := range []struct{ key, name string }{
		{"position", cols.Position}, {"id", cols.ID}, {"stream_id", cols.StreamID},
		{"stream_position", cols.StreamPosition}, {"type", cols.Type}, {"data", cols.Data},
		{"metadata", cols.Metadata}, {"occurred_at", cols.OccurredAt},
	} {
		if col.name == "" {
			continue // not mapped (id, metadata, occurred_at may be absent)
		}
		c, ok := ti.cols[col.name]
		cobj := fmt.Sprintf("%s column %q", obj, col.name)
		if !ok {
			ck.add("source", cobj, "does not exist (source.columns.%s)", col.key)
			continue
		}
		if ok, want := replication.ReadableType(col.key, c.baseType); !ok {
			ck.add("source", cobj, "has type %s, which pgscribe cannot read as %s (it reads %s)", c.typ, col.key, want)
		}
		if col.key == "position" && !slices.ContainsFunc(ti.uniques, func(u []string) bool { return slices.Contains(u, col.name) }) {
			ck.add("source", cobj, "is in no unique index: a backfill reads the table in pages ordered by it, which needs each position to name one event and an index to find the next page (make it the primary key, as event stores do)")
		}
	}

	pub := ck.cfg.Source.Publication
	pobj := fmt.Sprintf("publication %q", pub)
	var insert, viaRoot, covered, restricted bool
	var others []string
	// prqual and prattrs exist from PostgreSQL 15 on; to_jsonb keeps the
	// query valid on older servers. Without publish_via_partition_root,
	// pg_publication_tables lists a partitioned table's partitions rather
	// than the table: a partition of it counts as covering it here (the
	// missing option is its own problem).
	err = src.QueryRow(ctx, `WITH pt AS (
  SELECT t.schemaname, t.tablename, c.oid = $2 OR coalesce(pg_partition_root(c.oid) = $2, false) AS ours
  FROM pg_publication_tables t
  JOIN pg_namespace n ON n.nspname = t.schemaname
  JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = t.tablename
  WHERE t.pubname = $1)
SELECT p.pubinsert, p.pubviaroot,
  EXISTS (SELECT 1 FROM pt WHERE pt.ours)
    OR EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prrelid = $2),
  EXISTS (SELECT 1 FROM pg_publication_rel r
          WHERE r.prpubid = p.oid AND r.prrelid = $2
            AND (to_jsonb(r) ->> 'prqual' IS NOT NULL OR to_jsonb(r) ->> 'prattrs' IS NOT NULL)),
  ARRAY(SELECT format('%I.%I', pt.schemaname, pt.tablename) FROM pt WHERE NOT pt.ours ORDER BY 1 LIMIT 6)
FROM pg_publication p WHERE p.pubname = $1`, pub, ti.oid).Scan(&insert, &viaRoot, &covered, &restricted, &others)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		ck.add("source", pobj, "does not exist (pgscribe migrate creates it)")
	case err != nil:
		return fmt.Errorf("check publication: %w", err)
	default:
		if !insert {
			ck.add("source", pobj, "does not publish inserts (pgscribe migrate sets publish = 'insert')")
		}
		if !covered {
			ck.add("source", pobj, "does not cover %s (pgscribe migrate adds it)", obj)
		} else if restricted {
			ck.add("source", pobj, "publishes %s with a row filter or a column list, which hides events (pgscribe migrate removes it)", obj)
		}
		if !viaRoot {
			ck.add("source", pobj, "does not publish via the partition root, so a partitioned events table's inserts would name its partitions (pgscribe migrate sets publish_via_partition_root = true)")
		}
		if len(others) > 0 {
			more := ""
			if len(others) > 5 {
				others, more = others[:5], " …"
			}
			ck.add("source", pobj, "also publishes %s%s: pgscribe stops at an insert into a table that is not %s (publish only the events table)",
				strings.Join(others, ", "), more, obj)
		}
	}
	return nil
}

// engineSchema checks the engine schema's version and the role's
// privileges on its tables.
func (ck *checker) engineSchema(ctx context.Context) error {
	schema := ck.cfg.Engine.Schema
	obj := fmt.Sprintf("engine schema %q", schema)
	v, err := migrations.Current(ctx, ck.c.target, schema)
	if err != nil {
		return err
	}
	switch {
	case v == 0:
		ck.add("target", obj, "does not exist (run pgscribe migrate)")
		return nil
	case v < migrations.Latest():
		ck.add("target", obj, "is at version %d, this pgscribe needs %d (run pgscribe migrate)", v, migrations.Latest())
		return nil
	case v > migrations.Latest():
		ck.add("target", obj, "is at version %d, newer than this pgscribe (it knows up to %d)", v, migrations.Latest())
		return nil
	}
	var usage bool
	if err := ck.c.target.QueryRow(ctx, "SELECT has_schema_privilege($1, 'USAGE')", schema).Scan(&usage); err != nil {
		return fmt.Errorf("check engine schema: %w", err)
	}
	if !usage {
		ck.add("target", obj, "role %q lacks USAGE", ck.role)
		return nil
	}
	for _, t := range []struct {
		table string
		privs []string
	}{
		{"cursors", []string{"SELECT", "INSERT", "UPDATE"}},
		{"watermarks", []string{"SELECT", "INSERT", "UPDATE"}},
		{"leases", []string{"SELECT", "INSERT", "UPDATE"}},
		{"dead_letters", []string{"SELECT", "INSERT"}},
	} {
		ident := pgx.Identifier{schema, t.table}.Sanitize()
		for _, p := range t.privs {
			var ok bool
			if err := ck.c.target.QueryRow(ctx, "SELECT has_table_privilege($1, $2)", ident, p).Scan(&ok); err != nil {
				return fmt.Errorf("check privileges on %s: %w", ident, err)
			}
			if !ok {
				ck.add("target", fmt.Sprintf("engine table %s", ident), "role %q lacks %s", ck.role, p)
			}
		}
	}
	return nil
}

// tableInfo is what check needs to know of a table.
type tableInfo struct {
	problem      string // why it cannot be used (missing, not a table); "" when usable
	oid          uint32
	schema, name string
	cols         map[string]columnInfo
	uniques      [][]string // key columns (sorted) of unique indexes ON CONFLICT can use
}

type columnInfo struct {
	typ        string // as format_type shows it
	baseType   uint32 // type OID after resolving domains
	notNull    bool
	hasDefault bool
	identity   string // "", "a" (ALWAYS) or "d" (BY DEFAULT)
	generated  bool
}

// otherKinds names the relation kinds that are not tables. pgscribe reads
// and writes ordinary ("r") and partitioned ("p") tables only.
var otherKinds = map[string]string{
	"v": "a view", "m": "a materialized view", "f": "a foreign table", "S": "a sequence",
	"i": "an index", "I": "an index", "c": "a composite type", "t": "a TOAST table",
}

// lookupTable resolves a configured table name ("t" or "s.t") on q and reads
// its columns and unique indexes. A name that does not resolve, or resolves
// to something other than a table, gives a tableInfo with a problem; a
// lookup the server refuses (no USAGE on the schema) too.
func lookupTable(ctx context.Context, q event.Querier, name string) (*tableInfo, error) {
	ti := &tableInfo{cols: map[string]columnInfo{}}
	var kind string
	ident := event.Table(name).Quoted()
	err := q.QueryRow(ctx, `SELECT c.oid, c.relkind::text, n.nspname::text, c.relname::text
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1)`, ident).Scan(
		&ti.oid, &kind, &ti.schema, &ti.name)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		ti.problem = "does not exist"
		if !strings.Contains(name, ".") {
			ti.problem += " in the search_path"
		}
		return ti, nil
	case errors.As(err, &pgErr):
		ti.problem = fmt.Sprintf("cannot be looked up: %s (%s)", pgErr.Message, pgErr.Code)
		return ti, nil
	case err != nil:
		return nil, fmt.Errorf("look up table %s: %w", ident, err)
	}
	if kind != "r" && kind != "p" {
		what, ok := otherKinds[kind]
		if !ok {
			what = "relation kind " + strconv.Quote(kind)
		}
		ti.problem = "is " + what + ", not a table"
		return ti, nil
	}

	// Domains are resolved to their base type, however deeply nested.
	rows, err := q.Query(ctx, `WITH RECURSIVE cols AS (
  SELECT a.attname::text AS name, a.atttypid AS typ, format_type(a.atttypid, a.atttypmod) AS shown,
    a.attnotnull, a.atthasdef, a.attidentity::text AS ident, a.attgenerated::text <> '' AS generated
  FROM pg_attribute a WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped),
base AS (
  SELECT name, typ, 0 AS depth FROM cols
  UNION ALL
  SELECT b.name, t.typbasetype, b.depth + 1 FROM base b JOIN pg_type t ON t.oid = b.typ WHERE t.typtype = 'd')
SELECT c.name, c.shown, c.attnotnull, c.atthasdef, c.ident, c.generated,
  (SELECT b.typ FROM base b WHERE b.name = c.name ORDER BY b.depth DESC LIMIT 1)
FROM cols c`, ti.oid)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", ident, err)
	}
	for rows.Next() {
		var n string
		var c columnInfo
		if err := rows.Scan(&n, &c.typ, &c.notNull, &c.hasDefault, &c.identity, &c.generated, &c.baseType); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read columns of %s: %w", ident, err)
		}
		ti.cols[n] = c
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", ident, err)
	}

	// ON CONFLICT (cols) infers a unique index whose key columns are exactly
	// cols; it cannot use a partial or expression index without naming its
	// predicate or expressions, nor a deferrable constraint. INCLUDE columns
	// are not key columns.
	rows, err = q.Query(ctx, `SELECT ARRAY(
    SELECT a.attname::text FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS k(attnum, ord)
    JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE k.ord <= i.indnkeyatts)
FROM pg_index i
WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indimmediate
  AND i.indpred IS NULL AND i.indexprs IS NULL`, ti.oid)
	if err != nil {
		return nil, fmt.Errorf("read unique indexes of %s: %w", ident, err)
	}
	for rows.Next() {
		var cols []string
		if err := rows.Scan(&cols); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read unique indexes of %s: %w", ident, err)
		}
		slices.Sort(cols)
		ti.uniques = append(ti.uniques, cols)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read unique indexes of %s: %w", ident, err)
	}
	return ti, nil
}

// numericTypes are the base types an inc column may have (OIDs are fixed
// in PostgreSQL's catalog): the ones `column + value` works on for any
// number a rule gives.
var numericTypes = map[uint32]bool{
	21:   true, // smallint
	23:   true, // integer
	20:   true, // bigint
	1700: true, // numeric
	700:  true, // real
	701:  true, // double precision
}

// target checks one data rule's table, columns and privileges.
func (ck *checker) target(ctx context.Context, scope string, t rules.Target) error {
	ti, ok := ck.tables[t.Table]
	if !ok {
		var err error
		if ti, err = lookupTable(ctx, ck.c.target, t.Table); err != nil {
			return err
		}
		ck.tables[t.Table] = ti
	}
	tobj := fmt.Sprintf("table %q", t.Table)
	if ti.problem != "" {
		ck.add(scope, tobj, "%s", ti.problem)
		return nil
	}
	colObj := func(c string) string { return fmt.Sprintf("%s column %q", tobj, c) }

	// Every column, once, in key, set, inc order.
	var all []string
	for _, c := range slices.Concat(t.KeyColumns, t.SetColumns, t.IncColumns) {
		if !slices.Contains(all, c) {
			all = append(all, c)
		}
	}
	var present []string
	for _, c := range all {
		if _, ok := ti.cols[c]; ok {
			present = append(present, c)
		} else {
			ck.add(scope, colObj(c), "does not exist")
		}
	}
	exists := func(cs []string) []string {
		return slices.DeleteFunc(slices.Clone(cs), func(c string) bool { _, ok := ti.cols[c]; return !ok })
	}

	for _, c := range exists(t.IncColumns) {
		if col := ti.cols[c]; !numericTypes[col.baseType] {
			ck.add(scope, colObj(c), "type %s cannot take inc (it needs smallint, integer, bigint, numeric, real or double precision)", col.typ)
		}
	}

	// What the op's statement writes follows from the privileges it needs.
	inserts := false
	var written []string
	for _, p := range apply.Privileges(t.Op, exists(t.KeyColumns), exists(t.SetColumns), exists(t.IncColumns)) {
		switch p.Name {
		case "INSERT":
			inserts = true
			written = append(written, p.Columns...)
		case "UPDATE":
			written = append(written, p.Columns...)
		}
	}
	slices.Sort(written)
	written = slices.Compact(written)
	for _, c := range written {
		col := ti.cols[c]
		switch {
		case col.generated:
			ck.add(scope, colObj(c), "is a generated column: %s cannot write it", t.Op)
		case col.identity == "a":
			ck.add(scope, colObj(c), "is GENERATED ALWAYS AS IDENTITY: %s cannot write it", t.Op)
		}
	}
	if inserts {
		var names []string
		for n := range ti.cols {
			names = append(names, n)
		}
		slices.Sort(names)
		for _, n := range names {
			col := ti.cols[n]
			if col.notNull && !col.hasDefault && col.identity == "" && !col.generated && !slices.Contains(all, n) {
				ck.add(scope, colObj(n), "is NOT NULL without a default, and the rule does not set it: every %s would fail", t.Op)
			}
		}
	}

	if apply.NeedsUniqueKey(t.Op) && len(t.KeyColumns) > 0 {
		key := slices.Sorted(slices.Values(t.KeyColumns))
		if !slices.ContainsFunc(ti.uniques, func(u []string) bool { return slices.Equal(u, key) }) {
			ck.add(scope, fmt.Sprintf("%s key (%s)", tobj, strings.Join(key, ", ")),
				"no unique index or constraint on exactly these columns for ON CONFLICT (a partial, expression or deferrable one does not count)")
		}
	}

	return ck.privileges(ctx, scope, tobj, ti, t, exists)
}

// privileges checks what the op's statement needs (see the file comment).
func (ck *checker) privileges(ctx context.Context, scope, tobj string, ti *tableInfo, t rules.Target, exists func([]string) []string) error {
	need := apply.Privileges(t.Op, exists(t.KeyColumns), exists(t.SetColumns), exists(t.IncColumns))
	for _, n := range need {
		var onTable bool
		if err := ck.c.target.QueryRow(ctx, "SELECT has_table_privilege($1::oid, $2)", ti.oid, n.Name).Scan(&onTable); err != nil {
			return fmt.Errorf("check privileges on %s: %w", tobj, err)
		}
		if onTable {
			continue
		}
		// No table-wide privilege: column grants may still cover it
		// (DELETE has no column form). With none at all, one line says so.
		anyColumn := false
		if len(n.Columns) > 0 {
			if err := ck.c.target.QueryRow(ctx, "SELECT has_any_column_privilege($1::oid, $2)", ti.oid, n.Name).Scan(&anyColumn); err != nil {
				return fmt.Errorf("check privileges on %s: %w", tobj, err)
			}
		}
		if !anyColumn {
			ck.add(scope, tobj, "role %q lacks %s (%s needs it)", ck.role, n.Name, t.Op)
			continue
		}
		var lacking []string
		for _, c := range n.Columns {
			var ok bool
			if err := ck.c.target.QueryRow(ctx, "SELECT has_column_privilege($1::oid, $2, $3)", ti.oid, c, n.Name).Scan(&ok); err != nil {
				return fmt.Errorf("check privileges on %s: %w", tobj, err)
			}
			if !ok {
				lacking = append(lacking, c)
			}
		}
		for _, c := range lacking {
			ck.add(scope, fmt.Sprintf("%s column %q", tobj, c), "role %q lacks %s (%s needs it)", ck.role, n.Name, t.Op)
		}
	}
	return nil
}

// sqlRule prepares an sql rule's statement on the target, unnamed, which
// parses and analyses it without running it.
func (ck *checker) sqlRule(ctx context.Context, scope string, rs rules.RuleSpec) {
	desc, err := ck.c.target.PgConn().Prepare(ctx, "", rs.SQL, nil)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		ck.add(scope, "sql", "%s (%s)", pgErr.Message, pgErr.Code)
	case err != nil:
		ck.add(scope, "sql", "cannot be prepared: %v", err)
	case len(desc.ParamOIDs) != len(rs.Args):
		ck.add(scope, "sql", "takes %d parameters, args gives %d", len(desc.ParamOIDs), len(rs.Args))
	}
}

// feedSlots are the slots the configuration's groups stream from, one
// per group (a group of one streams from its version's own slot).
func feedSlots(cfg *config.Config) []string {
	var out []string
	for _, idx := range cfg.Groups() {
		out = append(out, cfg.FeedSlot(cfg.Projections[idx[0]]))
	}
	slices.Sort(out)
	return out
}

// replicationRoom is what the source server has of replication slots and
// WAL senders, and how many of them the configuration's groups hold.
type replicationRoom struct {
	maxSlots, usedSlots, ourSlots       int
	maxSenders, usedSenders, ourSenders int
}

// problems says what the server lacks for groups groups: a slot each
// (those not created yet must fit in the free ones) and a WAL sender
// each for its stream (those not streaming now must fit). A group's
// members build together from its one slot; only a version that builds
// beside a running group, or a member dropped from its group's scan,
// holds a slot and a WAL sender of its own until it joins, which this
// leaves to the headroom.
func (r replicationRoom) problems(groups int) []string {
	var out []string
	if need, free := groups-r.ourSlots, r.maxSlots-r.usedSlots; need > free {
		out = append(out, fmt.Sprintf("max_replication_slots is %d with %d in use: the configuration's %d groups stream from a slot each, %d of which do not exist yet: raise it by %d, or put more projections in one group",
			r.maxSlots, r.usedSlots, groups, need, need-free))
	}
	if need, free := groups-r.ourSenders, r.maxSenders-r.usedSenders; need > free {
		out = append(out, fmt.Sprintf("max_wal_senders is %d with %d in use: the configuration's %d groups stream on a replication connection each, %d of which are not streaming now: raise it by %d, or put more projections in one group",
			r.maxSenders, r.usedSenders, groups, need, need-free))
	}
	return out
}
