package engine

import (
	"cmp"
	"log/slog"
	"os"
	"runtime/debug"
	"slices"

	"github.com/pgscribe/pgscribe/config"
)

// SetGCPercent applies the engine's garbage-collector target unless GOGC
// is set in the environment (which wins).
//
// The engine's live heap is small and flat (bounded queues), so the
// default GC target makes it collect far more often than memory needs:
// GOGC=200 cut the engine's CPU per event by ~20% in a 300k-event
// backfill for ~16 MB more peak RSS.
func SetGCPercent() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
}

// SetMemoryLimit sets the soft memory limit for a node running cfg unless
// GOMEMLIMIT is set in the environment (which wins), and logs it.
func SetMemoryLimit(cfg *config.Config, log *slog.Logger) {
	if os.Getenv("GOMEMLIMIT") != "" {
		return
	}
	limit := defaultMemoryLimit(cfg)
	debug.SetMemoryLimit(limit)
	log.Info("soft memory limit (GOMEMLIMIT to change)", "bytes", limit)
}

// memoryLimitPerProjection is the soft memory limit (a GC target, not a
// cap) per group that can be active on this node, used when GOMEMLIMIT is
// not set, and memoryLimitPerMember what each member past a group's first
// adds. With the default engine settings a projection's live heap stays
// well under it (bounded queues and batches); what it stops is GOGC=200
// letting the heap of a long backfill drift up between collections (peak
// RSS of a 5M-event backfill 153 MB without it, against 114 MB for 1M).
// A group's members share its scan, its stream and the documents they
// decode: 8 members backfilling 1M events peaked at 409 MB with 96 MiB
// each as the target, under 300 MB with a member's share (W7, RESULTS.md).
// Raise it with GOMEMLIMIT for large events or queues.
const (
	memoryLimitPerProjection = 96 << 20
	memoryLimitPerMember     = 24 << 20
)

// defaultMemoryLimit is the sum of the targets of the groups this node
// can run at once (max_active_projections counts a group as one: the
// largest groups count).
func defaultMemoryLimit(cfg *config.Config) int64 {
	var each []int64
	for _, idx := range cfg.Groups() {
		each = append(each, memoryLimitPerProjection+int64(len(idx)-1)*memoryLimitPerMember)
	}
	slices.SortFunc(each, func(a, b int64) int { return cmp.Compare(b, a) })
	if m := cfg.Engine.MaxActiveProjections; m > 0 && m < len(each) {
		each = each[:m]
	}
	var sum int64
	for _, l := range each {
		sum += l
	}
	return max(sum, memoryLimitPerProjection)
}
