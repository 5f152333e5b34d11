package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
)

// W9 is big events: documents of 64 KB and 256 KB in every event's data
// (a "doc" field no rule reads), the balances projection over them, each
// size run twice in the same run: as a first start (the backfill reads
// them from the table) and as a WAL catch-up (the engine went live on an
// empty table and was stopped; the events appended meanwhile stream from
// the slot). The figures are the time and the engine's peak RSS of each:
// the backfill's memory is bounded by [engine] buffer_mb as the stream's
// is, so big events make smaller batches, not a bigger process.

// w9Sizes are the document sizes of W9, in bytes.
var w9Sizes = []int64{64 << 10, 256 << 10}

// w9Events is how many events each W9 run holds (before -scale).
const w9Events = 20_000

func (b *bench) w9(ctx context.Context) error {
	n := b.opts.scaled(w9Events)
	hist := newHistory(n, max(n/10, 1), max(n/100, 1))
	w := b.res.workload("W9", "big events: backfill and WAL catch-up of 64 KB and 256 KB documents",
		fmt.Sprintf("%s events over %s streams, each with a document of 64 KB, then of 256 KB, in its data; balances; "+
			"first start (backfill) beside WAL catch-up (appended while the engine was stopped), peak RSS of each",
			thousands(hist.events()), thousands(hist.streams)), hist.events())
	for _, size := range w9Sizes {
		hist.pad = size
		kb := size >> 10
		backfill, err := b.w9Run(ctx, w, hist, fmt.Sprintf("W9b%d", kb), fmt.Sprintf("backfill, %d KB events", kb), true)
		if err != nil {
			return err
		}
		catchUp, err := b.w9Run(ctx, w, hist, fmt.Sprintf("W9c%d", kb), fmt.Sprintf("WAL catch-up, %d KB events", kb), false)
		if err != nil {
			return err
		}
		say("W9 %d KB: backfill %.1f s, peak RSS %.0f MB; WAL catch-up %.1f s, peak RSS %.0f MB; backfill ÷ catch-up %.2f×",
			kb, backfill.Seconds, backfill.PeakRSSMB, catchUp.Seconds, catchUp.PeakRSSMB, backfill.Seconds/catchUp.Seconds)
	}
	return nil
}

// w9Run measures one W9 case in a database of its own and adds its row.
func (b *bench) w9Run(ctx context.Context, w *Workload, hist history, id, label string, backfill bool) (Row, error) {
	targets := targetsOf([]model{balancesModel}, 1)
	db, cfg, err := b.setup(ctx, id, targets)
	if err != nil {
		return Row{}, err
	}
	defer b.srv.drop(context.WithoutCancel(ctx), db)
	if !backfill {
		// Live on the empty table, then stopped: the history is appended
		// behind its slot.
		if err := b.firstStartEmpty(ctx, db, cfg, filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-first-start.log"), targets); err != nil {
			return Row{}, err
		}
	}
	// Small transactions: a WAL catch-up of one transaction of gigabytes
	// would measure the walsender's spill to disk, not the engine.
	if err := b.fill(ctx, w, db, hist, 100); err != nil {
		return Row{}, err
	}
	w.Load = loadAverage()
	say("%s: engine %s (load %s) …", id, label, w.Load)
	logPath := filepath.Join(b.opts.rawDir, strings.ToLower(id)+"-engine.log")
	r, err := b.measure(ctx, db, func() (*engineProc, error) { return startBinary(b.opts.bin, cfg, logPath) }, targets, hist.events(), backfill)
	if err != nil {
		return Row{}, err
	}
	rows := r.rows("pgscribe, " + label)
	w.Rows = append(w.Rows, rows...)
	say("%s: engine %s", id, rows[0].summary())
	// Exact: the SQL ceiling's read model, EXCEPT ALL both ways.
	if _, err := b.sqlCeiling(ctx, db, balancesModel, hist.events()); err != nil {
		return Row{}, err
	}
	diff, err := sameAsCeiling(ctx, db, balancesModel)
	if err != nil {
		return Row{}, err
	}
	w.Checks = append(w.Checks, Check{Projection: balancesModel.projection + " (" + label + ")", DifferingRows: diff})
	if diff != 0 {
		say("%s: WARNING: %s differs from the SQL ceiling's read model in %d rows", id, balancesModel.table, diff)
	}
	return rows[0], nil
}
