package apply_test

// Batches committed against a real PostgreSQL: one server per test binary
// (pgtest.Main), a migrated database per test. Skipped with -short.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/internal/pgtest"
	"github.com/pgscribe/pgscribe/migrations"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// countingRules applies every event but the "Note"s: one row per event in
// seen (a second apply would be a unique violation) and a per-stream count
// in totals.
type countingRules struct{}

func (countingRules) Eval(ev *event.Event) ([]event.Intent, error) {
	if ev.Type == "Note" {
		return nil, nil
	}
	return []event.Intent{
		{Rule: "seen", Op: event.OpInsert, Table: "seen", Set: []event.Column{
			{Name: "event_id", Value: ev.ID}, {Name: "stream_id", Value: ev.StreamID}, {Name: "stream_position", Value: ev.StreamPosition}}},
		{Rule: "total", Op: event.OpUpsert, Table: "totals", Key: []event.Column{{Name: "stream_id", Value: ev.StreamID}},
			Inc: []event.Column{{Name: "n", Value: int64(1)}}},
	}, nil
}

// tableFence holds the lease while the table fence_ok exists: dropping it
// is a takeover.
type tableFence struct{}

func (tableFence) CheckStatement() (string, []any) { return "SELECT 1 FROM fence_ok", nil }
func (tableFence) CheckFailed(err error) error     { return fmt.Errorf("%w: %w", event.ErrFenced, err) }

// rig is a migrated database with the read model and a running set of
// partitions over it.
type rig struct {
	t         *testing.T
	pool      *pgxpool.Pool
	parts     *apply.Partitions
	committed atomic.Int64 // events of committed batches
	stop      chan struct{}
	done      chan error
}

// migratedPool is a pool on a new migrated database, with params set on
// each of its sessions.
func migratedPool(t *testing.T, params map[string]string) *pgxpool.Pool {
	t.Helper()
	return migratedPoolAt(t, pgtest.Database(t), params)
}

// migratedPoolAt is migratedPool on the database of dsn.
func migratedPoolAt(t *testing.T, dsn string, params map[string]string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(cfg.ConnConfig.RuntimeParams, params)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = migrations.Apply(ctx, conn.Conn(), "pgscribe")
	conn.Release()
	if err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return pool
}

func newRig(t *testing.T, partitions int) *rig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := migratedPool(t, nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE seen (event_id text PRIMARY KEY, stream_id text NOT NULL, stream_position bigint NOT NULL);
CREATE TABLE totals (stream_id text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE fence_ok ()`); err != nil {
		t.Fatal(err)
	}
	c := apply.NewCommitter(pool, apply.Options{Projection: "counts", Version: 1, Schema: "pgscribe", MaxAttempts: 3,
		Backoff: 10 * time.Millisecond}, countingRules{}, tableFence{}, apply.NoObserver{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	r := &rig{t: t, pool: pool, stop: make(chan struct{}), done: make(chan error, 1)}
	r.parts = apply.NewPartitions(c, apply.PartitionOptions{Count: partitions, QueueSize: 256,
		BatchSize: func() int { return 50 },
		Committed: func(batch []apply.Input, _ apply.Result) { r.committed.Add(int64(len(batch))) }})
	runCtx, cancelRun := context.WithCancel(context.Background())
	go func() { r.done <- r.parts.Run(runCtx, r.stop) }()
	t.Cleanup(func() {
		r.halt()
		cancelRun()
	})
	return r
}

// halt stops the partitions gracefully and returns what Run returned.
func (r *rig) halt() error {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	select {
	case err := <-r.done:
		r.done <- err // for a later call
		return err
	case <-time.After(time.Minute):
		r.t.Fatal("partitions still running a minute after stop")
		return nil
	}
}

// events returns n events over streams streams, in position order; every
// seventh is a Note (skipped by the rules).
func events(n, streams int) []*event.Event {
	next := make([]int64, streams)
	out := make([]*event.Event, n)
	for i := range out {
		s := i % streams
		next[s]++
		typ := "Counted"
		if i%7 == 6 {
			typ = "Note"
		}
		out[i] = &event.Event{Position: int64(i + 1), ID: fmt.Sprintf("ev-%d", i+1), StreamID: fmt.Sprintf("s-%d", s),
			StreamPosition: next[s], Type: typ, OccurredAt: time.Unix(0, 0).UTC()}
	}
	return out
}

func (r *rig) dispatch(evs []*event.Event) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, ev := range evs {
		if err := r.parts.Dispatch(ctx, apply.Input{Event: ev, Token: 1}); err != nil {
			r.t.Fatal(err)
		}
	}
}

// snapshot reads, in one statement (one snapshot), the rows in seen, the
// sum of totals, and what the cursors account for.
func (r *rig) snapshot(ctx context.Context) (seen, totals, applied, skipped int64, err error) {
	err = r.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM seen), (SELECT coalesce(sum(n), 0)::bigint FROM totals),
	(SELECT coalesce(sum(applied), 0)::bigint FROM pgscribe.cursors WHERE projection = 'counts' AND version = 1),
	(SELECT coalesce(sum(skipped), 0)::bigint FROM pgscribe.cursors WHERE projection = 'counts' AND version = 1)`).
		Scan(&seen, &totals, &applied, &skipped)
	return
}

// TestCommitAtomicPG: the read-model writes of a batch and its cursor
// advances become visible together: a reader polling in single snapshots
// while four partitions commit never sees one without the other. A replay
// of the same events (a restart) is deduplicated by the cursors.
func TestCommitAtomicPG(t *testing.T) {
	const n, streams = 3000, 40
	r := newRig(t, 4)
	evs := events(n, streams)
	var wantApplied int64
	for _, ev := range evs {
		if ev.Type != "Note" {
			wantApplied++
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var (
		wg                 sync.WaitGroup
		observed, partial  int
		firstBad           string
		readerErr          error
		dispatched         = make(chan struct{})
		lastSeen, lastSkip int64
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			seen, totals, applied, skipped, err := r.snapshot(ctx)
			if err != nil {
				readerErr = err
				return
			}
			observed++
			if seen != applied || totals != applied {
				if firstBad == "" {
					firstBad = fmt.Sprintf("seen %d, totals %d, cursors applied %d", seen, totals, applied)
				}
			}
			if seen > 0 && seen < wantApplied {
				partial++
			}
			lastSeen, lastSkip = seen, skipped
			select {
			case <-dispatched:
				if seen == wantApplied || ctx.Err() != nil {
					return
				}
			default:
			}
		}
	}()
	r.dispatch(evs)
	close(dispatched)
	wg.Wait()
	if readerErr != nil {
		t.Fatal(readerErr)
	}
	if firstBad != "" {
		t.Errorf("a snapshot saw a batch's writes without its cursor advance (or the reverse): %s", firstBad)
	}
	if lastSeen != wantApplied || lastSkip != n-wantApplied {
		t.Fatalf("after all commits: %d applied, %d skipped; want %d and %d", lastSeen, lastSkip, wantApplied, n-wantApplied)
	}
	t.Logf("%d snapshots, %d of them between batches", observed, partial)

	// Each stream's cursor sits on its last event (stream s holds events
	// s+1, s+1+streams, …: the last is at stream position n/streams).
	var onLast, cursors int64
	if err := r.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE stream_position = $1
		AND position = $2::bigint - $3::bigint + 1 + substr(stream_id, 3)::bigint), count(*)
FROM pgscribe.cursors WHERE projection = 'counts'`, n/streams, n, streams).Scan(&onLast, &cursors); err != nil {
		t.Fatal(err)
	}
	if onLast != streams || cursors != streams {
		t.Errorf("%d cursors, %d of them on their stream's last event; want %d", cursors, onLast, streams)
	}

	// A replay changes nothing: every event is at or below its cursor.
	before := r.committed.Load()
	r.dispatch(evs)
	deadline := time.Now().Add(time.Minute)
	for r.committed.Load() < before+n {
		if time.Now().After(deadline) {
			t.Fatalf("replay: %d of %d events through the partitions", r.committed.Load()-before, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	seen, totals, applied, skipped, err := r.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if seen != wantApplied || totals != wantApplied || applied != wantApplied || skipped != n-wantApplied {
		t.Errorf("after a replay: seen %d, totals %d, applied %d, skipped %d; want %d, %d, %d, %d",
			seen, totals, applied, skipped, wantApplied, wantApplied, wantApplied, n-wantApplied)
	}
	if err := r.halt(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestCommitFencedPG: once the fence check fails (another node took over),
// the batch commits nothing — no read-model write, no cursor advance — and
// the partitions stop with ErrFenced.
func TestCommitFencedPG(t *testing.T) {
	r := newRig(t, 1)
	evs := events(200, 10)
	r.dispatch(evs[:100])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	deadline := time.Now().Add(time.Minute)
	for r.committed.Load() < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("%d of 100 events committed", r.committed.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	seen0, _, applied0, skipped0, err := r.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, "DROP TABLE fence_ok"); err != nil {
		t.Fatal(err)
	}
	r.dispatch(evs[100:101])
	var runErr error
	select {
	case runErr = <-r.done:
		r.done <- runErr
	case <-ctx.Done():
		t.Fatal("partitions still running after the fence failed")
	}
	if !errors.Is(runErr, event.ErrFenced) {
		t.Errorf("Run = %v, want ErrFenced", runErr)
	}
	seen, _, applied, skipped, err := r.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if seen != seen0 || applied != applied0 || skipped != skipped0 {
		t.Errorf("a fenced batch changed the database: seen %d→%d, applied %d→%d, skipped %d→%d",
			seen0, seen, applied0, applied, skipped0, skipped)
	}
}

// TestCommitHaltNamesTheTablePG: a column renamed under the committer
// halts it (42703), and the halt names the read-model table even when the
// server refuses the statement at prepare, on a connection that never ran
// it (pgx then fails every result of the batch alike, the fence check's
// first): found by TestFaultRenamedColumn, which reaches that path or the
// other depending on which pooled connection the batch gets.
func TestCommitHaltNamesTheTablePG(t *testing.T) {
	r := newRig(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	evs := events(40, 4)
	r.dispatch(evs[:20])
	deadline := time.Now().Add(time.Minute)
	for r.committed.Load() < 20 {
		if time.Now().After(deadline) {
			t.Fatal("the first events were not committed within a minute")
		}
		time.Sleep(10 * time.Millisecond) // polling a counter, bounded by the deadline above
	}
	if _, err := r.pool.Exec(ctx, "ALTER TABLE totals RENAME COLUMN n TO n_renamed"); err != nil {
		t.Fatal(err)
	}
	r.pool.Reset() // new connections: no statement prepared on them
	r.dispatch(evs[20:])
	select {
	case err := <-r.done:
		r.done <- err
		var h *apply.HaltError
		if !errors.As(err, &h) {
			t.Fatalf("the partitions ended with %v, want a halt", err)
		}
		if h.SQLState != "42703" || h.Table != "totals" {
			t.Errorf("halt: SQLSTATE %q, table %q; want 42703 and totals (%v)", h.SQLState, h.Table, err)
		}
	case <-ctx.Done():
		t.Fatal("no halt within a minute of the rename")
	}
}

// TestGroupArgsOnTheWire: the text[] arguments of a multi-row statement
// (pgtype.FlatArray of *string, encoded without reflection) reach
// PostgreSQL with their NULLs.
func TestGroupArgsOnTheWire(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	pool := migratedPool(t, nil)
	a := "a"
	var got []*string
	if err := pool.QueryRow(context.Background(), `SELECT $1::text[]`, pgtype.FlatArray[*string]{&a, nil}).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0] == nil || *got[0] != "a" || got[1] != nil {
		t.Errorf("text[] round trip = %v, want [a NULL]", got)
	}
}
