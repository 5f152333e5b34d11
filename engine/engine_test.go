package engine

import (
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/leader"
)

func TestClassifyEnd(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want ending
	}{
		{name: "halted batch", err: fmt.Errorf("partition 1: %w", &apply.HaltError{Reason: "structural failure", Err: io.EOF}), want: endHalt},
		{name: "fenced", err: fmt.Errorf("commit: %w", event.ErrFenced), want: endStandby},
		{name: "lock lost", err: leader.ErrLost, want: endStandby},
		{name: "source error", err: errors.New("start replication: connection refused"), want: endRestart},
		{name: "stopped", err: nil, want: endRestart},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classifyEnd(tt.err); got != tt.want {
				t.Errorf("classifyEnd = %d, want %d", got, tt.want)
			}
		})
	}
}
