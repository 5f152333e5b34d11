package pgtest

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var dbSeq atomic.Int64

// NewDatabase creates an empty database named after t.Name() (made unique,
// so that parallel tests and test binaries sharing an external server never
// collide) and returns its DSN. The database, with its backends and
// replication slots, is dropped in t.Cleanup.
func NewDatabase(t testing.TB, s *Server) string {
	t.Helper()
	name := DatabaseName(t.Name())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn, err := s.CreateDatabase(ctx, name)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.DropDatabase(ctx, name); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

// DatabaseName turns a test name into a unique database name: lower case
// letters, digits and underscores, at most 63 bytes, ending in a sequence
// number and random hex.
func DatabaseName(testName string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(testName) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	base := strings.Trim(b.String(), "_")
	if base == "" || base[0] >= '0' && base[0] <= '9' {
		base = "t_" + base
	}
	suffix := "_" + strconv.FormatInt(dbSeq.Add(1), 10) + "_" + randomHex(3)
	if len(base) > 63-len(suffix) {
		base = base[:63-len(suffix)]
	}
	return base + suffix
}
