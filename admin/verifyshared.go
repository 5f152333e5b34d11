package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
)

// Rows several streams write with set, insert or delete hold what the
// last committed batch wrote, and the cross-stream commit order is not in
// the events. But the outcomes the engine can legitimately leave are
// known: batches apply each stream's events in its order, so whatever
// the interleaving, a row that exists at the end holds in each column the
// value of the last applied assignment to it since the row was last
// created, and that assignment is the last one of its own stream (a later
// one of that stream would come later still, and apply, since the row
// exists until the end). A stream's assignments before its own later
// delete cannot be that value either. So verify records, per shared row
// and stream, the stream's last op and its last assigned value of every
// column (over the events the live version applied: its commit-time dead
// letters are left out) and requires of the live row:
//
//   - present only if some stream's last op leaves it present (insert,
//     upsert, or update); absent only if some stream's last op can leave
//     it absent (delete, or an update that missed);
//   - each differing column equal to some stream's last assignment.
//
// That is a check per row and column, not of one global order across
// rows: it never reports a legitimate outcome, and reports every value no
// stream's last write gives. Columns it cannot decide (see undecidable)
// are reported as such, not as drift.

// streamWrite is one stream's last write to a shared row.
type streamWrite struct {
	pos  int64
	op   event.Op
	vals map[string]any // column → last value assigned, since its last delete
}

// rowWrites is what verify records of every write to one row.
type rowWrites struct {
	streams map[string]*streamWrite
	inc     map[string]bool   // columns an intent adds to
	set     map[string]bool   // columns an update or upsert sets
	omits   map[string]string // column → a rule that creates the row without it
	other   bool              // an intent other than upsert writes the row
}

// record notes intent in of an event of stream at pos; compared is the
// table's compared columns (nil: not known); applied says the live
// version applied the event (it did not dead-letter it).
func (r *rowWrites) record(stream string, pos int64, in event.Intent, compared []string, applied bool) {
	if r.streams == nil {
		r.streams, r.inc, r.set, r.omits = map[string]*streamWrite{}, map[string]bool{}, map[string]bool{}, map[string]string{}
	}
	if in.Op != event.OpUpsert {
		r.other = true
	}
	for _, c := range in.Inc {
		r.inc[c.Name] = true
	}
	if in.Op == event.OpUpdate || in.Op == event.OpUpsert {
		for _, c := range in.Set {
			r.set[c.Name] = true
		}
	}
	if in.Op == event.OpInsert || in.Op == event.OpUpsert {
		for _, c := range compared {
			if _, ok := columnValue(in, c); !ok && !slices.ContainsFunc(in.Inc, func(x event.Column) bool { return x.Name == c }) {
				if _, done := r.omits[c]; !done {
					r.omits[c] = in.Rule
				}
			}
		}
	}
	if !applied {
		return
	}
	sw := r.streams[stream]
	if sw == nil {
		sw = &streamWrite{vals: map[string]any{}}
		r.streams[stream] = sw
	}
	if pos < sw.pos {
		return // a retried batch evaluated again: its events are older
	}
	sw.pos, sw.op = pos, in.Op
	switch in.Op {
	case event.OpDelete:
		clear(sw.vals)
	case event.OpInsert:
		for _, group := range [][]event.Column{in.Key, in.Set, in.Inc} {
			for _, c := range group {
				sw.vals[c.Name] = c.Value
			}
		}
	case event.OpUpdate, event.OpUpsert:
		for _, group := range [][]event.Column{in.Key, in.Set} {
			for _, c := range group {
				sw.vals[c.Name] = c.Value
			}
		}
	}
}

// presence says whether some stream's last write can leave the row
// present, and whether one can leave it absent.
func (r *rowWrites) presence() (present, absent bool) {
	for _, sw := range r.streams {
		switch sw.op {
		case event.OpInsert, event.OpUpsert:
			present = true
		case event.OpUpdate:
			present, absent = true, true
		case event.OpDelete:
			absent = true
		}
	}
	return present, absent
}

// modes sorts the compared columns of a shared row: exact ones must equal
// the rebuild (a sum only upserts add to commutes, if both sides applied
// the same events: deadDiffer says their commit-time dead letters
// differ), undecidable ones (with the reason) are not checked, the others
// are checked against the streams' last assignments.
func (r *rowWrites) modes(cols []string, deadDiffer bool) (exact []string, undecidable map[string]string) {
	undecidable = map[string]string{}
	for _, c := range cols {
		switch {
		case r.inc[c] && r.set[c]:
			undecidable[c] = "set and inc on one column by several streams: the sum depends on which set came last"
		case r.inc[c] && r.other:
			undecidable[c] = "inc on a row several streams write with insert, update or delete: the sum depends on whether the row existed at each inc"
		case r.inc[c] && deadDiffer:
			undecidable[c] = "the live version and the rebuild dead-lettered different events at commit (a constraint the commit order decides): the sum depends on which incs applied"
		case r.inc[c]:
			exact = append(exact, c)
		case r.omits[c] != "":
			undecidable[c] = fmt.Sprintf("rule %s creates the row without this column: its default cannot be rebuilt", r.omits[c])
		}
	}
	return exact, undecidable
}

// storeShared writes the shared rows of t into two scratch tables the
// diff joins with: pgscribe_orderdep__t (key, whether present and absent
// are legitimate, the exact and undecidable columns) and pgscribe_cand__t
// (key, one stream's last assigned values typed as t's columns, and which
// columns it assigned).
func storeShared(ctx context.Context, conn *pgx.Conn, s *scratch, t string, key, cols []string, rows []*writer, deadDiffer bool) error {
	od := keyTable(s, "pgscribe_orderdep__", t)
	cand := keyTable(s, "pgscribe_cand__", t)
	all := slices.Clone(key)
	for _, c := range cols {
		if !slices.Contains(all, c) {
			all = append(all, c)
		}
	}
	for _, stmt := range []string{
		fmt.Sprintf("CREATE TABLE %s AS SELECT %s FROM %s WITH NO DATA", od, quoteColumns(key), s.ident(t)),
		fmt.Sprintf("ALTER TABLE %s ADD pgscribe_present boolean, ADD pgscribe_absent boolean, ADD pgscribe_exact text[], ADD pgscribe_undecidable jsonb", od),
		fmt.Sprintf("CREATE TABLE %s AS SELECT %s FROM %s WITH NO DATA", cand, quoteColumns(all), s.ident(t)),
		fmt.Sprintf("ALTER TABLE %s ADD pgscribe_stream text, ADD pgscribe_assigned text[]", cand),
	} {
		if _, err := conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("create shared-row tables for %s: %w", t, err)
		}
	}
	var ods, cands []map[string]any
	for _, wr := range rows {
		o := map[string]any{}
		for i, c := range key {
			o[c] = wr.keyValue[i]
		}
		present, absent := wr.writes.presence()
		exact, undecidable := wr.writes.modes(cols, deadDiffer)
		o["pgscribe_present"], o["pgscribe_absent"], o["pgscribe_exact"], o["pgscribe_undecidable"] = present, absent, exact, undecidable
		ods = append(ods, o)
		for stream, sw := range wr.writes.streams {
			c := map[string]any{"pgscribe_stream": stream}
			var assigned []string
			for col, v := range sw.vals {
				c[col] = v
				assigned = append(assigned, col)
			}
			for i, k := range key {
				c[k] = wr.keyValue[i]
			}
			sort.Strings(assigned)
			c["pgscribe_assigned"] = assigned
			cands = append(cands, c)
		}
	}
	if err := insertJSON(ctx, conn, od, t, ods); err != nil {
		return err
	}
	if err := insertJSON(ctx, conn, cand, t, cands); err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "ANALYZE "+od+", "+cand); err != nil {
		return fmt.Errorf("analyze shared-row tables of %s: %w", t, err)
	}
	return nil
}

// insertJSON inserts objs into table ident, in chunks, each object's
// values cast to the table's column types by PostgreSQL.
func insertJSON(ctx context.Context, conn *pgx.Conn, ident, t string, objs []map[string]any) error {
	const chunk = 10000
	for len(objs) > 0 {
		n := min(chunk, len(objs))
		b, err := json.Marshal(objs[:n])
		if err != nil {
			return fmt.Errorf("encode rows of %s: %w", t, err)
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO %s SELECT * FROM jsonb_populate_recordset(NULL::%s, $1::jsonb)", ident, ident), string(b)); err != nil {
			return fmt.Errorf("store rows of %s: %w", t, err)
		}
		objs = objs[n:]
	}
	return nil
}

// sharedChecks renders, for the diff of a table with key and compared
// columns cols (l: live, e: rebuild, o: the shared-row table), whether
// the row's presence is illegitimate, the columns no stream's last write
// explains, and the undecidable columns that differ.
func sharedChecks(s *scratch, t string, key, cols []string) (presence, bad, undecided string) {
	k0 := pgx.Identifier{key[0]}.Sanitize()
	match := make([]string, len(key))
	for i, k := range key {
		c := pgx.Identifier{k}.Sanitize()
		match[i] = fmt.Sprintf("w.%s = l.%s", c, c)
	}
	var badCols, undCols []string
	for _, col := range cols {
		if slices.Contains(key, col) {
			continue
		}
		c := pgx.Identifier{col}.Sanitize()
		lit := "'" + strings.ReplaceAll(col, "'", "''") + "'"
		differs := fmt.Sprintf("l.%[1]s IS NOT NULL AND o.%[1]s IS NOT NULL AND (e.%[1]s IS NULL OR l.%[2]s IS DISTINCT FROM e.%[2]s)", k0, c)
		unexplained := fmt.Sprintf("(%[1]s = ANY(o.pgscribe_exact) OR NOT EXISTS (SELECT 1 FROM %[2]s w WHERE %[3]s AND %[1]s = ANY(w.pgscribe_assigned) AND w.%[4]s IS NOT DISTINCT FROM l.%[4]s))",
			lit, keyTable(s, "pgscribe_cand__", t), strings.Join(match, " AND "), c)
		badCols = append(badCols, fmt.Sprintf("CASE WHEN %s AND NOT o.pgscribe_undecidable ? %s AND %s THEN %s END", differs, lit, unexplained, lit))
		undCols = append(undCols, fmt.Sprintf("CASE WHEN %s AND o.pgscribe_undecidable ? %s THEN %s END", differs, lit, lit))
	}
	presence = fmt.Sprintf("o.%[1]s IS NOT NULL AND CASE WHEN l.%[1]s IS NULL THEN NOT o.pgscribe_absent WHEN e.%[1]s IS NULL THEN NOT o.pgscribe_present ELSE false END", k0)
	arr := func(parts []string) string {
		if len(parts) == 0 {
			return "ARRAY[]::text[]"
		}
		return "array_remove(ARRAY[" + strings.Join(parts, ", ") + "]::text[], NULL)"
	}
	return presence, arr(badCols), arr(undCols)
}

func deadKey(stream string, pos int64) string { return fmt.Sprintf("%s\x00%d", stream, pos) }

// liveDeadLettered reads the snapshot of the live dead letters: the
// events whose writes never applied live.
func liveDeadLettered(ctx context.Context, conn *pgx.Conn, s *scratch) (map[string]bool, error) {
	rows, err := conn.Query(ctx, "SELECT stream_id, stream_position FROM "+s.liveDeadLetters())
	if err != nil {
		return nil, fmt.Errorf("read dead-letter snapshot: %w", err)
	}
	dead := map[string]bool{}
	var stream string
	var pos int64
	if _, err := pgx.ForEachRow(rows, []any{&stream, &pos}, func() error {
		dead[deadKey(stream, pos)] = true
		return nil
	}); err != nil {
		return nil, fmt.Errorf("read dead-letter snapshot: %w", err)
	}
	return dead, nil
}

// commitDeadLettersDiffer reports whether the live version and the
// rebuild dead-lettered different events at commit time.
func commitDeadLettersDiffer(ctx context.Context, conn *pgx.Conn, s *scratch) (bool, error) {
	var differ bool
	err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT EXISTS (
  (SELECT stream_id, stream_position FROM %[1]s WHERE error_kind LIKE 'commit:%%'
   EXCEPT SELECT stream_id, stream_position FROM %[2]s WHERE error_kind LIKE 'commit:%%')
  UNION ALL
  (SELECT stream_id, stream_position FROM %[2]s WHERE error_kind LIKE 'commit:%%'
   EXCEPT SELECT stream_id, stream_position FROM %[1]s WHERE error_kind LIKE 'commit:%%'))`,
		s.liveDeadLetters(), pgx.Identifier{s.schema, "dead_letters"}.Sanitize())).Scan(&differ)
	if err != nil {
		return false, fmt.Errorf("compare commit-time dead letters: %w", err)
	}
	return differ, nil
}
