package engine

import (
	"testing"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/rules"
)

func TestDefaultMemoryLimit(t *testing.T) {
	projections := func(n int) []rules.Spec { return make([]rules.Spec, n) }
	tests := []struct {
		name      string
		n, active int
		want      int64
	}{
		{"one projection", 1, 0, 96 << 20},
		{"three, all active", 3, 0, 3 * 96 << 20},
		{"three, at most two active here", 3, 2, 2 * 96 << 20},
		{"max_active above the count", 2, 5, 2 * 96 << 20},
		{"none", 0, 0, 96 << 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{Projections: projections(tt.n)}
			cfg.Engine.MaxActiveProjections = tt.active
			if got := defaultMemoryLimit(cfg); got != tt.want {
				t.Errorf("defaultMemoryLimit = %d, want %d", got, tt.want)
			}
		})
	}
}
