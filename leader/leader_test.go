package leader

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/event"
)

func TestKey(t *testing.T) {
	base := Key("pgscribe", "balances", 1)
	if Key("pgscribe", "balances", 1) != base {
		t.Fatal("Key is not deterministic")
	}
	// Every component matters, and the separator keeps components from
	// running into each other.
	others := []struct {
		name               string
		schema, projection string
		version            int64
	}{
		{"other schema", "engine", "balances", 1},
		{"other projection", "pgscribe", "activity", 1},
		{"other version", "pgscribe", "balances", 2},
		{"shifted boundary", "pgscrib", "ebalances", 1},
		{"name absorbing version", "pgscribe", "balances1", 0},
	}
	seen := map[int64]string{base: "base"}
	for _, o := range others {
		k := Key(o.schema, o.projection, o.version)
		if prev, dup := seen[k]; dup {
			t.Errorf("%s: key %d collides with %s", o.name, k, prev)
		}
		seen[k] = o.name
	}
}

func TestSessionParams(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration
		want    map[string]string
	}{
		{"bounded", 15 * time.Second, map[string]string{
			"application_name": "pgscribe-lock", "idle_session_timeout": "15000", "lock_timeout": "15000"}},
		{"sub-second", 1500 * time.Millisecond, map[string]string{
			"application_name": "pgscribe-lock", "idle_session_timeout": "1500", "lock_timeout": "1500"}},
		{"unbounded", 0, map[string]string{"application_name": "pgscribe-lock"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := sessionParams(tt.timeout)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s = %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// TestCheckFailed: only the check statement's own failure (its cast of
// the "pgscribe fence:" text) reads as fenced; any other error is passed
// on, so a lost connection is retried and not mistaken for a takeover. The
// statement itself runs against PostgreSQL in integration/
// (TestLeaseFence*, TestLeaseExclusiveAndEpoch, TestLeaseLostBump).
func TestCheckFailed(t *testing.T) {
	at := time.Date(2026, 11, 30, 3, 0, 0, 123456000, time.UTC)
	l := &Lease{Epoch: 7, Acquired: at, projection: "balances", version: 1}
	boom := errors.New("connection reset")
	tests := []struct {
		name       string
		err        error
		wantFenced bool
		wantText   string
	}{
		{name: "changed lease", err: &pgconn.PgError{Code: "22P02",
			Message: `invalid input syntax for type integer: "pgscribe fence: lease now epoch 8 acquired 2026-11-30 03:00:01+00"`},
			wantFenced: true, wantText: "ours epoch 7 acquired 2026-11-30T03:00:00.123456Z; lease now epoch 8 acquired 2026-11-30 03:00:01+00)"},
		{name: "row gone", err: &pgconn.PgError{Code: "22P02",
			Message: `invalid input syntax for type integer: "pgscribe fence: lease row is gone"`},
			wantFenced: true, wantText: "lease row is gone"},
		{name: "other cast failure", err: &pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type integer: "x"`}},
		{name: "serialization failure", err: &pgconn.PgError{Code: "40001", Message: "could not serialize access"}},
		{name: "connection lost", err: boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := l.CheckFailed(tt.err)
			if got := errors.Is(err, event.ErrFenced); got != tt.wantFenced {
				t.Fatalf("CheckFailed() = %v, fenced %v, want fenced %v", err, got, tt.wantFenced)
			}
			if !tt.wantFenced && !errors.Is(err, tt.err) {
				t.Errorf("CheckFailed() = %v, want it to wrap %v", err, tt.err)
			}
			if tt.wantText != "" && !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("CheckFailed() = %q, want it to contain %q", err, tt.wantText)
			}
		})
	}
}

// fakeSession is a lock session whose pings can fail or block.
type fakeSession struct {
	mu       sync.Mutex
	pingErr  error
	block    chan struct{} // when set, pings wait on it (or their deadline)
	pings    atomic.Int64
	inPing   atomic.Bool
	overlap  atomic.Bool // a call arrived while a ping was running
	calls    []string
	closed   bool
	deadline atomic.Bool // the last ping had a deadline
}

func (s *fakeSession) Ping(ctx context.Context) error {
	if !s.inPing.CompareAndSwap(false, true) {
		s.overlap.Store(true)
	}
	defer s.inPing.Store(false)
	s.pings.Add(1)
	_, ok := ctx.Deadline()
	s.deadline.Store(ok)
	s.mu.Lock()
	block, err := s.block, s.pingErr
	s.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return err
}

func (s *fakeSession) record(call string) {
	if s.inPing.Load() {
		s.overlap.Store(true)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, call)
}

func (s *fakeSession) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	s.record(sql)
	return pgconn.CommandTag{}, nil
}

func (s *fakeSession) Close(context.Context) error {
	s.record("close")
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	return nil
}

func (s *fakeSession) IsClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *fakeSession) setPing(err error, block chan struct{}) {
	s.mu.Lock()
	s.pingErr, s.block = err, block
	s.mu.Unlock()
}

func TestWatch(t *testing.T) {
	boom := errors.New("server closed the connection")
	tests := []struct {
		name    string
		pingErr error
		block   bool
		wantErr error // nil: Watch runs until ctx ends
	}{
		{name: "healthy session", wantErr: nil},
		{name: "ping fails", pingErr: boom, wantErr: ErrLost},
		{name: "ping hangs", block: true, wantErr: ErrLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &fakeSession{}
			var block chan struct{}
			if tt.block {
				block = make(chan struct{})
				defer close(block)
			}
			s.setPing(tt.pingErr, block)
			l := &Lease{conn: s}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- l.Watch(ctx, 20*time.Millisecond) }()
			if tt.wantErr == nil {
				deadline := time.Now().Add(5 * time.Second)
				for s.pings.Load() < 3 {
					if time.Now().After(deadline) {
						t.Fatalf("only %d pings", s.pings.Load())
					}
					time.Sleep(5 * time.Millisecond)
				}
				cancel()
			}
			select {
			case err := <-done:
				if tt.wantErr == nil && err != nil {
					t.Fatalf("Watch() = %v after cancel, want nil", err)
				}
				if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
					t.Fatalf("Watch() = %v, want %v", err, tt.wantErr)
				}
				if tt.pingErr != nil && !errors.Is(err, tt.pingErr) {
					t.Fatalf("Watch() = %v, want it to wrap the ping error", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Watch did not return")
			}
			if !s.deadline.Load() {
				t.Error("pings ran without a deadline")
			}
		})
	}
}

// TestWatchPingsAtOnce: the first ping does not wait for a tick, so the
// session's idle timeout counts from acquisition, not from acquisition plus
// an interval.
func TestWatchPingsAtOnce(t *testing.T) {
	s := &fakeSession{}
	l := &Lease{conn: s}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Watch(ctx, time.Hour) }()
	deadline := time.Now().Add(5 * time.Second)
	for s.pings.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no ping before the first tick")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Watch() = %v, want nil", err)
	}
}

// TestReleaseWaitsForPing: a stop cancels Watch's context while a ping may
// be on the wire; Release must not use the session concurrently, and the
// ping must not be cut by the cancellation (that would close the session
// before the unlock).
func TestReleaseWaitsForPing(t *testing.T) {
	s := &fakeSession{}
	block := make(chan struct{})
	s.setPing(nil, block)
	l := &Lease{conn: s, key: 42}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Watch(ctx, time.Hour) }()
	deadline := time.Now().Add(5 * time.Second)
	for !s.inPing.Load() {
		if time.Now().After(deadline) {
			t.Fatal("no ping")
		}
		time.Sleep(time.Millisecond)
	}
	cancel() // graceful stop while the ping is in flight
	released := make(chan struct{})
	go func() { l.Release(context.Background()); close(released) }()
	select {
	case <-released:
		t.Fatal("Release did not wait for the ping in progress")
	case <-time.After(50 * time.Millisecond):
	}
	if !s.inPing.Load() {
		t.Fatal("the stop cut the ping short")
	}
	close(block)
	<-released
	if err := <-done; err != nil {
		t.Fatalf("Watch() = %v, want nil", err)
	}
	if s.overlap.Load() {
		t.Error("the session was used concurrently")
	}
	want := []string{"SELECT pg_advisory_unlock($1)", "close"}
	if len(s.calls) != 2 || s.calls[0] != want[0] || s.calls[1] != want[1] {
		t.Errorf("calls %q, want %q", s.calls, want)
	}
}

func TestReleaseLostSession(t *testing.T) {
	s := &fakeSession{closed: true}
	l := &Lease{conn: s}
	l.Release(context.Background())
	l.Release(context.Background())
	for _, c := range s.calls {
		if c != "close" {
			t.Errorf("ran %q on a closed session", c)
		}
	}
}

func TestKeyParts(t *testing.T) {
	tests := []struct {
		key            int64
		classid, objid int64
	}{
		{key: 0, classid: 0, objid: 0},
		{key: 5, classid: 0, objid: 5},
		{key: 1<<32 | 7, classid: 1, objid: 7},
		{key: -1, classid: 0xFFFFFFFF, objid: 0xFFFFFFFF},
		{key: -1 << 63, classid: 0x80000000, objid: 0},
	}
	for _, tt := range tests {
		c, o := keyParts(tt.key)
		if c != tt.classid || o != tt.objid {
			t.Errorf("keyParts(%d) = %d, %d; want %d, %d", tt.key, c, o, tt.classid, tt.objid)
		}
	}
}
