package apply_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/event"
)

// checkedRules inserts a row per event into checked, whose CHECK (q >= 0)
// rejects the events of type Bad at commit (23514): the batch's
// pre-check cannot see a CHECK, so the isolated pass finds them.
type checkedRules struct{}

func (checkedRules) Eval(ev *event.Event) ([]event.Intent, error) {
	q := int64(1)
	if ev.Type == "Fail" {
		return nil, fmt.Errorf("rule fails on %s", ev.ID)
	}
	if ev.Type == "Bad" {
		q = -1
	}
	return []event.Intent{{Rule: "checked", Op: event.OpInsert, Table: "checked", Set: []event.Column{
		{Name: "event_id", Value: ev.ID}, {Name: "stream_id", Value: ev.StreamID}, {Name: "q", Value: q}}},
		{Rule: "total", Op: event.OpUpsert, Table: "shared_totals", Key: []event.Column{{Name: "k", Value: "all"}},
			Inc: []event.Column{{Name: "n", Value: int64(1)}}}}, nil
}

// TestCampaignSeed9ParkOnACheckViolation: under on_error = "park", an event that only
// its commit rejects (a CHECK violation found by the isolated pass) parks
// its stream: nothing after it in the stream is applied, whether it comes
// in the same batch or a later one; the other streams go on. Stream s
// also has a rule failure two events later, known before the isolated
// pass: it is held, not dead-lettered, and the stream parks at the CHECK
// violation (campaign seeds 7 and 9 parked at the rule failure and
// applied the event between them).
func TestCampaignSeed9ParkOnACheckViolation(t *testing.T) {
	if testing.Short() {
		t.Skip("needs PostgreSQL")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := migratedPool(t, nil)
	if _, err := pool.Exec(ctx, `CREATE TABLE checked (event_id text PRIMARY KEY, stream_id text NOT NULL, q bigint NOT NULL CHECK (q >= 0));
CREATE TABLE shared_totals (k text PRIMARY KEY, n bigint NOT NULL);
CREATE TABLE fence_ok ()`); err != nil {
		t.Fatal(err)
	}
	for _, batch := range []int{50, 3} {
		t.Run(fmt.Sprintf("batches of %d", batch), func(t *testing.T) {
			proj := fmt.Sprintf("park%d", batch)
			if _, err := pool.Exec(ctx, `TRUNCATE checked, shared_totals`); err != nil {
				t.Fatal(err)
			}
			c := apply.NewCommitter(pool, apply.Options{Projection: proj, Version: 1, Schema: "pgscribe", MaxAttempts: 3,
				Backoff: time.Millisecond, Park: true}, checkedRules{}, tableFence{}, apply.NoObserver{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			var committed atomic.Int64
			parts := apply.NewPartitions(c, apply.PartitionOptions{Count: 2, QueueSize: 64, BatchSize: func() int { return batch },
				Committed: func(b []apply.Input, _ apply.Result) { committed.Add(int64(len(b))) }})
			stop := make(chan struct{})
			done := make(chan error, 1)
			go func() { done <- parts.Run(ctx, stop) }()
			n := 0
			for sp := 1; sp <= 8; sp++ {
				for _, s := range []string{"s", "t", "u", "v", "w"} {
					n++
					typ := "Good"
					if s == "s" && sp == 3 {
						typ = "Bad"
					}
					if s == "s" && sp == 5 {
						typ = "Fail"
					}
					ev := &event.Event{Position: int64(n), ID: fmt.Sprintf("%s-%d", s, sp), StreamID: s, StreamPosition: int64(sp), Type: typ}
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
			var sRows, tRows, dead, held, since int64
			if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM checked WHERE stream_id = 's'), (SELECT count(*) FROM checked WHERE stream_id = 't'),
  (SELECT count(*) FROM pgscribe.dead_letters WHERE projection = $1), (SELECT count(*) FROM pgscribe.parked_events WHERE projection = $1),
  (SELECT coalesce(parked_since, -1) FROM pgscribe.cursors WHERE projection = $1 AND stream_id = 's')`, proj).
				Scan(&sRows, &tRows, &dead, &held, &since); err != nil {
				t.Fatal(err)
			}
			if since != 3 {
				t.Errorf("stream s parked since %d, want 3 (its CHECK violation)", since)
			}
			if sRows != 2 || tRows != 8 || dead != 1 || held != 5 {
				rows, _ := pool.Query(ctx, `SELECT event_id FROM checked WHERE stream_id = 's' ORDER BY 1`)
				ids, _ := pgx.CollectRows(rows, pgx.RowTo[string])
				t.Logf("stream s rows: %v", ids)
				t.Errorf("stream s applied %d (want 2: before its dead letter), t %d (want 8), %d dead letters (want 1), %d held (want 5: s/4..8)",
					sRows, tRows, dead, held)
			}
		})
	}
}
