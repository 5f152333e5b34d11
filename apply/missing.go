package apply

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// Updates and deletes that match no row. Each is counted per rule
// (pgscribe_rows_missing_total); an intent whose rule says
// if_missing = "dead_letter" also dead-letters its event. Under the
// default, ignore, a statement's command tag is the whole cost: its row
// count says how many rows missed. A statement returns which of its rows
// matched (RETURNING the input row's ordinal) only where a count cannot
// say whose the misses are: rows of several rules, folded rows, or a
// dead_letter rule among them.

// missTally collects the misses of one batch attempt's statements.
type missTally struct {
	counts map[string]int  // rule → intents that matched no row
	dead   []*event.Intent // misses of if_missing = "dead_letter" rules
}

// miss records that the given intents matched no row.
func (m *missTally) miss(ins []*event.Intent) {
	if m.counts == nil {
		m.counts = map[string]int{}
	}
	for _, in := range ins {
		m.counts[in.Rule]++
		if in.DeadLetterIfMissing {
			m.dead = append(m.dead, in)
		}
	}
}

// read reads the result of g's statement and records its misses.
func (m *missTally) read(br pgx.BatchResults, g *group) error {
	if !g.returning {
		tag, err := br.Exec()
		if err != nil {
			return err
		}
		n := len(g.rows) - int(tag.RowsAffected())
		switch {
		case n <= 0:
		case len(g.rows) == 1 && len(g.folds) == 0:
			m.miss(g.rows)
		default:
			if m.counts == nil {
				m.counts = map[string]int{}
			}
			m.counts[g.first.Rule] += n
		}
		return nil
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	matched := make([]bool, len(g.rows))
	var ord int32
	for rows.Next() {
		if err := rows.Scan(&ord); err != nil {
			rows.Close()
			return err
		}
		if ord >= 1 && int(ord) <= len(matched) {
			matched[ord-1] = true
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	var folded map[int][]*event.Intent
	for i, ok := range matched {
		if ok {
			continue
		}
		if folded == nil && len(g.folds) > 0 {
			folded = g.sources()
		}
		if src, ok := folded[i]; ok {
			m.miss(src)
		} else {
			m.miss(g.rows[i : i+1])
		}
	}
	return nil
}

// missingError: intents of if_missing = "dead_letter" rules matched no
// row. The attempt was rolled back; their events are dead-lettered and the
// batch is tried again without them.
type missingError struct {
	intents []*event.Intent
}

func (e *missingError) Error() string {
	return fmt.Sprintf("%d write(s) of if_missing = \"dead_letter\" rules matched no row", len(e.intents))
}

// missingMessage is the dead-letter message of a missed intent.
func missingMessage(in *event.Intent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s matched no row of %s where ", in.Op, in.Table)
	for i, c := range in.Key {
		if i > 0 {
			b.WriteString(" and ")
		}
		fmt.Fprintf(&b, "%s = %v", c.Name, c.Value)
	}
	b.WriteString(` (if_missing = "dead_letter")`)
	return b.String()
}

// writeFailure is the dead-letter kind and message of an event whose
// writes failed for good when applied on its own (a retried dead letter,
// a released held event): a miss of an if_missing = "dead_letter" rule is
// missing:<rule> with the row it missed, as in a batch; anything else a
// commit-time failure, commit:<SQLSTATE> (<name>). A retried miss was
// recorded as "commit:" with no SQLSTATE, which verify then reported as
// drift against its rebuild's missing:<rule> (campaign seed 2032).
func writeFailure(err error) (kind, message string) {
	var miss *missingError
	if errors.As(err, &miss) && len(miss.intents) > 0 {
		return "missing:" + miss.intents[0].Rule, missingMessage(miss.intents[0])
	}
	return "commit:" + sqlstate.Describe(err), err.Error()
}

// markMissing dead-letters the events that own the missed intents. The
// intents are pointers into evals (attempts share the evaluations' intent
// slices).
func markMissing(evals []planned, missed []*event.Intent) {
	set := make(map[*event.Intent]bool, len(missed))
	for _, in := range missed {
		set[in] = true
	}
	for p := range applying(evals) {
		for j := range p.intents {
			in := &p.intents[j]
			if set[in] {
				p.out = outDead
				p.kind = "missing:" + in.Rule
				p.message = missingMessage(in)
				p.intents = nil
				break
			}
		}
	}
}

// hasDeadLetterIfMissing reports whether a batch's intents include one
// whose miss dead-letters its event: such a batch reads its writes'
// results before it sends COMMIT.
func hasDeadLetterIfMissing(intents []*event.Intent) bool {
	for _, in := range intents {
		if in.DeadLetterIfMissing {
			return true
		}
	}
	return false
}
