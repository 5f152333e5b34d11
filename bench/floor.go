package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// decodeFloor is W4's reference: PostgreSQL's logical decoding alone at
// each rate. The same producer appends while a consumer that does nothing
// but receive (a temporary pgoutput slot on the engine's publication, as
// the engine streams) times each event from its transaction's commit
// timestamp to its arrival. An engine that also writes its read model and
// commits cannot do better on the same server; engine minus floor is what
// pgscribe adds. Run after the engine's steps, with the engine stopped.
func (b *bench) decodeFloor(ctx context.Context, db *database, prod *producer, publication string, step time.Duration) ([]LatencyRow, error) {
	c, err := startFloorConsumer(ctx, db.dsn, "pgscribe_bench_floor", publication)
	if err != nil {
		return nil, err
	}
	defer c.close()
	// Warm up as the engine's run does.
	if _, err := prod.run(ctx, 200, 2*time.Second); err != nil {
		return nil, err
	}
	var rows []LatencyRow
	for _, rate := range b.opts.w4Rates {
		row := LatencyRow{TargetRate: rate, Seconds: step.Seconds(), Load: loadAverage()}
		say("W4 decode floor: %d events/s for %s (load %s) …", rate, step, row.Load)
		start := time.Now()
		c.record(start)
		sent, err := prod.run(ctx, rate, step)
		if err != nil {
			return nil, err
		}
		row.Achieved = float64(sent) / time.Since(start).Seconds()
		row.Events = sent
		lat, err := c.collect(ctx, sent, 30*time.Second)
		if err != nil {
			return nil, err
		}
		row.P50, row.P99, row.Max = percentile(lat, 0.5), percentile(lat, 0.99), lat[len(lat)-1]
		row.CPUPerEvent, row.PGCPUPerEvent, row.PeakRSSMB, row.OtherCores = -1, -1, -1, -1
		say("W4 decode floor: %d/s → p50 %.1f ms, p99 %.1f ms, max %.1f ms", rate, row.P50, row.P99, row.Max)
		rows = append(rows, row)
	}
	return rows, nil
}

// percentile of sorted values, interpolated as percentile_cont does.
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := q * float64(len(sorted)-1)
	i := int(pos)
	if i+1 >= len(sorted) {
		return sorted[len(sorted)-1]
	}
	return sorted[i] + (pos-float64(i))*(sorted[i+1]-sorted[i])
}

// floorConsumer receives a publication's changes and records, for events
// committed at or after a start time, the milliseconds from commit to
// arrival.
type floorConsumer struct {
	conn   *pgconn.PgConn
	cancel context.CancelFunc
	done   chan struct{} // closed when the receive loop ends, with err set
	err    error

	mu    sync.Mutex
	since time.Time
	lat   []float64
	// arrivals, when not nil, records each event's arrival by its position
	// (the paired measurement of W4).
	arrivals map[int64]time.Time
}

// floorSlot is a replication connection holding a temporary pgoutput slot
// that has not started streaming yet: WAL written from now on waits in it.
type floorSlot struct {
	conn  *pgconn.PgConn
	name  string
	start pglogrepl.LSN
}

func createFloorSlot(ctx context.Context, dsn, name string) (*floorSlot, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("decode floor: connect: %w", err)
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, name, "pgoutput",
		// No exported snapshot: one would stay open until START_REPLICATION
		// and hold back the xmin horizon (no pruning, no vacuum) through
		// the engine's whole run.
		pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication, SnapshotAction: "NOEXPORT_SNAPSHOT"})
	if err != nil {
		conn.Close(ctx)
		return nil, fmt.Errorf("decode floor: create slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		conn.Close(ctx)
		return nil, err
	}
	return &floorSlot{conn: conn, name: name, start: start}, nil
}

func startFloorConsumer(ctx context.Context, dsn, slotName, publication string) (*floorConsumer, error) {
	slot, err := createFloorSlot(ctx, dsn, slotName)
	if err != nil {
		return nil, err
	}
	return slot.consume(ctx, publication)
}

// consume starts streaming the slot; the consumer owns the connection.
func (s *floorSlot) consume(ctx context.Context, publication string) (*floorConsumer, error) {
	err := pglogrepl.StartReplication(ctx, s.conn, s.name, s.start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", fmt.Sprintf("publication_names '%s'", publication)}})
	if err != nil {
		s.conn.Close(ctx)
		return nil, fmt.Errorf("decode floor: start replication: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	c := &floorConsumer{conn: s.conn, cancel: cancel, done: make(chan struct{}), since: time.Now().Add(24 * time.Hour)}
	go func() {
		c.err = c.loop(rctx)
		close(c.done)
	}()
	return c, nil
}

// decodeOnly is W5's reference: the same backlog received from its own
// slot (created before the events were appended) by a consumer that does
// nothing else, timed from the start of streaming to the last event.
func (b *bench) decodeOnly(ctx context.Context, w *Workload, slot *floorSlot, publication string, n int64, engineRate float64) error {
	say("%s: decode only: receiving the %s-event backlog from a slot of its own …", w.ID, thousands(n))
	t0 := time.Now()
	c, err := slot.consume(ctx, publication)
	if err != nil {
		return err
	}
	defer c.close()
	c.record(time.Time{})
	if _, err := c.collect(ctx, n, 10*time.Minute); err != nil {
		return err
	}
	r := refFigures{events: n, elapsed: time.Since(t0)}
	row := refRow("decode", "decode only", w.Rows[0].Projection, r, engineRate)
	w.Rows = append(w.Rows, row)
	say("%s: decode only: %.0f events/s", w.ID, row.Rate)
	return nil
}

func (c *floorConsumer) loop(ctx context.Context) error {
	var received pglogrepl.LSN
	var commit time.Time
	posCol := map[uint32]int{} // relation → index of its position column
	next := time.Now()
	for {
		if !time.Now().Before(next) {
			next = time.Now().Add(time.Second)
			err := pglogrepl.SendStandbyStatusUpdate(ctx, c.conn, pglogrepl.StandbyStatusUpdate{
				WALWritePosition: received, WALFlushPosition: received, WALApplyPosition: received})
			if err != nil {
				return err
			}
		}
		mctx, cancel := context.WithDeadline(ctx, next)
		msg, err := c.conn.ReceiveMessage(mctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return err
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok || len(cd.Data) == 0 {
			if er, isErr := msg.(*pgproto3.ErrorResponse); isErr {
				return pgconn.ErrorResponseToPgError(er)
			}
			continue
		}
		if cd.Data[0] != pglogrepl.XLogDataByteID {
			continue
		}
		x, err := pglogrepl.ParseXLogData(cd.Data[1:])
		if err != nil {
			return err
		}
		arrived := time.Now()
		received = max(received, x.WALStart+pglogrepl.LSN(len(x.WALData)))
		m, err := pglogrepl.Parse(x.WALData)
		if err != nil {
			return err
		}
		switch m := m.(type) {
		case *pglogrepl.RelationMessage:
			posCol[m.RelationID] = slices.IndexFunc(m.Columns, func(col *pglogrepl.RelationMessageColumn) bool {
				return col.Name == "position"
			})
		case *pglogrepl.BeginMessage:
			commit = m.CommitTime
		case *pglogrepl.InsertMessage:
			c.mu.Lock()
			if !commit.Before(c.since) {
				c.lat = append(c.lat, float64(arrived.Sub(commit).Microseconds())/1000)
			}
			if i, ok := posCol[m.RelationID]; ok && c.arrivals != nil && i >= 0 && i < len(m.Tuple.Columns) {
				if pos, err := strconv.ParseInt(string(m.Tuple.Columns[i].Data), 10, 64); err == nil {
					c.arrivals[pos] = arrived
				}
			}
			c.mu.Unlock()
		}
	}
}

// record starts a new measurement: events committed at or after since.
func (c *floorConsumer) record(since time.Time) {
	c.mu.Lock()
	c.since, c.lat = since, nil
	c.mu.Unlock()
}

// await polls done, under the consumer's lock, every 50 ms until it
// reports true, the consumer ends, or timeout passes; what names the
// measurement in errors, and done's string what it has so far.
func (c *floorConsumer) await(ctx context.Context, what string, timeout time.Duration, done func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		ok, have := done()
		c.mu.Unlock()
		if ok {
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s: consumer ended: %w", what, c.err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: %s in %s", what, have, timeout)
		}
	}
}

// collect waits until n events of the measurement arrived and returns
// their latencies, sorted.
func (c *floorConsumer) collect(ctx context.Context, n int64, timeout time.Duration) ([]float64, error) {
	var lat []float64
	err := c.await(ctx, "decode floor", timeout, func() (bool, string) {
		if int64(len(c.lat)) < n {
			return false, fmt.Sprintf("%d of %d events arrived", len(c.lat), n)
		}
		lat = slices.Clone(c.lat)
		return true, ""
	})
	slices.Sort(lat)
	return lat, err
}

// arrivalsIn waits until every event with position in (lo, hi] arrived,
// and returns their arrival times (forgetting them).
func (c *floorConsumer) arrivalsIn(ctx context.Context, lo, hi int64, timeout time.Duration) (map[int64]time.Time, error) {
	var out map[int64]time.Time
	err := c.await(ctx, "paired consumer", timeout, func() (bool, string) {
		out = make(map[int64]time.Time, hi-lo)
		for pos, at := range c.arrivals {
			if pos > lo && pos <= hi {
				out[pos] = at
			}
		}
		if int64(len(out)) < hi-lo {
			return false, fmt.Sprintf("%d of %d events arrived", len(out), hi-lo)
		}
		for pos := range out {
			delete(c.arrivals, pos)
		}
		return true, ""
	})
	return out, err
}

func (c *floorConsumer) close() {
	c.cancel()
	<-c.done
	if c.err != nil && !errors.Is(c.err, context.Canceled) {
		say("decode floor: consumer: %v", c.err)
	}
	c.conn.Close(context.Background())
}
