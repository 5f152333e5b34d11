package replication_test

// The source against a real PostgreSQL: one server per test binary
// (pgtest.Main), a database per test. Skipped with -short.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/internal/pgtest"
	"github.com/pgscribe/pgscribe/migrations"
	"github.com/pgscribe/pgscribe/replication"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// recordingSink keeps what the stream delivers.
type recordingSink struct {
	mu     sync.Mutex
	begins map[uint64]event.LSN // token → commit LSN given to Begin
	ends   map[uint64]event.LSN // token → end LSN given to Commit
	events []*event.Event
	tokens []uint64 // the token of each event
	next   uint64
}

func (s *recordingSink) Begin(commitLSN event.LSN, _ time.Time) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next++
	s.begins[s.next] = commitLSN
	return s.next
}

func (s *recordingSink) Event(_ context.Context, token uint64, ev *event.Event) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, ev)
	s.tokens = append(s.tokens, token)
	return nil
}

func (s *recordingSink) Commit(token uint64, end event.LSN) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ends[token] = end
}

func (s *recordingSink) Confirmable() event.LSN { return 0 }
func (s *recordingSink) AdvanceIdle(event.LSN)  {}

func (s *recordingSink) committed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ends)
}

var columns = replication.Columns{Position: "position", ID: "id", StreamID: "stream_id", StreamPosition: "stream_position",
	Type: "type", Data: "data", Metadata: "metadata", OccurredAt: "occurred_at"}

// eventsDB returns a fresh database with the events table and its
// publication, a connection to it and a context that ends with the test
// (two minutes at most).
func eventsDB(t *testing.T) (string, *pgx.Conn, context.Context) {
	t.Helper()
	dsn := pgtest.Database(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	conn := pgtest.Connect(t, dsn)
	if err := migrations.CreateEventsTable(ctx, conn, "events"); err != nil {
		t.Fatal(err)
	}
	if err := migrations.EnsurePublication(ctx, conn, "pgscribe_events", "events"); err != nil {
		t.Fatal(err)
	}
	return dsn, conn, ctx
}

// TestSlotSnapshotAndStreamPG: a slot created with an exported snapshot
// splits the events exactly: the snapshot holds what committed before the
// slot (even when read after a later commit), the stream delivers what
// committed after it, decoded, with its commit LSN and time.
func TestSlotSnapshotAndStreamPG(t *testing.T) {
	dsn, conn, ctx := eventsDB(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := conn.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	lsn := func() event.LSN {
		t.Helper()
		var s string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&s); err != nil {
			t.Fatal(err)
		}
		l, err := event.ParseLSN(s)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	exec(`INSERT INTO events (stream_id, stream_position, type, data)
SELECT 'backlog-' || i, 1, 'Opened', jsonb_build_object('i', i) FROM generate_series(1, 3) i`)

	repl, err := replication.ConnectReplication(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer repl.Close(context.WithoutCancel(ctx))
	const slot = "stream_pg_test"
	consistent, snapName, err := replication.CreateSlot(ctx, repl, slot)
	if err != nil {
		t.Fatal(err)
	}

	// Committed after the slot, before the snapshot is imported: in the
	// stream, not in the snapshot.
	before := lsn()
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, typ := range []string{"Deposited", "Withdrawn"} {
		if _, err := tx.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data, metadata)
VALUES ('live-1', $1, $2, $3, '{"by": "test"}')`, i+1, typ, map[string]any{"amount": 10 * (i + 1)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	after := lsn()

	src := replication.Source{URL: dsn, Table: "events", Publication: "pgscribe_events", Slot: slot, Columns: columns}
	snap, err := replication.OpenSnapshot(ctx, pgtest.Connect(t, dsn), src, snapName)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Total != 3 {
		t.Errorf("snapshot counts %d events, want the 3 of the backlog", snap.Total)
	}
	var backlog []*event.Event
	for {
		page, err := snap.Next(ctx, 2, 0)
		if err != nil {
			t.Fatal(err)
		}
		if len(page) == 0 {
			break
		}
		backlog = append(backlog, page...)
	}
	if err := snap.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if len(backlog) != 3 {
		t.Fatalf("snapshot pages hold %d events, want 3", len(backlog))
	}
	for i, ev := range backlog {
		if i > 0 && ev.Position <= backlog[i-1].Position {
			t.Errorf("snapshot events out of position order: %d after %d", ev.Position, backlog[i-1].Position)
		}
		if ev.Type != "Opened" || ev.CommitLSN != 0 {
			t.Errorf("snapshot event %d: type %q, commit LSN %s (want Opened, none)", i, ev.Type, ev.CommitLSN)
		}
	}

	sink := &recordingSink{begins: map[uint64]event.LSN{}, ends: map[uint64]event.LSN{}}
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- replication.Stream(sctx, repl, src, sink, replication.StreamOptions{StatusInterval: 200 * time.Millisecond})
	}()
	deadline := time.Now().Add(time.Minute)
	for sink.committed() < 1 {
		select {
		case err := <-done:
			t.Fatalf("stream ended before the first commit: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the streamed transaction")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Stream after cancel: %v, want context.Canceled", err)
	}

	sink.mu.Lock()
	defer sink.mu.Unlock()
	if len(sink.events) != 2 {
		t.Fatalf("streamed %d events, want the 2 committed after the slot", len(sink.events))
	}
	rows, err := conn.Query(ctx, `SELECT position, id::text, stream_position, type, data::text, metadata::text, occurred_at,
	pg_xact_commit_timestamp(xmin) FROM events WHERE stream_id = 'live-1' ORDER BY position`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		position, streamPosition int64
		id, typ, data, metadata  string
		occurred, committed      time.Time
	}
	want, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var w row
		err := r.Scan(&w.position, &w.id, &w.streamPosition, &w.typ, &w.data, &w.metadata, &w.occurred, &w.committed)
		return w, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range sink.events {
		w := want[i]
		if ev.Position != w.position || ev.ID != w.id || ev.StreamID != "live-1" || ev.StreamPosition != w.streamPosition ||
			ev.Type != w.typ || !ev.OccurredAt.Equal(w.occurred) {
			t.Errorf("event %d decoded as %+v, want %+v", i, ev, w)
		}
		if !jsonEqual(t, ev.RawData, w.data) || !jsonEqual(t, ev.RawMetadata, w.metadata) {
			t.Errorf("event %d documents %s %s, want %s %s", i, ev.RawData, ev.RawMetadata, w.data, w.metadata)
		}
		// One transaction: one commit LSN, the one Begin announced, after
		// the slot's consistent point and inside the WAL the commit wrote.
		token := sink.tokens[i]
		if ev.CommitLSN != sink.begins[token] || ev.CommitLSN <= consistent || ev.CommitLSN < before || ev.CommitLSN >= after {
			t.Errorf("event %d commit LSN %s: Begin said %s, slot consistent at %s, commit between %s and %s",
				i, ev.CommitLSN, sink.begins[token], consistent, before, after)
		}
		if end := sink.ends[token]; end <= ev.CommitLSN || end > after {
			t.Errorf("event %d: transaction end %s, want after %s and at most %s", i, end, ev.CommitLSN, after)
		}
		if !ev.CommitTime.Equal(w.committed) {
			t.Errorf("event %d commit time %s, server says %s", i, ev.CommitTime, w.committed)
		}
	}
	if sink.tokens[0] != sink.tokens[1] {
		t.Errorf("the two events of one transaction came under tokens %d and %d", sink.tokens[0], sink.tokens[1])
	}
}

// jsonEqual compares a decoded document with the server's text of it.
func jsonEqual(t *testing.T, got []byte, want string) bool {
	t.Helper()
	var g, w any
	if err := json.Unmarshal(got, &g); err != nil {
		t.Errorf("decode %s: %v", got, err)
		return false
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	return string(gb) == string(wb)
}

// holdingSink holds the stream in the first Begin for hold, calling the
// stream's keepAlive (when keep) as a group's stream does while it waits
// for a joiner.
type holdingSink struct {
	recordingSink
	hold      time.Duration
	keep      bool
	keepAlive func() error
	held      bool
}

func (s *holdingSink) SetKeepAlive(k func() error) { s.keepAlive = k }

func (s *holdingSink) Begin(commitLSN event.LSN, at time.Time) uint64 {
	if !s.held {
		s.held = true
		for end := time.Now().Add(s.hold); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			if s.keep && s.keepAlive != nil {
				_ = s.keepAlive()
			}
		}
	}
	return s.recordingSink.Begin(commitLSN, at)
}

// TestStreamHeldInBeginStaysUp: a sink that holds the stream inside Begin
// longer than the server's wal_sender_timeout (1 s here) keeps the
// connection with the keepAlive the stream gives it (HoldingSink), and the
// stream then delivers a transaction appended after the hold. Without
// keepAlive the server ends the connection: the same hold fails the stream.
func TestStreamHeldInBeginStaysUp(t *testing.T) {
	for _, keep := range []bool{true, false} {
		t.Run(map[bool]string{true: "keepalive", false: "none"}[keep], func(t *testing.T) {
			dsn, conn, ctx := eventsDB(t)
			short := dsn + map[bool]string{true: "&", false: "?"}[strings.Contains(dsn, "?")] + "wal_sender_timeout=1000"
			if !strings.Contains(dsn, "://") {
				short = dsn + " wal_sender_timeout=1000"
			}
			repl, err := replication.ConnectReplication(ctx, short)
			if err != nil {
				t.Fatal(err)
			}
			defer repl.Close(context.WithoutCancel(ctx))
			const slot = "held_stream_test"
			if _, _, err := replication.CreateSlot(ctx, repl, slot); err != nil {
				t.Fatal(err)
			}
			insert := func(i int) {
				t.Helper()
				if _, err := conn.Exec(ctx, `INSERT INTO events (stream_id, stream_position, type, data) VALUES ('s', $1, 'T', '{}')`, i); err != nil {
					t.Fatal(err)
				}
			}
			insert(1) // held in its Begin
			sink := &holdingSink{recordingSink: recordingSink{begins: map[uint64]event.LSN{}, ends: map[uint64]event.LSN{}},
				hold: 4 * time.Second, keep: keep}
			src := replication.Source{URL: dsn, Table: "events", Publication: "pgscribe_events", Slot: slot, Columns: columns}
			sctx, stop := context.WithCancel(ctx)
			defer stop()
			done := make(chan error, 1)
			go func() {
				done <- replication.Stream(sctx, repl, src, sink, replication.StreamOptions{StatusInterval: 200 * time.Millisecond})
			}()
			appended := false
			// The second transaction is appended after the hold: what was
			// sent before it (already in the client's buffers) proves
			// nothing about the connection.
			deadline := time.Now().Add(30 * time.Second)
			for sink.committed() < 2 {
				if sink.committed() == 1 && !appended {
					insert(2)
					appended = true
				}
				select {
				case err := <-done:
					if keep {
						t.Fatalf("stream held in Begin with keepalive ended: %v", err)
					}
					return // the server ended it, as it does without keepalive
				default:
				}
				if time.Now().After(deadline) {
					t.Fatal("timed out waiting for the two transactions")
				}
				time.Sleep(20 * time.Millisecond)
			}
			if !keep {
				t.Fatal("the stream outlived a hold of 4 s without keepalive under wal_sender_timeout 1 s: the test proves nothing")
			}
			stop()
			if err := <-done; !errors.Is(err, context.Canceled) {
				t.Errorf("Stream after cancel: %v, want context.Canceled", err)
			}
		})
	}
}
