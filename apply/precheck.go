package apply

import (
	"context"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// The pre-check: what the target catalog already says an event's writes
// will fail, found before the batch is sent, so that the commonest poison —
// a text longer than its varchar(n) or char(n) column (22001) — costs no
// failed transaction and no isolation. The values checked are those a
// write stores: key and set of an insert or upsert, set of an update. The
// event is dead-lettered with the error PostgreSQL would have raised.
//
// This also keeps folding exact: consecutive updates of a row fold into
// one that writes only the last set value, so an earlier event's value
// that does not fit would never reach PostgreSQL. The one difference from
// an event-by-event replay: an update matching no row would store nothing
// and not fail there; its over-long value dead-letters it all the same.

// bound is a bounded character column: its length and its type as
// PostgreSQL names it in errors (character varying(40)).
type bound struct {
	n   int
	typ string
}

// lengths maps a table's bounded character columns (varchar(n), char(n))
// to their bound.
type lengths map[string]bound

// limits caches the bounded columns per table. Safe for concurrent use.
type limits struct{ tableCache[lengths] }

func newLimits() *limits { return &limits{newTableCache[lengths]()} }

// of returns the bounded columns of table, reading the catalog once.
func (l *limits) of(ctx context.Context, q queryer, table string) (lengths, error) {
	return l.get(table, func() (lengths, error) {
		// atttypmod of varchar(n) and char(n) is n + 4 (VARHDRSZ); -1 when
		// unbounded. Domains are left to PostgreSQL.
		rows, err := q.Query(ctx, `SELECT a.attname, a.atttypmod - 4, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
		WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped
		  AND a.atttypid IN ('varchar'::regtype, 'bpchar'::regtype) AND a.atttypmod > 4`, quoteTable(table))
		if err != nil {
			return nil, fmt.Errorf("read column lengths of %s: %w", table, err)
		}
		t := lengths{}
		var name string
		var b bound
		if _, err := pgx.ForEachRow(rows, []any{&name, &b.n, &b.typ}, func() error { t[name] = b; return nil }); err != nil {
			return nil, fmt.Errorf("read column lengths of %s: %w", table, err)
		}
		return t, nil
	})
}

// precheck marks the events of plan whose writes PostgreSQL would refuse
// for a value too long for its column as dead-lettered. q reads the
// catalog. It only runs on a UTF8 server, where a character is a rune.
//
// Column lengths are cached, and a column may have been widened since:
// the tables in which the cache finds a value too long are read again
// before any event is dead-lettered.
func (c *Committer) precheck(ctx context.Context, conn *pgconn.PgConn, q queryer, plan []planned) error {
	if conn.ParameterStatus("server_encoding") != "UTF8" {
		return nil
	}
	stale := map[string]bool{}
	if err := c.eachTooLong(ctx, q, plan, func(_ *planned, in *event.Intent, _ error) { stale[in.Table] = true }); err != nil {
		return err
	}
	if len(stale) == 0 {
		return nil
	}
	c.limits.forget(stale)
	return c.eachTooLong(ctx, q, plan, func(p *planned, _ *event.Intent, failure error) { c.markFailed(p, failure) })
}

// eachTooLong calls found for the first intent of each applying event of
// plan that stores a value too long for its column.
func (c *Committer) eachTooLong(ctx context.Context, q queryer, plan []planned, found func(*planned, *event.Intent, error)) error {
	for p := range applying(plan) {
		for j := range p.intents {
			in := &p.intents[j]
			if storedColumns(in) == nil {
				continue
			}
			lim, err := c.limits.of(ctx, q, in.Table)
			if err != nil {
				return &statementError{table: in.Table, err: err}
			}
			if len(lim) == 0 {
				continue
			}
			if failure := tooLong(in, lim); failure != nil {
				found(p, in, failure)
				break
			}
		}
	}
	return nil
}

// tooLong returns the error PostgreSQL raises for the first value of in
// that does not fit its bounded column, or nil.
func tooLong(in *event.Intent, lim lengths) error {
	for _, cols := range storedColumns(in) {
		for _, col := range cols {
			b, ok := lim[col.Name]
			if !ok {
				continue
			}
			var s string
			if str, ok := col.Value.(string); ok {
				s = str // the common case, without rendering
			} else {
				v, err := textValue(col.Value)
				if err != nil || v == nil {
					continue // rendering errors and NULLs are PostgreSQL's to report
				}
				s = *v
			}
			if len(s) <= b.n {
				continue // no more characters than bytes
			}
			// PostgreSQL cuts excess trailing spaces silently; only other
			// excess characters fail.
			s = strings.TrimRight(s, " ")
			if !utf8.ValidString(s) || utf8.RuneCountInString(s) <= b.n {
				continue
			}
			return fmt.Errorf("rule %s: %w", in.Rule, &statementError{table: in.Table, err: &pgconn.PgError{
				Severity: "ERROR", Code: pgerrcode.StringDataRightTruncationDataException,
				Message:   "value too long for type " + b.typ,
				TableName: in.Table, ColumnName: col.Name,
			}})
		}
	}
	return nil
}

// markFailed dead-letters p for an integrity failure of its writes.
func (c *Committer) markFailed(p *planned, failure error) {
	p.out = outDead
	p.kind = "commit:" + sqlstate.Describe(failure)
	p.message = failure.Error()
	p.sqlstate = sqlstate.Code(failure)
	p.failure = failure
	p.intents = nil
}

// walkCircuit counts the integrity failures of a batch's outcomes in event
// order on circ: an applied event closes it, a failure with the same
// SQLSTATE as the one before adds one. It returns the halt once the circuit
// trips.
func (c *Committer) walkCircuit(plan []planned, circ *circuit) error {
	for i := range plan {
		p := &plan[i]
		switch {
		case p.out == outApply:
			circ.state, circ.count = "", 0
		case p.out == outDead && p.sqlstate != "":
			if circ.state == p.sqlstate {
				circ.count++
			} else {
				circ.state, circ.count = p.sqlstate, 1
			}
			if circ.count >= c.opts.CircuitThreshold {
				return c.halt(fmt.Sprintf("circuit open: %d consecutive events failed with the same integrity error (schema mismatch?)", circ.count), p.failure)
			}
		}
	}
	return nil
}
