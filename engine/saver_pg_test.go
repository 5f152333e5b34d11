package engine

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/internal/pgtest"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/migrations"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// TestSaverFencedMemberDoesNotFailTheOthers: the group saver commits the
// members' waiting watermark saves in one transaction; when one member's
// lease has been taken over, that transaction fails, and each save is
// retried alone under its own lease, so the fenced member's save fails and
// every other member's is stored.
func TestSaverFencedMemberDoesNotFailTheOthers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dsn := pgtest.Database(t)
	admin := pgtest.Connect(t, dsn)
	if _, err := migrations.Apply(ctx, admin, "pgscribe"); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	names := []string{"a", "b", "c"}
	leases := make([]*leader.Lease, len(names))
	stores := make([]*cursor.Store, len(names))
	for i, n := range names {
		l, err := leader.TryAcquire(ctx, dsn, "pgscribe", n, 1, "node-1", 0)
		if err != nil || l == nil {
			t.Fatalf("acquire %s: %v (lease %v)", n, err, l)
		}
		t.Cleanup(func() { l.Release(context.Background()) })
		leases[i], stores[i] = l, cursor.New("pgscribe", n, 1)
	}
	sv := newSaver(dsn, 0, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))

	// saveAll queues every member's save before the saver runs, so that
	// they are served as one batch, and returns each save's error.
	saveAll := func(lsn string, pos int64) []error {
		t.Helper()
		at, err := event.ParseLSN(lsn)
		if err != nil {
			t.Fatal(err)
		}
		errs := make([]chan error, len(names))
		for i := range names {
			errs[i] = make(chan error, 1)
			w := cursor.Watermark{SlotName: "pgscribe_group_default", LSN: at, Position: pos}
			go func() { errs[i] <- sv.save(ctx, leases[i], stores[i], w) }()
		}
		deadline := time.Now().Add(10 * time.Second)
		for len(sv.reqs) < len(names) {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d saves queued", len(sv.reqs), len(names))
			}
			time.Sleep(time.Millisecond)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); sv.run(rctx) }()
		out := make([]error, len(names))
		for i := range names {
			out[i] = <-errs[i]
		}
		stop()
		<-done
		return out
	}
	stored := func(i int) (cursor.Watermark, bool) {
		t.Helper()
		w, ok, err := stores[i].LoadWatermark(ctx, admin)
		if err != nil {
			t.Fatalf("load watermark of %s: %v", names[i], err)
		}
		return w, ok
	}

	// writers returns how many transactions wrote the rows of the named
	// members (their xmin).
	writers := func(members ...string) int {
		t.Helper()
		var n int
		err := admin.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM pgscribe.watermarks WHERE projection = ANY($1)`, members).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// Every lease valid: the one transaction stores all three.
	for i, err := range saveAll("0/1000", 10) {
		if err != nil {
			t.Fatalf("save of %s with every lease valid: %v", names[i], err)
		}
		if w, ok := stored(i); !ok || w.LSN.String() != "0/1000" || w.Position != 10 {
			t.Fatalf("%s stored %+v (row %v), want 0/1000 at position 10", names[i], w, ok)
		}
	}

	if n := writers("a", "b", "c"); n != 1 {
		t.Fatalf("the three saves were written by %d transactions, want one", n)
	}

	// b's lease is taken over (another node's bump of its epoch).
	if _, err := admin.Exec(ctx, `UPDATE pgscribe.leases SET epoch = epoch + 1 WHERE projection = 'b'`); err != nil {
		t.Fatal(err)
	}
	errs := saveAll("0/2000", 20)
	for i, err := range errs {
		w, _ := stored(i)
		switch names[i] {
		case "b":
			if !errors.Is(err, event.ErrFenced) {
				t.Fatalf("b's save after its lease was taken over: %v, want ErrFenced", err)
			}
			if w.LSN.String() != "0/1000" || w.Position != 10 {
				t.Fatalf("the fenced member's watermark moved to %s at %d", w.LSN, w.Position)
			}
		default:
			if err != nil {
				t.Fatalf("%s's save failed with b's lease fenced: %v", names[i], err)
			}
			if w.LSN.String() != "0/2000" || w.Position != 20 {
				t.Fatalf("%s stored %s at %d, want 0/2000 at 20", names[i], w.LSN, w.Position)
			}
		}
	}
	// After the combined transaction failed, a and c were each saved alone.
	if n := writers("a", "c"); n != 2 {
		t.Fatalf("a and c were written by %d transactions after the fallback, want 2 (each alone)", n)
	}
}
