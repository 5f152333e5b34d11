package admin

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/pgscribe/pgscribe/rules"
)

// VerifyResult is what `pgscribe verify -json` prints: one object, the
// same figures as the text report. Drift counts the differences that are
// drift (rows and accounting); the command exits 1 when it is not 0.
type VerifyResult struct {
	Projection string `json:"projection"`
	Version    int64  `json:"version"`
	Events     int64  `json:"events"`  // events rebuilt
	Streams    int    `json:"streams"` // streams accounted for
	Drift      int    `json:"drift"`
	// SharedLegitimate and Undecidable count rows several streams write
	// that differ from the rebuild as a commit order can leave them, or
	// in columns verify cannot decide: not drift.
	SharedLegitimate int                    `json:"shared_legitimate"`
	Undecidable      int                    `json:"undecidable"`
	Tables           []VerifyTable          `json:"tables"`
	Accounting       []VerifyAccountingDiff `json:"accounting"`
	Seconds          float64                `json:"seconds"`
}

// VerifyTable is one table's comparison; Rows holds up to -limit of the
// rows that differ (all are counted).
type VerifyTable struct {
	Table            string      `json:"table"`
	Key              []string    `json:"key"` // null: compared as a multiset of rows
	Drift            int         `json:"drift"`
	SharedLegitimate int         `json:"shared_legitimate"`
	Undecidable      int         `json:"undecidable"`
	Rows             []VerifyRow `json:"rows"`
}

// VerifyRow is one row that differs: Kind is missing (not live), extra
// (not in the rebuild) or different; Live and Expected are its columns on
// each side (null where absent).
type VerifyRow struct {
	Kind     string         `json:"kind"`
	Drift    bool           `json:"drift"`
	Shared   bool           `json:"shared"` // written by several streams
	Live     map[string]any `json:"live"`
	Expected map[string]any `json:"expected"`
	// BadColumns: columns of a shared row no stream's last write gives;
	// Undecidable: differing columns verify cannot decide.
	BadColumns  []string `json:"bad_columns,omitempty"`
	Undecidable []string `json:"undecidable,omitempty"`
	Text        string   `json:"text"` // the text report's line
}

// VerifyAccountingDiff is one difference in dead letters or per-stream
// counts.
type VerifyAccountingDiff struct {
	Stream         string `json:"stream"`
	OrderDependent bool   `json:"order_dependent"`
	Text           string `json:"text"`
}

// writeJSON prints the report as a VerifyResult and returns ErrDrift as
// write does.
func (rep *driftReport) writeJSON(w io.Writer, spec rules.Spec, events int64, streams int, tables []string, elapsed time.Duration) error {
	res := VerifyResult{Projection: spec.Name, Version: spec.Version, Events: events, Streams: streams,
		Tables: []VerifyTable{}, Accounting: []VerifyAccountingDiff{}, Seconds: elapsed.Seconds()}
	for _, t := range tables {
		vt := VerifyTable{Table: t, Key: rep.keys[t], Drift: rep.drift[t], SharedLegitimate: rep.orderDep[t],
			Undecidable: rep.undecidable[t], Rows: []VerifyRow{}}
		res.Drift += vt.Drift
		res.SharedLegitimate += vt.SharedLegitimate
		res.Undecidable += vt.Undecidable
		for _, r := range rep.rows {
			if r.table != t {
				continue
			}
			vt.Rows = append(vt.Rows, VerifyRow{Kind: r.kind, Drift: !r.orderDependent || r.badPresence || len(r.badColumns) > 0,
				Shared: r.orderDependent, Live: r.live, Expected: r.expected, BadColumns: r.badColumns, Undecidable: r.undecided,
				Text: r.describe(rep.keys[t])})
		}
		res.Tables = append(res.Tables, vt)
	}
	for _, d := range rep.accounts {
		if !d.orderDependent {
			res.Drift++
		}
		if len(res.Accounting) < rep.limit {
			res.Accounting = append(res.Accounting, VerifyAccountingDiff{Stream: d.stream, OrderDependent: d.orderDependent, Text: d.text})
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		return fmt.Errorf("write result: %w", err)
	}
	if res.Drift > 0 {
		return fmt.Errorf("%s v%d: %d differences from a rebuild: %w", spec.Name, spec.Version, res.Drift, ErrDrift)
	}
	return nil
}
