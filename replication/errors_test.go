package replication

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/sqlstate"
)

func TestClassify(t *testing.T) {
	pgErr := func(code string) error { return &pgconn.PgError{Code: code} }
	tests := []struct {
		name string
		err  error
		want sqlstate.Class
	}{
		{"stalled", fmt.Errorf("%w: nothing for 31s", ErrStalled), sqlstate.ClassTransient},
		{"stream ended", fmt.Errorf("session: %w", ErrStreamEnded), sqlstate.ClassTransient},
		{"slot still active", fmt.Errorf("start replication: %w", pgErr("55006")), sqlstate.ClassTransient},
		{"connection lost", fmt.Errorf("receive: %w", io.ErrUnexpectedEOF), sqlstate.ClassTransient},
		{"admin shutdown", pgErr("57P01"), sqlstate.ClassTransient},
		{"publication missing", fmt.Errorf("replication: %w", pgErr("42704")), sqlstate.ClassStructural},
		{"no REPLICATION", pgErr("42501"), sqlstate.ClassStructural},
		{"failed password", pgErr("28P01"), sqlstate.ClassStructural},
		{"undecodable row", errors.New(`events row lacks column "type"`), sqlstate.ClassStructural},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.err); got != tt.want {
				t.Errorf("Classify(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}
