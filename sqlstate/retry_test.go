package sqlstate

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestRetry(t *testing.T) {
	structural := &pgconn.PgError{Code: "42P01"}
	tests := []struct {
		name      string
		max       int
		errs      []error // op's results in turn; nil = success
		wantCalls int
		wantErr   error
	}{
		{name: "success at once", errs: []error{nil}, wantCalls: 1},
		{name: "transient then success", errs: []error{io.EOF, io.EOF, nil}, wantCalls: 3},
		{name: "structural is not retried", errs: []error{structural, nil}, wantCalls: 1, wantErr: structural},
		{name: "attempts used up", max: 2, errs: []error{io.EOF, io.EOF, nil}, wantCalls: 2, wantErr: io.EOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			calls := 0
			err := Retry(context.Background(), Policy{MaxAttempts: tt.max, Backoff: time.Microsecond, MaxBackoff: time.Millisecond},
				slog.New(slog.DiscardHandler), func() error {
					calls++
					return tt.errs[calls-1]
				})
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil && err != nil) {
				t.Errorf("Retry = %v, want %v", err, tt.wantErr)
			}
			if calls != tt.wantCalls {
				t.Errorf("op ran %d times, want %d", calls, tt.wantCalls)
			}
		})
	}
}

func TestBackoff(t *testing.T) {
	b := Policy{MaxAttempts: 3, Backoff: time.Microsecond, MaxBackoff: 3 * time.Microsecond}.Start()
	log := slog.New(slog.DiscardHandler)
	var delays []time.Duration
	for !b.Exhausted() {
		delays = append(delays, b.Delay())
		if err := b.Wait(context.Background(), log, "retry", io.EOF); err != nil {
			t.Fatal(err)
		}
	}
	want := []time.Duration{time.Microsecond, 2 * time.Microsecond}
	if len(delays) != len(want) || delays[0] != want[0] || delays[1] != want[1] || b.Delay() != 3*time.Microsecond || b.Attempt() != 3 {
		t.Errorf("delays %v then %v at attempt %d; want %v then 3µs at attempt 3", delays, b.Delay(), b.Attempt(), want)
	}
	b.Reset()
	if b.Attempt() != 1 || b.Delay() != time.Microsecond || b.Exhausted() {
		t.Errorf("after Reset: attempt %d, delay %v", b.Attempt(), b.Delay())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	long := Policy{Backoff: time.Hour, MaxBackoff: time.Hour}.Start()
	if err := long.Wait(ctx, log, "retry", io.EOF); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait on a cancelled context = %v, want context.Canceled", err)
	}
}
