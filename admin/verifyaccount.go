package admin

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5"
)

// accountDiff is a difference in how an event or a stream was accounted
// for: a dead letter on one side only, or per-stream counts (applied,
// skipped, dead-lettered) that differ.
type accountDiff struct {
	stream         string
	text           string
	orderDependent bool
}

// liveDeadLetters is the snapshot copy of the version's dead letters.
func (s *scratch) liveDeadLetters() string {
	return pgx.Identifier{s.schema, "pgscribe_live_dead_letters"}.Sanitize()
}

// account compares the live accounting (dead letters, per-stream counts)
// with the rebuild's. A dead letter of a commit-time failure differs
// legitimately when the projection has rows several streams write
// non-commutatively (two streams
// inserting one key: which one fails follows the commit order), so such
// differences, and the counts of their streams, are order-dependent.
func (rep *driftReport) account(ctx context.Context, conn *pgx.Conn, s *scratch) error {
	// Any shared row, differing or not: two streams inserting one key
	// with the same values leave equal rows but different dead letters.
	orderDep := rep.shared
	rebuilt := pgx.Identifier{s.schema, "dead_letters"}.Sanitize()
	rows, err := conn.Query(ctx, fmt.Sprintf(`SELECT 'live', * FROM (SELECT stream_id, stream_position, error_kind FROM %[1]s
  EXCEPT ALL SELECT stream_id, stream_position, error_kind FROM %[2]s) l
UNION ALL
SELECT 'rebuild', * FROM (SELECT stream_id, stream_position, error_kind FROM %[2]s
  EXCEPT ALL SELECT stream_id, stream_position, error_kind FROM %[1]s) r
ORDER BY 2, 3`, s.liveDeadLetters(), rebuilt))
	if err != nil {
		return fmt.Errorf("compare dead letters: %w", err)
	}
	odStreams := map[string]bool{}
	for rows.Next() {
		var side, stream, kind string
		var pos int64
		if err := rows.Scan(&side, &stream, &pos, &kind); err != nil {
			rows.Close()
			return fmt.Errorf("compare dead letters: %w", err)
		}
		d := accountDiff{stream: stream, orderDependent: orderDep > 0 && strings.HasPrefix(kind, "commit:")}
		if side == "live" {
			d.text = fmt.Sprintf("dead letter stream %s #%d (%s): live only, the rebuild applied or skipped the event", stream, pos, kind)
		} else {
			d.text = fmt.Sprintf("dead letter stream %s #%d (%s): rebuild only, live applied or skipped the event", stream, pos, kind)
		}
		if d.orderDependent {
			odStreams[stream] = true
		}
		rep.accounts = append(rep.accounts, d)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("compare dead letters: %w", err)
	}
	rows, err = conn.Query(ctx, fmt.Sprintf(`SELECT l.stream_id, l.applied, l.skipped, l.dead_lettered,
  coalesce(r.applied, 0), coalesce(r.skipped, 0), coalesce(r.dead_lettered, 0)
FROM %s l LEFT JOIN %s r ON r.stream_id = l.stream_id
WHERE (l.applied, l.skipped, l.dead_lettered) IS DISTINCT FROM (r.applied, r.skipped, r.dead_lettered)
ORDER BY l.stream_id`, pgx.Identifier{s.schema, "pgscribe_live_cursors"}.Sanitize(), pgx.Identifier{s.schema, "cursors"}.Sanitize()))
	if err != nil {
		return fmt.Errorf("compare stream counts: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var stream string
		var la, ls, ld, ra, rs, rd int64
		if err := rows.Scan(&stream, &la, &ls, &ld, &ra, &rs, &rd); err != nil {
			return fmt.Errorf("compare stream counts: %w", err)
		}
		rep.accounts = append(rep.accounts, accountDiff{stream: stream, orderDependent: odStreams[stream],
			text: fmt.Sprintf("stream %s: live applied %d, skipped %d, dead-lettered %d; rebuild %d, %d, %d", stream, la, ls, ld, ra, rs, rd)})
	}
	return rows.Err()
}

// writeAccounting prints the accounting differences, up to the limit, and
// returns how many are drift (not order-dependent).
func (rep *driftReport) writeAccounting(w io.Writer) int {
	drift, od := 0, 0
	for _, d := range rep.accounts {
		if d.orderDependent {
			od++
		} else {
			drift++
		}
	}
	if drift+od == 0 {
		fmt.Fprintln(w, "accounting: every stream's applied, skipped and dead-lettered events agree")
		return 0
	}
	fmt.Fprintf(w, "accounting: %d differences", drift)
	if od > 0 {
		fmt.Fprintf(w, ", %d order-dependent", od)
	}
	fmt.Fprintln(w)
	for i, d := range rep.accounts {
		if i == rep.limit {
			break
		}
		prefix := "  "
		if d.orderDependent {
			prefix += "(order-dependent) "
		}
		fmt.Fprintln(w, prefix+d.text)
	}
	return drift
}
