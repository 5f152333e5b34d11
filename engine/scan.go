package engine

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/replication"
)

// scan is one read of a slot's snapshot: the slot created on a
// replication connection with an exported snapshot, the snapshot's events
// read in pages, each page in a short transaction of its own, and a scout
// on the slot telling apart the events of transactions committed since
// (replication.Scout), which the stream after the backfill delivers. A
// version alone scans for itself; the members of a group that start
// together share one scan of the group's slot (hub.shareScan), each
// applying every page.
type scan struct {
	slot       string
	consistent event.LSN
	total      int64     // events the snapshot holds
	snapTime   time.Time // commit time of the snapshot's newest events (zero: unknown)

	log         *slog.Logger
	replConn    *pgconn.PgConn
	snapConn    *pgx.Conn
	snap        *replication.Snapshot
	scout       *replication.Scout
	pages       <-chan page
	stopReading func()
}

// openScan creates slot on replConn and opens its snapshot; before, when
// set, runs in the snapshot's transaction before it ends (adoption). The
// scan owns replConn from here on (finish or close closes it).
func openScan(ctx context.Context, cfg *config.Config, src replication.Source, replConn *pgconn.PgConn, slot string,
	log *slog.Logger, before func(*replication.Snapshot) error) (_ *scan, err error) {
	sc := &scan{slot: slot, log: log, replConn: replConn}
	defer func() {
		if err != nil {
			sc.close(ctx)
		}
	}()
	var snapName string
	if sc.consistent, snapName, err = replication.CreateSlot(ctx, replConn, slot); err != nil {
		return nil, atSource(err)
	}
	if sc.snapConn, err = connectForSnapshot(ctx, cfg); err != nil {
		return nil, err
	}
	if sc.snap, err = replication.OpenSnapshot(ctx, sc.snapConn, src, snapName); err != nil {
		return nil, atSource(err)
	}
	sc.total = sc.snap.Total
	// Backfill batches carry no commit time; the snapshot's newest commit
	// stands for the commit time at the watermark (status's COMMITTED, the
	// watermark commit timestamp metric), which would stay unknown until a
	// live event arrived. The snapshot does not change, so it is read
	// before the batches, and an empty ledger transaction after them sets
	// it once they are all accounted for.
	if sc.snapTime, err = snapshotCommitTime(ctx, sc.snapConn, cfg.Source); err != nil {
		log.Warn("commit time of the snapshot's newest events unknown", "err", err)
	}
	if before != nil {
		if err := before(sc.snap); err != nil {
			return nil, err
		}
	}
	if err := sc.snap.Release(ctx); err != nil {
		return nil, atSource(err)
	}
	sc.read(ctx, cfg, src)
	return sc, nil
}

// resumeScan opens again the scan of a backfill that was interrupted on
// slot: nothing confirmed the slot past its consistent point (pt.LSN), so
// a scout streaming it from there tells apart, as the first time, the
// events committed since the snapshot, and the pages go on above pt.After
// up to the snapshot's highest position. Per-stream cursors skip what was
// applied above pt.After before the interruption. The snapshot's commit
// time is not known again: the watermark's commit time stays unknown
// until a live event comes.
func resumeScan(ctx context.Context, cfg *config.Config, src replication.Source, replConn *pgconn.PgConn, slot string,
	log *slog.Logger, pt cursor.BackfillPoint) (_ *scan, err error) {
	sc := &scan{slot: slot, log: log, replConn: replConn, consistent: pt.LSN, total: pt.Total}
	defer func() {
		if err != nil {
			sc.close(ctx)
		}
	}()
	if sc.snapConn, err = connectForSnapshot(ctx, cfg); err != nil {
		return nil, err
	}
	if sc.snap, err = replication.ResumeSnapshot(ctx, sc.snapConn, src, pt.UpTo, pt.After, pt.Total); err != nil {
		return nil, atSource(err)
	}
	sc.read(ctx, cfg, src)
	return sc, nil
}

// connectForSnapshot opens the connection the scan's pages are read on.
func connectForSnapshot(ctx context.Context, cfg *config.Config) (*pgx.Conn, error) {
	snapCfg, err := pgx.ParseConfig(cfg.Database.URL)
	if err != nil {
		return nil, atSource(fmt.Errorf("connect for snapshot: %w", err))
	}
	snapCfg.RuntimeParams["application_name"] = "pgscribe backfill"
	c, err := pgx.ConnectConfig(ctx, snapCfg)
	if err != nil {
		return nil, atSource(fmt.Errorf("connect for snapshot: %w", err))
	}
	return c, nil
}

// read starts the scout on the slot and the reader of the pages.
func (sc *scan) read(ctx context.Context, cfg *config.Config, src replication.Source) {
	sc.scout = replication.StartScout(ctx, sc.replConn, src, sc.consistent, sc.snap.UpTo,
		replication.StreamOptions{StallTimeout: cfg.Engine.StallTimeout, Logger: sc.log})
	sc.pages, sc.stopReading = readPages(ctx, sc.snap, cfg.Engine.BackfillBatchSize, int64(cfg.Engine.BufferMB)<<18)
}

// next returns the next page's events of the snapshot (those committed
// since the consistent point removed: the stream delivers them); more is
// false after the last page.
func (sc *scan) next(ctx context.Context) (evs []*event.Event, more bool, err error) {
	var pg page
	select {
	case pg = <-sc.pages:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if pg.err != nil {
		return nil, false, atSource(pg.err)
	}
	if len(pg.evs) == 0 {
		return nil, false, nil
	}
	// The page holds the snapshot's events and those of transactions
	// committed since, which the stream delivers after the backfill.
	if err := sc.scout.Wait(ctx, pg.seen); err != nil {
		return nil, false, atSlot(err)
	}
	read := len(pg.evs)
	evs = slices.DeleteFunc(pg.evs, func(ev *event.Event) bool { return sc.scout.Streamed(ev.Position) })
	if len(evs) < read {
		sc.log.Info("backfill page: events committed after the snapshot left to the stream", "events", read-len(evs))
	}
	return evs, true, nil
}

// eachPage calls fn with each page's events that next returns, until the
// last page or an error.
func eachPage(ctx context.Context, next func(context.Context) ([]*event.Event, bool, error), fn func([]*event.Event) error) error {
	for {
		evs, more, err := next(ctx)
		if err != nil || !more {
			return err
		}
		if err := fn(evs); err != nil {
			return err
		}
	}
}

// finish ends the scan after its last page: the scout's walsender lets the
// slot go, so that the stream after the backfill reads it from the
// consistent point.
func (sc *scan) finish(ctx context.Context, srcConn *pgx.Conn) error {
	scout := sc.scout
	sc.scout = nil
	if err := scout.Stop(); err != nil {
		return atSlot(err)
	}
	sc.replConn.Close(context.WithoutCancel(ctx))
	sc.replConn = nil
	if err := replication.TerminateSlotHolder(ctx, srcConn, sc.slot); err != nil {
		return atSource(err)
	}
	return nil
}

// close releases what the scan holds (after finish, or instead of it).
func (sc *scan) close(ctx context.Context) {
	if sc.stopReading != nil {
		sc.stopReading()
	}
	if sc.scout != nil {
		_ = sc.scout.Stop()
	}
	if sc.snap != nil {
		_ = sc.snap.Close(ctx)
	}
	if sc.snapConn != nil {
		sc.snapConn.Close(context.WithoutCancel(ctx))
	}
	if sc.replConn != nil {
		sc.replConn.Close(context.WithoutCancel(ctx))
	}
}

// page is one page of a backfill: its events, the WAL position read after
// it (replication.Snapshot.Seen), or why it could not be read.
type page struct {
	evs  []*event.Event
	seen event.LSN
	err  error
}

// readPages reads the snapshot's pages a page ahead of the backfill, which
// waits for the scout to pass each page's WAL position meanwhile: an empty
// page or an error ends them. A page is at most maxBytes, a quarter of
// buffer_mb (the partitions' bound holds the rest, two pages the reader).
// stop ends the reader and waits for it, before the snapshot's connection
// closes.
func readPages(ctx context.Context, snap *replication.Snapshot, n int, maxBytes int64) (pages <-chan page, stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	out := make(chan page, 1)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for {
			evs, err := snap.Next(ctx, n, maxBytes)
			if err == nil && ctx.Err() != nil {
				err = ctx.Err()
			}
			select {
			case out <- page{evs: evs, seen: snap.Seen, err: err}:
			case <-ctx.Done():
				return
			}
			if err != nil || len(evs) == 0 {
				return
			}
		}
	}()
	return out, func() { cancel(); <-ended }
}
