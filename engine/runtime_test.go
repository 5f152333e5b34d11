package engine

import (
	"testing"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/rules"
)

func TestDefaultMemoryLimit(t *testing.T) {
	// groups lists each projection's group.
	projections := func(groups ...string) []rules.Spec {
		out := make([]rules.Spec, len(groups))
		for i, g := range groups {
			out[i].Group = g
		}
		return out
	}
	const mb = 1 << 20
	tests := []struct {
		name   string
		groups []string
		active int
		want   int64
	}{
		{"one projection", []string{"a"}, 0, 96 * mb},
		{"three alone, all active", []string{"a", "b", "c"}, 0, 3 * 96 * mb},
		{"three alone, at most two active here", []string{"a", "b", "c"}, 2, 2 * 96 * mb},
		{"max_active above the count", []string{"a", "b"}, 5, 2 * 96 * mb},
		{"a group of eight", []string{"g", "g", "g", "g", "g", "g", "g", "g"}, 0, (96 + 7*24) * mb},
		{"a group of three and one alone, one active: the larger", []string{"g", "a", "g", "g"}, 1, (96 + 2*24) * mb},
		{"none", nil, 0, 96 * mb},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := &config.Config{Projections: projections(tt.groups...)}
			cfg.Engine.MaxActiveProjections = tt.active
			if got := defaultMemoryLimit(cfg); got != tt.want {
				t.Errorf("defaultMemoryLimit = %d MiB, want %d MiB", got/mb, tt.want/mb)
			}
		})
	}
}
