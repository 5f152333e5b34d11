package apply_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/event"
)

// crossingRules writes two rows that every stream shares, in the order
// its type names (AB: a then b, BA: b then a),
// with an op = "sql" intent between them, which puts each batch on the
// sequential path (one statement per intent, in event order). Its sleep
// makes two partitions' transactions overlap between their two writes.
type crossingRules struct{}

func (crossingRules) Eval(ev *event.Event) ([]event.Intent, error) {
	first, second := "a", "b"
	if ev.Type == "BA" {
		first, second = second, first
	}
	row := func(k string) event.Intent {
		return event.Intent{Rule: "count", RuleIndex: 0, Op: event.OpUpsert, Table: "shared_counts",
			Key: []event.Column{{Name: "k", Value: k}}, Inc: []event.Column{{Name: "n", Value: int64(1)}}}
	}
	return []event.Intent{row(first), {Rule: "trail", RuleIndex: 1, Op: event.OpSQL, SQL: "SELECT pg_sleep(0.02)"}, row(second)}, nil
}

// retries counts the batch retries by SQLSTATE.
type retries struct {
	apply.NoObserver
	mu    sync.Mutex
	codes map[string]int
}

func (r *retries) Retried(code string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.codes[code]++
}

// TestCampaignSeed101SharedRowsNoDeadlock: campaign seed 101 found a
// projection whose `sql` rule put every batch on the sequential path
// deadlocking (40P01) about ten times a minute on rows every stream
// updates: its partitions wrote them in the order of their events, so two
// batches locked two shared rows in opposite orders. The rows a batch
// writes are now locked first, in one order for every batch
// (apply.rowLocks): four partitions committing crossing writes one event
// per batch must not deadlock once, and count every event on both rows.
func TestCampaignSeed101SharedRowsNoDeadlock(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A deadlock is found after deadlock_timeout (1 s by default).
	pool := migratedPool(t, map[string]string{"deadlock_timeout": "100ms"})
	if _, err := pool.Exec(ctx, `CREATE TABLE shared_counts (k text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE fence_ok ()`); err != nil {
		t.Fatal(err)
	}
	obs := &retries{codes: map[string]int{}}
	c := apply.NewCommitter(pool, apply.Options{Projection: "crossing", Version: 1, Schema: "pgscribe", MaxAttempts: 20,
		Backoff: time.Millisecond}, crossingRules{}, tableFence{}, obs, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var committed atomic.Int64
	parts := apply.NewPartitions(c, apply.PartitionOptions{Count: 4, QueueSize: 64, BatchSize: func() int { return 1 },
		Committed: func(batch []apply.Input, _ apply.Result) { committed.Add(int64(len(batch))) }})
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- parts.Run(ctx, stop) }()
	const streams, perStream = 16, 8
	n := 0
	for sp := 1; sp <= perStream; sp++ {
		for s := range streams {
			n++
			typ := "AB"
			if s%2 == 1 {
				typ = "BA"
			}
			ev := &event.Event{Position: int64(n), ID: fmt.Sprintf("ev-%d", n), StreamID: fmt.Sprintf("s-%d", s),
				StreamPosition: int64(sp), Type: typ, OccurredAt: time.Unix(0, 0).UTC()}
			if err := parts.Dispatch(ctx, apply.Input{Event: ev, Token: 1}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for committed.Load() < int64(n) && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // polling a counter, with the test's deadline
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var a, b int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT n FROM shared_counts WHERE k = 'a'), (SELECT n FROM shared_counts WHERE k = 'b')`).Scan(&a, &b); err != nil {
		t.Fatal(err)
	}
	if a != int64(n) || b != int64(n) {
		t.Errorf("shared rows count a=%d b=%d, want %d each", a, b, n)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.codes["40P01"] > 0 {
		t.Errorf("%d batches deadlocked (40P01) and were retried, want none: %v", obs.codes["40P01"], obs.codes)
	}
	t.Logf("%d events, one per batch, over 4 partitions; retries by SQLSTATE: %v", n, obs.codes)
}
