package cursor_test

// The store against a real PostgreSQL: one server per test binary
// (pgtest.Main), a migrated database per test. Skipped with -short.

import (
	"context"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/internal/pgtest"
	"github.com/pgscribe/pgscribe/migrations"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// storeDB returns a pool on a fresh database whose engine schema is migrated.
func storeDB(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	dsn := pgtest.Database(t)
	if _, err := migrations.Apply(context.Background(), pgtest.Connect(t, dsn), schema); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func mustLSN(t *testing.T, s string) event.LSN {
	t.Helper()
	l, err := event.ParseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestCursorAdvanceInTransaction(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	store := cursor.New("pgscribe", "balances", 1)

	if has, err := store.HasCursors(ctx, pool); err != nil || has {
		t.Fatalf("HasCursors on a fresh version = %v, %v", has, err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = store.Advance(ctx, tx, []cursor.Advance{
		{StreamID: "a", StreamPosition: 2, Position: 10, Applied: 2},
		{StreamID: "b", StreamPosition: 1, Position: 11, Skipped: 1},
		{StreamID: "a", StreamPosition: 3, Position: 12, DeadLettered: 1}, // same stream again: merged
	})
	if err != nil {
		t.Fatalf("Advance: %v", err)
	}
	// Visible inside the transaction, not outside before commit.
	got, err := store.Load(ctx, tx, []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]cursor.Cursor{"a": {StreamPosition: 3, Position: 12}, "b": {StreamPosition: 1, Position: 11}}
	if !mapsEqual(got, want) {
		t.Errorf("Load in tx = %v, want %v", got, want)
	}
	if outside, err := store.Load(ctx, pool, []string{"a", "b"}); err != nil || len(outside) != 0 {
		t.Errorf("Load outside the open tx = %v, %v; want nothing", outside, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}

	// Second batch: positions replace, counts add.
	if err := store.Advance(ctx, pool, []cursor.Advance{
		{StreamID: "a", StreamPosition: 4, Position: 20, Applied: 1},
		{StreamID: "c", StreamPosition: 1, Position: 21, Applied: 1},
	}); err != nil {
		t.Fatal(err)
	}
	got, err = store.Load(ctx, pool, []string{"a", "b", "c", "missing"})
	if err != nil {
		t.Fatal(err)
	}
	want = map[string]cursor.Cursor{
		"a": {StreamPosition: 4, Position: 20},
		"b": {StreamPosition: 1, Position: 11},
		"c": {StreamPosition: 1, Position: 21},
	}
	if !mapsEqual(got, want) {
		t.Errorf("Load = %v, want %v", got, want)
	}
	var applied, skipped, dead int64
	if err := pool.QueryRow(ctx, `SELECT applied, skipped, dead_lettered FROM pgscribe.cursors
WHERE projection = 'balances' AND version = 1 AND stream_id = 'a'`).Scan(&applied, &skipped, &dead); err != nil {
		t.Fatal(err)
	}
	if applied != 3 || skipped != 0 || dead != 1 {
		t.Errorf("stream a counts = %d/%d/%d, want 3/0/1", applied, skipped, dead)
	}
	totals, err := store.Totals(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if want := (cursor.Totals{Streams: 3, Applied: 4, Skipped: 1, DeadLettered: 1}); totals != want {
		t.Errorf("Totals = %+v, want %+v", totals, want)
	}
	if has, err := store.HasCursors(ctx, pool); err != nil || !has {
		t.Errorf("HasCursors = %v, %v; want true", has, err)
	}

	// Another version and another projection see nothing of this one.
	for _, other := range []*cursor.Store{cursor.New("pgscribe", "balances", 2), cursor.New("pgscribe", "other", 1)} {
		if m, err := other.Load(ctx, pool, []string{"a", "b", "c"}); err != nil || len(m) != 0 {
			t.Errorf("other store Load = %v, %v; want nothing", m, err)
		}
		if tot, err := other.Totals(ctx, pool); err != nil || tot != (cursor.Totals{}) {
			t.Errorf("other store Totals = %+v, %v; want zero", tot, err)
		}
	}
	if m, err := store.Load(ctx, pool, nil); err != nil || len(m) != 0 {
		t.Errorf("Load(nil) = %v, %v", m, err)
	}
	if err := store.Advance(ctx, pool, nil); err != nil {
		t.Errorf("Advance(nil) = %v", err)
	}
}

func mapsEqual(a, b map[string]cursor.Cursor) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestCursorRollbackLeavesNothing(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	store := cursor.New("pgscribe", "balances", 1)

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Advance(ctx, tx, []cursor.Advance{{StreamID: "a", StreamPosition: 1, Position: 1, DeadLettered: 1}}); err != nil {
		t.Fatal(err)
	}
	ev := &event.Event{Position: 1, ID: "e1", StreamID: "a", StreamPosition: 1, Type: "T", RawData: []byte(`{}`)}
	if err := deadletter.Insert(ctx, tx, "pgscribe", []deadletter.Row{deadletter.FromEvent("balances", 1, ev, "rule:r", "boom")}); err != nil {
		t.Fatal(err)
	}
	if err := store.SaveWatermark(ctx, tx, cursor.Watermark{LSN: 0x100, Position: 1}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	if has, err := store.HasCursors(ctx, pool); err != nil || has {
		t.Errorf("HasCursors after rollback = %v, %v", has, err)
	}
	if _, ok, err := store.LoadWatermark(ctx, pool); err != nil || ok {
		t.Errorf("watermark after rollback: found %v, err %v", ok, err)
	}
	if rows, err := deadletter.List(ctx, pool, "pgscribe", deadletter.Filter{}); err != nil || len(rows) != 0 {
		t.Errorf("dead letters after rollback = %d, %v", len(rows), err)
	}
}

func TestCursorWatermark(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	store := cursor.New("pgscribe", "balances", 1)

	if _, ok, err := store.LoadWatermark(ctx, pool); err != nil || ok {
		t.Fatalf("LoadWatermark on a fresh version: found %v, err %v", ok, err)
	}
	load := func() cursor.Watermark {
		t.Helper()
		w, ok, err := store.LoadWatermark(ctx, pool)
		if err != nil || !ok {
			t.Fatalf("LoadWatermark: found %v, err %v", ok, err)
		}
		return w
	}

	// Backfill: progress at LSN 0, phase set with totals.
	if err := store.SaveWatermark(ctx, pool, cursor.Watermark{SlotName: "pgscribe_balances_v1", BackfillTotal: 1000}); err != nil {
		t.Fatal(err)
	}
	if w := load(); w.Phase != cursor.PhaseBackfilling || w.BackfillTotal != 1000 || w.BackfillDone != 0 {
		t.Errorf("first save = %+v, want phase backfilling, total 1000", w)
	}
	if err := store.SaveWatermark(ctx, pool, cursor.Watermark{Position: 500}); err != nil {
		t.Fatal(err)
	}
	if err := store.SetPhase(ctx, pool, cursor.PhaseBackfilling, 1000, 500); err != nil {
		t.Fatal(err)
	}
	w := load()
	if w.SlotName != "pgscribe_balances_v1" || w.LSN != 0 || w.Position != 500 || w.Phase != cursor.PhaseBackfilling ||
		w.BackfillTotal != 1000 || w.BackfillDone != 500 || !w.CommitTime.IsZero() || w.UpdatedAt.IsZero() {
		t.Errorf("backfill watermark = %+v", w)
	}

	// Live: the watermark moves forward only.
	t1 := time.Date(2025, 1, 2, 3, 4, 5, 123456000, time.UTC)
	lsn := mustLSN(t, "16/B374D848")
	if err := store.SaveWatermark(ctx, pool, cursor.Watermark{LSN: lsn, Position: 900, CommitTime: t1, Phase: cursor.PhaseLive}); err != nil {
		t.Fatal(err)
	}
	w = load()
	if w.LSN != lsn || w.Position != 900 || !w.CommitTime.Equal(t1) || w.Phase != cursor.PhaseLive ||
		w.SlotName != "pgscribe_balances_v1" || w.BackfillTotal != 1000 || w.BackfillDone != 500 {
		t.Errorf("live watermark = %+v", w)
	}
	if err := store.SaveWatermark(ctx, pool, cursor.Watermark{LSN: lsn - 1, Position: 800, CommitTime: t1.Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	if w = load(); w.LSN != lsn || w.Position != 900 || !w.CommitTime.Equal(t1) {
		t.Errorf("watermark went backwards: %+v", w)
	}
	if err := store.SaveWatermark(ctx, pool, cursor.Watermark{Position: 1}); err != nil {
		t.Fatal(err)
	}
	if w = load(); w.LSN != lsn || w.Position != 900 {
		t.Errorf("zero LSN moved the watermark: %+v", w)
	}
	t2 := t1.Add(time.Minute)
	if err := store.SaveWatermark(ctx, pool, cursor.Watermark{LSN: lsn + 0x100000000, Position: 950, CommitTime: t2}); err != nil {
		t.Fatal(err)
	}
	if w = load(); w.LSN != lsn+0x100000000 || w.Position != 950 || !w.CommitTime.Equal(t2) || w.Phase != cursor.PhaseLive {
		t.Errorf("watermark did not move forward: %+v", w)
	}
	// A restarted engine that has seen no event yet saves position 0 with
	// the server's later WAL end: the position stays.
	if err := store.SaveWatermark(ctx, pool, cursor.Watermark{LSN: lsn + 0x200000000, CommitTime: t2}); err != nil {
		t.Fatal(err)
	}
	if w = load(); w.LSN != lsn+0x200000000 || w.Position != 950 {
		t.Errorf("a later LSN without events moved the position back: %+v", w)
	}

	if err := store.SetPhase(ctx, pool, "finished", 0, 0); err == nil {
		t.Error("SetPhase accepted an unknown phase")
	}

	// Reset drops this version's cursors and watermark only.
	if err := store.Advance(ctx, pool, []cursor.Advance{{StreamID: "a", StreamPosition: 1, Position: 1, Applied: 1}}); err != nil {
		t.Fatal(err)
	}
	other := cursor.New("pgscribe", "balances", 2)
	if err := other.Advance(ctx, pool, []cursor.Advance{{StreamID: "a", StreamPosition: 1, Position: 1, Applied: 1}}); err != nil {
		t.Fatal(err)
	}
	if err := other.SaveWatermark(ctx, pool, cursor.Watermark{LSN: lsn}); err != nil {
		t.Fatal(err)
	}
	ev := &event.Event{Position: 1, ID: "e1", StreamID: "a", StreamPosition: 1, Type: "T"}
	if err := deadletter.Insert(ctx, pool, "pgscribe", []deadletter.Row{deadletter.FromEvent("balances", 1, ev, "k", "m")}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO pgscribe.leases (projection, version, epoch, node) VALUES ('balances', 1, 7, 'n1')"); err != nil {
		t.Fatal(err)
	}
	if err := store.Reset(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if has, _ := store.HasCursors(ctx, pool); has {
		t.Error("cursors survived Reset")
	}
	if _, ok, _ := store.LoadWatermark(ctx, pool); ok {
		t.Error("watermark survived Reset")
	}
	if has, _ := other.HasCursors(ctx, pool); !has {
		t.Error("Reset removed another version's cursors")
	}
	if _, ok, _ := other.LoadWatermark(ctx, pool); !ok {
		t.Error("Reset removed another version's watermark")
	}
	var deadRows, leases int
	if err := pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM pgscribe.dead_letters), (SELECT count(*) FROM pgscribe.leases)").Scan(&deadRows, &leases); err != nil {
		t.Fatal(err)
	}
	if deadRows != 1 || leases != 1 {
		t.Errorf("after Reset: %d dead letters, %d leases; want 1 and 1", deadRows, leases)
	}
}

// TestCursorUpdatesStayOnPage: the cursors table leaves room on its pages
// (migration 0040), so advancing a stream's cursor is a HOT update — no
// new primary-key entry — as long as a transaction touches a fraction of
// a page's streams, which is what a batch does in a catch-up over many
// streams. Measured in each transaction by pg_stat_xact_user_tables.
func TestCursorUpdatesStayOnPage(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	store := cursor.New("pgscribe", "balances", 1)
	const streams, rounds, share = 2000, 10, 5 // each round advances every 5th stream
	round := func(r int, ids func(i int) bool) (upd, hot int64) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		var adv []cursor.Advance
		for i := range streams {
			if ids(i) {
				adv = append(adv, cursor.Advance{StreamID: fmt.Sprintf("stream-%05d", i), StreamPosition: int64(r + 1), Position: int64(r*streams + i + 1), Applied: 1})
			}
		}
		// The backend's counts not yet sent to the statistics system,
		// earlier transactions' included: the round is the difference.
		counts := func() (upd, hot int64) {
			if err := tx.QueryRow(ctx, `SELECT coalesce(sum(n_tup_upd), 0)::bigint, coalesce(sum(n_tup_hot_upd), 0)::bigint
				FROM pg_stat_xact_user_tables WHERE relid = 'pgscribe.cursors'::regclass`).Scan(&upd, &hot); err != nil {
				t.Fatal(err)
			}
			return upd, hot
		}
		upd0, hot0 := counts()
		if err := store.Advance(ctx, tx, adv); err != nil {
			t.Fatalf("round %d: Advance: %v", r, err)
		}
		upd, hot = counts()
		upd, hot = upd-upd0, hot-hot0
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		return upd, hot
	}
	round(0, func(int) bool { return true }) // every stream's first cursor
	var upd, hot int64
	for r := 1; r <= rounds; r++ {
		u, h := round(r, func(i int) bool { return i%share == r%share })
		upd, hot = upd+u, hot+h
	}
	if want := int64(rounds * streams / share); upd != want {
		t.Fatalf("%d cursor updates counted, want %d", upd, want)
	}
	if float64(hot) < 0.9*float64(upd) {
		t.Errorf("%d of %d cursor updates were HOT, want at least 90%% (is the cursors table's fillfactor set?)", hot, upd)
	}
	var opts []string
	if err := pool.QueryRow(ctx, "SELECT coalesce(reloptions, '{}') FROM pg_class WHERE oid = 'pgscribe.cursors'::regclass").Scan(&opts); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d of %d cursor updates HOT; cursors reloptions %v", hot, upd, opts)
}

// TestSaveWatermarksAsOne: the saves of several versions in one statement
// (a group's members, SaveWatermarksStatement) leave the watermarks table
// exactly as the same saves one by one (SaveWatermarkStatement) do: first
// saves, later ones, one whose LSN is behind the stored one, with and
// without a measurement, an empty slot name, a stored phase kept.
func TestSaveWatermarksAsOne(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "one")
	if _, err := migrations.Apply(ctx, pgtest.Connect(t, pool.Config().ConnConfig.ConnString()), "many"); err != nil {
		t.Fatalf("migrate second schema: %v", err)
	}
	names := []string{"a", "b", "c"}
	stores := map[string][]*cursor.Store{}
	for _, schema := range []string{"one", "many"} {
		for _, n := range names {
			stores[schema] = append(stores[schema], cursor.New(schema, n, 1))
		}
		// b already has a row, in phase live.
		if err := stores[schema][1].SetPhase(ctx, pool, cursor.PhaseLive, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rounds := [][]cursor.Watermark{
		{{SlotName: "s", LSN: mustLSN(t, "0/100"), Position: 10, CommitTime: at},
			{SlotName: "s", LSN: mustLSN(t, "0/200"), Position: 20},
			{SlotName: "g", LSN: mustLSN(t, "0/300"), Position: 30, CommitTime: at, MeasuredAt: at, LagSeconds: 1.5, Backlog: 7}},
		{{SlotName: "", LSN: mustLSN(t, "0/180"), Position: 15, CommitTime: at.Add(time.Second)},
			{SlotName: "g", LSN: mustLSN(t, "0/150"), Position: 25, CommitTime: at}, // behind: keeps the stored
			{SlotName: "g", LSN: mustLSN(t, "0/310"), Position: 31, MeasuredAt: at.Add(time.Second), LagSeconds: 0.5, Backlog: -1}},
		{{SlotName: "s", LSN: mustLSN(t, "0/190"), Position: 16},
			{SlotName: "s", LSN: mustLSN(t, "0/250"), Position: 26, CommitTime: at.Add(2 * time.Second)},
			{SlotName: "g", LSN: mustLSN(t, "0/320"), Position: 32}}, // no measurement: the last one stays
	}
	for r, ws := range rounds {
		for i, w := range ws {
			sql, args, err := stores["one"][i].SaveWatermarkStatement(w)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, sql, args...); err != nil {
				t.Fatalf("round %d: single save of %s: %v", r, names[i], err)
			}
		}
		sql, args, err := cursor.SaveWatermarksStatement(stores["many"], ws)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("round %d: saves in one statement: %v", r, err)
		}
		read := func(schema string) string {
			var s string
			err := pool.QueryRow(ctx, `SELECT string_agg(format('%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s', projection, version, slot_name, lsn,
				position, commit_time, phase, backfill_total, backfill_done, measured_at, lag_seconds, backlog_events), E'\n' ORDER BY projection)
				FROM `+schema+`.watermarks`).Scan(&s)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
		if one, many := read("one"), read("many"); one != many {
			t.Errorf("round %d: one by one:\n%s\nin one statement:\n%s", r, one, many)
		}
	}
	if _, _, err := cursor.SaveWatermarksStatement(stores["many"][:1], []cursor.Watermark{{Phase: cursor.PhaseLive}}); err == nil {
		t.Error("a save that sets the phase was accepted in one statement")
	}
	if _, _, err := cursor.SaveWatermarksStatement([]*cursor.Store{stores["one"][0], stores["many"][1]}, make([]cursor.Watermark, 2)); err == nil {
		t.Error("stores of two engine schemas were accepted in one statement")
	}
}

// A stream parked at position 0 (a stream numbered from 0 whose first
// event was dead-lettered) stays parked through the cursors table: its
// parked_since is 0, not NULL, and Load says so. A stream not parked has
// parked_since NULL.
func TestCursorParkedAtZero(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	store := cursor.New("pgscribe", "p", 1)
	if err := store.Advance(ctx, pool, []cursor.Advance{
		{StreamID: "zero", StreamPosition: 1, Position: 2, DeadLettered: 1, Parked: 1, Parks: true, ParkedSince: 0},
		{StreamID: "free", StreamPosition: 1, Position: 3, Applied: 2},
	}); err != nil {
		t.Fatal(err)
	}
	got, err := store.Load(ctx, pool, []string{"zero", "free"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]cursor.Cursor{"zero": {StreamPosition: 1, Position: 2, Parked: true, ParkedSince: 0}, "free": {StreamPosition: 1, Position: 3}}
	if !mapsEqual(got, want) {
		t.Errorf("Load = %+v, want %+v", got, want)
	}
	var nulls int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pgscribe.cursors WHERE parked_since IS NULL`).Scan(&nulls); err != nil || nulls != 1 {
		t.Errorf("%d cursors with parked_since NULL (%v), want 1 (the stream not parked)", nulls, err)
	}
	// A later batch neither unparks it nor moves its park.
	if err := store.Advance(ctx, pool, []cursor.Advance{{StreamID: "zero", StreamPosition: 2, Position: 4, Parked: 1}}); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Load(ctx, pool, []string{"zero"}); err != nil || !got["zero"].Parked || got["zero"].ParkedSince != 0 {
		t.Errorf("after a later batch: %+v, %v; want parked since 0", got["zero"], err)
	}
}

// A backfill point is kept while the phase is backfilling and is cleared
// by any phase change: a point left from an earlier backfill must never
// resume another snapshot's.
func TestBackfillPoint(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	store := cursor.New("pgscribe", "balances", 1)
	load := func() (cursor.BackfillPoint, bool) {
		t.Helper()
		p, ok, err := store.LoadBackfillPoint(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		return p, ok
	}
	if _, ok := load(); ok {
		t.Fatal("a point on a version with no watermark")
	}
	if err := store.SetPhase(ctx, pool, cursor.PhaseBackfilling, 1000, 0); err != nil {
		t.Fatal(err)
	}
	pt := cursor.BackfillPoint{LSN: mustLSN(t, "0/16B3748"), UpTo: 1200, After: math.MinInt64}
	if err := store.SaveBackfillPoint(ctx, pool, pt); err != nil {
		t.Fatal(err)
	}
	pt.Total = 1000
	if got, ok := load(); !ok || got != pt {
		t.Fatalf("point = %+v (%v), want %+v", got, ok, pt)
	}
	pt.After, pt.Done = 640, 600
	if err := store.SaveBackfillPoint(ctx, pool, pt); err != nil {
		t.Fatal(err)
	}
	if got, ok := load(); !ok || got != pt {
		t.Fatalf("point = %+v (%v), want %+v", got, ok, pt)
	}
	w, _, err := store.LoadWatermark(ctx, pool)
	if err != nil || w.BackfillDone != 600 {
		t.Errorf("backfill_done = %d (%v), want the point's 600", w.BackfillDone, err)
	}
	if err := store.SetPhase(ctx, pool, cursor.PhaseBackfilling, 1000, 700); err != nil {
		t.Fatal(err)
	}
	if got, ok := load(); ok {
		t.Errorf("a phase save kept the point %+v", got)
	}
	if err := store.SaveBackfillPoint(ctx, pool, pt); err != nil {
		t.Fatal(err)
	}
	if err := store.SetPhase(ctx, pool, cursor.PhaseLive, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if got, ok := load(); ok {
		t.Errorf("phase live kept the point %+v", got)
	}
	// Once live, a save does not bring one back.
	if err := store.SaveBackfillPoint(ctx, pool, pt); err != nil {
		t.Fatal(err)
	}
	if got, ok := load(); ok {
		t.Errorf("a point saved on a live version: %+v", got)
	}
}
