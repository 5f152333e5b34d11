package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/pgscribe/pgscribe/apply"
)

// TestHaltErrorOfAnyType: halts of errors of different types, one after
// the other, are recorded (an atomic.Value of the error panicked on the
// second type).
func TestHaltErrorOfAnyType(t *testing.T) {
	p := &Projection{}
	if p.haltError() != nil {
		t.Fatal("a halt error before any halt")
	}
	for _, err := range []error{errors.New("source halt"), fmt.Errorf("structural: %w", errors.New("42703")), &apply.HaltError{Reason: "on_error = halt"}} {
		p.setHaltErr(err)
		if got := p.haltError(); got != err {
			t.Errorf("halt error %v, want %v", got, err)
		}
	}
}
