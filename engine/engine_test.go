package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/replication"
)

func pgErr(code string) error { return &pgconn.PgError{Code: code, Message: "test"} }

func TestClassifyEnd(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want ending
	}{
		{name: "halted batch", err: fmt.Errorf("partition 1: %w", &apply.HaltError{Reason: "structural failure", Err: io.EOF}), want: endHalt},
		{name: "fenced", err: fmt.Errorf("commit: %w", event.ErrFenced), want: endStandby},
		{name: "lock lost", err: leader.ErrLost, want: endStandby},
		{name: "unmarked error", err: errors.New("start replication: connection refused"), want: endRestart},
		{name: "stopped", err: nil, want: endRestart},
		// The source's errors, with the commit taxonomy.
		{name: "source connection lost", err: atSlot(fmt.Errorf("receive: %w", io.ErrUnexpectedEOF)), want: endRestart},
		{name: "source admin shutdown", err: atSlot(pgErr("57P01")), want: endRestart},
		// The server's limits: retrying at once only adds to the load.
		{name: "source too many connections", err: atSource(pgErr("53300")), want: endResourceHalt},
		{name: "target too many connections", err: fmt.Errorf("target pool: %w", pgErr("53300")), want: endResourceHalt},
		{name: "slots in use", err: atSource(fmt.Errorf("create slot s: %w", &pgconn.PgError{Code: "53400", Message: "all replication slots are in use"})), want: endResourceHalt},
		{name: "another limit", err: atSource(&pgconn.PgError{Code: "53400", Message: "too many background workers"}), want: endRestart},
		{name: "source connection exception", err: atSource(pgErr("08006")), want: endRestart},
		{name: "stream stalled", err: atSlot(fmt.Errorf("%w: nothing for 31s", replication.ErrStalled)), want: endRestart},
		{name: "stream ended", err: atSlot(replication.ErrStreamEnded), want: endRestart},
		{name: "source cancelled", err: atSlot(context.Canceled), want: endRestart},
		{name: "publication missing", err: atSlot(fmt.Errorf("replication: %w", pgErr("42704"))), want: endSourceHalt},
		{name: "privilege revoked", err: atSource(fmt.Errorf("read snapshot: %w", pgErr("42501"))), want: endSourceHalt},
		{name: "failed password", err: atSource(fmt.Errorf("connect source: %w", pgErr("28P01"))), want: endSourceHalt},
		{name: "column renamed", err: atSlot(errors.New(`events row lacks column "type"`)), want: endSourceHalt},
		{name: "unreadable value", err: atSlot(errors.New(`parse timestamptz "2026-12-01 11:56:06"`)), want: endSourceHalt},
		{name: "fenced beats source", err: atSource(fmt.Errorf("x: %w", event.ErrFenced)), want: endStandby},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classifyEnd(tt.err); got != tt.want {
				t.Errorf("classifyEnd = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestHaltCause(t *testing.T) {
	tests := []struct{ reason, stage, code string }{
		{`source halt (sqlstate 42704): replication: ERROR: publication "p" does not exist (SQLSTATE 42704)`, "source", "42704"},
		{`source halt: events row lacks column "type"; probe: probe events table events: ERROR: column "type" does not exist (SQLSTATE 42703)`, "source", ""},
		{`halt: structural failure (sqlstate 42P01) on table t: boom`, "commit", "42P01"},
		{`halt: render intent of rule r: boom`, "commit", ""},
		{`resource halt (sqlstate 53400): the server has no room (max_replication_slots): create slot s: ERROR: all replication slots are in use (SQLSTATE 53400)`, "resource", "53400"},
	}
	for _, tt := range tests {
		if stage, code := HaltCause(tt.reason); stage != tt.stage || code != tt.code {
			t.Errorf("HaltCause(%q) = %q, %q; want %q, %q", tt.reason, stage, code, tt.stage, tt.code)
		}
	}
}

// A resource halt that follows a session failing again within a minute
// waits longer before it checks for room: standby_poll doubling to a
// minute, so that a server short of connections is not retried at once.
func TestResourceBackoff(t *testing.T) {
	poll := 5 * time.Second
	for n, want := range map[int]time.Duration{1: 5 * time.Second, 2: 10 * time.Second, 3: 20 * time.Second, 4: 40 * time.Second, 5: time.Minute, 40: time.Minute} {
		if got := resourceBackoff(poll, n); got != want {
			t.Errorf("resourceBackoff(%s, %d) = %s, want %s", poll, n, got, want)
		}
	}
}
