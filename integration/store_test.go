package integration

// Tests of the engine's storage against real PostgreSQL: migrations, the
// source-side DDL (events table, publication), cursors and watermarks, dead
// letters, and quoting of configured identifiers.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/migrations"
)

// storeTables are the engine tables of the latest schema version.
// storeTables are the engine schema's tables and views (information_schema
// lists both).
var storeTables = []string{"controls", "cursors", "dead_letters", "leases", "parked_events", "progress", "read_models", "retry_requests", "schema_migrations", "served", "watermarks"}

func storeConn(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func storePool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// storeDB returns a pool on a fresh database whose engine schema is migrated.
func storeDB(t *testing.T, schema string) *pgxpool.Pool {
	t.Helper()
	if testing.Short() {
		t.Skip("database test")
	}
	dsn := newDatabase(t)
	if _, err := migrations.Apply(context.Background(), storeConn(t, dsn), schema); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return storePool(t, dsn)
}

// schemaTables lists the tables of schema, sorted.
func schemaTables(t *testing.T, q migrations.Querier, schema string) []string {
	t.Helper()
	var names []string
	err := q.QueryRow(context.Background(),
		"SELECT coalesce(array_agg(table_name::text ORDER BY table_name), '{}') FROM information_schema.tables WHERE table_schema = $1",
		schema).Scan(&names)
	if err != nil {
		t.Fatalf("list tables: %v", err)
	}
	return names
}

func TestMigrationsApplyTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("database test")
	}
	ctx := context.Background()
	conn := storeConn(t, newDatabase(t))

	applied, err := migrations.Apply(ctx, conn, "pgscribe")
	if err != nil {
		t.Fatalf("first Apply: %v", err)
	}
	want := migrations.Versions()
	if !slices.Equal(applied, want) {
		t.Errorf("first Apply applied %v, want %v", applied, want)
	}
	applied, err = migrations.Apply(ctx, conn, "pgscribe")
	if err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if len(applied) != 0 {
		t.Errorf("second Apply applied %v, want nothing", applied)
	}
	if got := schemaTables(t, conn, "pgscribe"); !slices.Equal(got, storeTables) {
		t.Errorf("tables = %v, want %v", got, storeTables)
	}
	var rows int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pgscribe.schema_migrations").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != len(want) {
		t.Errorf("schema_migrations has %d rows, want %d", rows, len(want))
	}
}

func TestMigrationsConcurrentApply(t *testing.T) {
	if testing.Short() {
		t.Skip("database test")
	}
	ctx := context.Background()
	dsn := newDatabase(t)
	const nodes = 4
	conns := make([]*pgx.Conn, nodes)
	for i := range conns {
		conns[i] = storeConn(t, dsn)
	}
	results := make([][]int, nodes)
	errs := make([]error, nodes)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			<-start
			results[i], errs[i] = migrations.Apply(ctx, conns[i], "pgscribe")
		})
	}
	close(start)
	wg.Wait()
	appliedBy := 0
	for i := range nodes {
		if errs[i] != nil {
			t.Errorf("node %d: Apply: %v", i, errs[i])
		}
		if len(results[i]) > 0 {
			appliedBy++
		}
	}
	if appliedBy != 1 {
		t.Errorf("%d nodes applied migrations, want exactly 1 (results %v)", appliedBy, results)
	}
	if got := schemaTables(t, conns[0], "pgscribe"); !slices.Equal(got, storeTables) {
		t.Errorf("tables = %v, want %v", got, storeTables)
	}
	version, err := migrations.Current(ctx, conns[0], "pgscribe")
	if err != nil || version != migrations.Latest() {
		t.Errorf("Current = %d, %v; want %d", version, err, migrations.Latest())
	}
}

func TestMigrationsCurrentLatest(t *testing.T) {
	if testing.Short() {
		t.Skip("database test")
	}
	ctx := context.Background()
	conn := storeConn(t, newDatabase(t))

	if v, err := migrations.Current(ctx, conn, "pgscribe"); err != nil || v != 0 {
		t.Errorf("Current without schema = %d, %v; want 0, nil", v, err)
	}
	if _, err := conn.Exec(ctx, "CREATE SCHEMA pgscribe"); err != nil {
		t.Fatal(err)
	}
	if v, err := migrations.Current(ctx, conn, "pgscribe"); err != nil || v != 0 {
		t.Errorf("Current with empty schema = %d, %v; want 0, nil", v, err)
	}
	if _, err := migrations.Apply(ctx, conn, "pgscribe"); err != nil {
		t.Fatal(err)
	}
	if v, err := migrations.Current(ctx, conn, "pgscribe"); err != nil || v != migrations.Latest() {
		t.Errorf("Current after Apply = %d, %v; want %d", v, err, migrations.Latest())
	}

	// A database migrated by a newer binary is refused, and left alone.
	if _, err := conn.Exec(ctx, "INSERT INTO pgscribe.schema_migrations (version) VALUES ($1)", migrations.Latest()+1); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, "pgscribe"); !errors.Is(err, migrations.ErrSchemaTooNew) {
		t.Errorf("Apply on a newer schema: err = %v, want ErrSchemaTooNew", err)
	}
	if v, err := migrations.Current(ctx, conn, "pgscribe"); err != nil || v != migrations.Latest()+1 {
		t.Errorf("Current = %d, %v; want %d", v, err, migrations.Latest()+1)
	}

	if _, err := migrations.Apply(ctx, conn, ""); err == nil {
		t.Error("Apply with an empty schema name succeeded")
	}
}

// A role that owns a schema made for it by an administrator, but may not
// create schemas, can migrate it.
func TestMigrationsPrecreatedSchema(t *testing.T) {
	if testing.Short() {
		t.Skip("database test")
	}
	ctx := context.Background()
	dsn := newDatabase(t)
	admin := storeConn(t, dsn)
	var role string
	if err := admin.QueryRow(ctx, "SELECT 'migrator_' || current_database()").Scan(&role); err != nil {
		t.Fatal(err)
	}
	quoted := pgx.Identifier{role}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE ROLE "+quoted+" NOLOGIN;\n"+
		`CREATE SCHEMA "App Engine" AUTHORIZATION `+quoted); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // before the database is dropped: the role is cluster-wide
		c, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			t.Logf("drop role %s: %v", role, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(context.Background(), "DROP OWNED BY "+quoted+";\nDROP ROLE "+quoted); err != nil {
			t.Logf("drop role %s: %v", role, err)
		}
	})

	conn := storeConn(t, dsn)
	if _, err := conn.Exec(ctx, "SET ROLE "+quoted); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.Apply(ctx, conn, "not there"); err == nil {
		t.Fatal("a role without CREATE on the database created a schema; the test proves nothing")
	}
	applied, err := migrations.Apply(ctx, conn, "App Engine")
	if err != nil || !slices.Equal(applied, migrations.Versions()) {
		t.Fatalf("Apply on a pre-created schema = %v, %v", applied, err)
	}
	if got := schemaTables(t, conn, "App Engine"); !slices.Equal(got, storeTables) {
		t.Errorf("tables = %v, want %v", got, storeTables)
	}
}

// pubInfo is a publication as the catalog sees it.
type pubInfo struct {
	Insert, Update, Delete, Truncate bool
	Tables                           []string // schema.table, sorted
	Filtered                         bool     // a row filter on some table
}

func loadPub(t *testing.T, q migrations.Querier, name string) (pubInfo, bool) {
	t.Helper()
	var p pubInfo
	err := q.QueryRow(context.Background(), `SELECT p.pubinsert, p.pubupdate, p.pubdelete, p.pubtruncate,
  coalesce((SELECT array_agg(t.schemaname || '.' || t.tablename ORDER BY 1) FROM pg_publication_tables t WHERE t.pubname = p.pubname), '{}'),
  EXISTS (SELECT 1 FROM pg_publication_rel r WHERE r.prpubid = p.oid AND r.prqual IS NOT NULL)
FROM pg_publication p WHERE p.pubname = $1`, name).Scan(&p.Insert, &p.Update, &p.Delete, &p.Truncate, &p.Tables, &p.Filtered)
	if errors.Is(err, pgx.ErrNoRows) {
		return pubInfo{}, false
	}
	if err != nil {
		t.Fatalf("load publication: %v", err)
	}
	return p, true
}

func TestMigrationsEventsTableAndPublication(t *testing.T) {
	if testing.Short() {
		t.Skip("database test")
	}
	ctx := context.Background()
	pool := storePool(t, newDatabase(t))

	const table, pub = "Event Store.all events", `pgscribe "events"`
	for range 2 {
		if err := migrations.CreateEventsTable(ctx, pool, table); err != nil {
			t.Fatalf("CreateEventsTable: %v", err)
		}
	}
	var pos int64
	var id string
	err := pool.QueryRow(ctx, `INSERT INTO "Event Store"."all events" (stream_id, stream_position, type, data)
VALUES ('s1', 1, 'Opened', '{"n": 1}') RETURNING position, id::text`).Scan(&pos, &id)
	if err != nil || pos != 1 || id == "" {
		t.Fatalf("insert into the events table: position %d id %q err %v", pos, id, err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO "Event Store"."all events" (stream_id, stream_position, type, data)
VALUES ('s1', 1, 'Again', '{}')`); err == nil {
		t.Error("duplicate (stream_id, stream_position) accepted")
	}

	wantTables := []string{"Event Store.all events"}
	want := pubInfo{Insert: true, Tables: wantTables}
	check := func(step string) {
		t.Helper()
		got, ok := loadPub(t, pool, pub)
		if !ok {
			t.Fatalf("%s: publication missing", step)
		}
		if got.Insert != want.Insert || got.Update || got.Delete || got.Truncate || got.Filtered ||
			!slices.Contains(got.Tables, wantTables[0]) {
			t.Errorf("%s: publication = %+v, want inserts only of %v", step, got, wantTables)
		}
	}
	for i := range 2 {
		if err := migrations.EnsurePublication(ctx, pool, pub, table); err != nil {
			t.Fatalf("EnsurePublication #%d: %v", i+1, err)
		}
		check("ensure")
	}

	// Publishing every operation is narrowed back to inserts.
	if _, err := pool.Exec(ctx, `ALTER PUBLICATION "pgscribe ""events""" SET (publish = 'insert, update, delete, truncate')`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.EnsurePublication(ctx, pool, pub, table); err != nil {
		t.Fatal(err)
	}
	check("after publish = all")

	// A publication for another table gets the events table added; the
	// other table stays.
	if _, err := pool.Exec(ctx, `CREATE TABLE other (id int PRIMARY KEY);
CREATE PUBLICATION elsewhere FOR TABLE other WITH (publish = 'insert, update')`); err != nil {
		t.Fatal(err)
	}
	if err := migrations.EnsurePublication(ctx, pool, "elsewhere", table); err != nil {
		t.Fatal(err)
	}
	got, _ := loadPub(t, pool, "elsewhere")
	if !slices.Equal(got.Tables, []string{"Event Store.all events", "public.other"}) || got.Update || !got.Insert {
		t.Errorf("elsewhere = %+v, want inserts of the events table and public.other", got)
	}

	// A row filter would hide events: the table is re-added whole (15+).
	var server int
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&server); err != nil {
		t.Fatal(err)
	}
	if server >= 150000 {
		if _, err := pool.Exec(ctx, `ALTER PUBLICATION "pgscribe ""events""" SET TABLE "Event Store"."all events" WHERE (stream_id <> 'x')`); err != nil {
			t.Fatal(err)
		}
		if p, _ := loadPub(t, pool, pub); !p.Filtered {
			t.Fatal("row filter not set up")
		}
		if err := migrations.EnsurePublication(ctx, pool, pub, table); err != nil {
			t.Fatal(err)
		}
		check("after row filter")
	}

	// Concurrent callers on a fresh publication both succeed.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Go(func() { errs[i] = migrations.EnsurePublication(ctx, pool, "racing", table) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("concurrent EnsurePublication #%d: %v", i, err)
		}
	}

	// Inside a caller's transaction (a savepoint), then rolled back.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrations.EnsurePublication(ctx, tx, "in_tx", table); err != nil {
		t.Fatal(err)
	}
	if _, ok := loadPub(t, tx, "in_tx"); !ok {
		t.Error("publication created in a transaction is not visible in it")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := loadPub(t, pool, "in_tx"); ok {
		t.Error("publication survived the rollback")
	}

	if err := migrations.EnsurePublication(ctx, pool, pub, "no_such_table"); err == nil {
		t.Error("EnsurePublication for a missing table succeeded")
	}
	if err := migrations.CreateEventsTable(ctx, pool, "a.b.c"); err == nil {
		t.Error("CreateEventsTable accepted a three-part name")
	}
}

// deadFixture inserts dead letters spread over projections, versions,
// streams and kinds, in two calls, and returns them in insertion order.
func deadFixture(t *testing.T, q deadletter.Querier, schema string) []deadletter.Row {
	t.Helper()
	at := time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	mk := func(proj string, version int64, pos int64, stream, kind string) deadletter.Row {
		ev := &event.Event{Position: pos, ID: "ev-" + stream + "-" + strconv.FormatInt(pos, 10), StreamID: stream,
			StreamPosition: pos, Type: "Deposited", RawData: []byte(`{"amount": -1, "note": "x"}`),
			RawMetadata: []byte(`{}`), OccurredAt: at}
		return deadletter.FromEvent(proj, version, ev, kind, "failed at "+stream)
	}
	first := []deadletter.Row{
		mk("balances", 1, 1, "acc-1", "rule:withdraw"),
		mk("balances", 1, 2, "acc-2", "commit:23505 (unique_violation)"),
		mk("balances", 1, 3, "acc-1", "rule:withdraw"),
	}
	second := []deadletter.Row{
		mk("balances", 2, 4, "acc-1", "rule:withdraw"),
		mk("ledger", 1, 5, "acc-3", "commit:22P02 (invalid_text_representation)"),
	}
	ctx := context.Background()
	for _, rows := range [][]deadletter.Row{first, second} {
		if err := deadletter.Insert(ctx, q, schema, rows); err != nil {
			t.Fatalf("Insert: %v", err)
		}
	}
	return append(first, second...)
}

func TestDeadLetterInsertList(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	if err := deadletter.Insert(ctx, pool, "pgscribe", nil); err != nil {
		t.Fatalf("Insert(nil): %v", err)
	}
	want := deadFixture(t, pool, "pgscribe")

	all, err := deadletter.List(ctx, pool, "pgscribe", deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != len(want) {
		t.Fatalf("List returned %d rows, want %d", len(all), len(want))
	}
	for i, r := range all {
		w := want[i]
		if i > 0 && r.ID <= all[i-1].ID {
			t.Errorf("row %d: id %d not after %d", i, r.ID, all[i-1].ID)
		}
		if r.Projection != w.Projection || r.Version != w.Version || r.Position != w.Position || r.EventID != w.EventID ||
			r.StreamID != w.StreamID || r.StreamPosition != w.StreamPosition || r.EventType != w.EventType ||
			r.ErrorKind != w.ErrorKind || r.ErrorMessage != w.ErrorMessage || !r.OccurredAt.Equal(w.OccurredAt) ||
			r.DeadLetteredAt.IsZero() {
			t.Errorf("row %d = %+v, want %+v", i, r, w)
		}
		// jsonb normalises the text; compare as the database sees it.
		if string(r.EventData) != `{"note": "x", "amount": -1}` || string(r.EventMetadata) != `{}` {
			t.Errorf("row %d data = %s, metadata = %s", i, r.EventData, r.EventMetadata)
		}
	}

	tests := []struct {
		name    string
		f       deadletter.Filter
		wantPos []int64
	}{
		{"projection", deadletter.Filter{Projection: "balances"}, []int64{1, 2, 3, 4}},
		{"projection version", deadletter.Filter{Projection: "balances", Version: 1}, []int64{1, 2, 3}},
		{"version any projection", deadletter.Filter{Version: 1}, []int64{1, 2, 3, 5}},
		{"stream", deadletter.Filter{StreamID: "acc-1"}, []int64{1, 3, 4}},
		{"kind", deadletter.Filter{ErrorKind: "rule:withdraw"}, []int64{1, 3, 4}},
		{"everything", deadletter.Filter{Projection: "balances", Version: 1, StreamID: "acc-1", ErrorKind: "rule:withdraw"}, []int64{1, 3}},
		{"no match", deadletter.Filter{Projection: "nope"}, nil},
		{"limit", deadletter.Filter{Limit: 2}, []int64{1, 2}},
		{"page after the second", deadletter.Filter{AfterID: all[1].ID, Limit: 2}, []int64{3, 4}},
		{"last page", deadletter.Filter{AfterID: all[3].ID, Limit: 2}, []int64{5}},
		{"past the end", deadletter.Filter{AfterID: all[4].ID}, nil},
		{"page within a filter", deadletter.Filter{StreamID: "acc-1", AfterID: all[0].ID, Limit: 1}, []int64{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows, err := deadletter.List(ctx, pool, "pgscribe", tt.f)
			if err != nil {
				t.Fatal(err)
			}
			var got []int64
			for _, r := range rows {
				got = append(got, r.Position)
			}
			if !slices.Equal(got, tt.wantPos) {
				t.Errorf("positions = %v, want %v", got, tt.wantPos)
			}
		})
	}

	// Paging through everything one row at a time visits each row once.
	var seen []int64
	for f := (deadletter.Filter{Limit: 1}); ; {
		rows, err := deadletter.List(ctx, pool, "pgscribe", f)
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) == 0 {
			break
		}
		seen = append(seen, rows[0].Position)
		f.AfterID = rows[len(rows)-1].ID
	}
	if !slices.Equal(seen, []int64{1, 2, 3, 4, 5}) {
		t.Errorf("paged positions = %v", seen)
	}
}

func TestDeadLetterOddValues(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	ev := &event.Event{Position: 1, ID: "e", StreamID: "s", StreamPosition: 1, Type: "T"} // no JSON, no time
	row := deadletter.FromEvent("p", 1, ev, "rule:\x00r", "bad \xff byte and a NUL \x00 here")
	if err := deadletter.Insert(ctx, pool, "pgscribe", []deadletter.Row{row}); err != nil {
		t.Fatalf("Insert: %v", err)
	}
	rows, err := deadletter.List(ctx, pool, "pgscribe", deadletter.Filter{})
	if err != nil || len(rows) != 1 {
		t.Fatalf("List = %d rows, %v", len(rows), err)
	}
	r := rows[0]
	if r.ErrorKind != "rule:r" || r.ErrorMessage != "bad \uFFFD byte and a NUL  here" ||
		r.EventData != nil || r.EventMetadata != nil || !r.OccurredAt.IsZero() {
		t.Errorf("row = %+v", r)
	}
}

func TestDeadLetterStats(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")

	empty, err := deadletter.GetStats(ctx, pool, "pgscribe", deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if empty.Total != 0 || empty.ByKind != nil || empty.ByProjection != nil || empty.Oldest != nil || empty.Newest != nil {
		t.Errorf("stats of nothing = %+v", empty)
	}

	deadFixture(t, pool, "pgscribe")
	st, err := deadletter.GetStats(ctx, pool, "pgscribe", deadletter.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	wantKinds := []deadletter.KindCount{
		{Kind: "rule:withdraw", Count: 3},
		{Kind: "commit:22P02 (invalid_text_representation)", Count: 1},
		{Kind: "commit:23505 (unique_violation)", Count: 1},
	}
	wantProj := []deadletter.ProjCount{
		{Projection: "balances", Version: 1, Count: 3},
		{Projection: "balances", Version: 2, Count: 1},
		{Projection: "ledger", Version: 1, Count: 1},
	}
	if st.Total != 5 || !slices.Equal(st.ByKind, wantKinds) || !slices.Equal(st.ByProjection, wantProj) {
		t.Errorf("stats = %+v, want total 5, kinds %v, projections %v", st, wantKinds, wantProj)
	}
	if st.Oldest == nil || st.Newest == nil || st.Newest.Before(*st.Oldest) {
		t.Errorf("oldest %v newest %v", st.Oldest, st.Newest)
	}

	st, err = deadletter.GetStats(ctx, pool, "pgscribe", deadletter.Filter{Projection: "balances", StreamID: "acc-1", AfterID: 1 << 40, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	wantProj = []deadletter.ProjCount{{Projection: "balances", Version: 1, Count: 2}, {Projection: "balances", Version: 2, Count: 1}}
	if st.Total != 3 || !slices.Equal(st.ByKind, []deadletter.KindCount{{Kind: "rule:withdraw", Count: 3}}) ||
		!slices.Equal(st.ByProjection, wantProj) {
		t.Errorf("filtered stats = %+v", st)
	}
}

// TestStoreQuotedIdentifiers runs every store against an engine schema whose
// name needs quoting (a space, capitals, a double quote): only correctly
// quoted SQL works at all.
func TestStoreQuotedIdentifiers(t *testing.T) {
	for _, schema := range []string{"Pg Scribe", `we"ird; DROP SCHEMA public`} {
		t.Run(schema, func(t *testing.T) {
			ctx := context.Background()
			pool := storeDB(t, schema)

			var nsp string
			if err := pool.QueryRow(ctx, "SELECT nspname FROM pg_namespace WHERE nspname = $1", schema).Scan(&nsp); err != nil {
				t.Fatalf("schema %q not created as named: %v", schema, err)
			}
			if got := schemaTables(t, pool, schema); !slices.Equal(got, storeTables) {
				t.Errorf("tables = %v, want %v", got, storeTables)
			}
			if v, err := migrations.Current(ctx, pool, schema); err != nil || v != migrations.Latest() {
				t.Errorf("Current = %d, %v", v, err)
			}
			conn := storeConn(t, pool.Config().ConnConfig.ConnString())
			if applied, err := migrations.Apply(ctx, conn, schema); err != nil || len(applied) != 0 {
				t.Errorf("second Apply = %v, %v", applied, err)
			}

			store := cursor.New(schema, "Odd 'Projection'", 1)
			if err := store.Advance(ctx, pool, []cursor.Advance{{StreamID: "s'1", StreamPosition: 1, Position: 1, Applied: 1}}); err != nil {
				t.Fatal(err)
			}
			if m, err := store.Load(ctx, pool, []string{"s'1"}); err != nil || m["s'1"] != (cursor.Cursor{StreamPosition: 1, Position: 1}) {
				t.Errorf("Load = %v, %v", m, err)
			}
			if err := store.SaveWatermark(ctx, pool, cursor.Watermark{LSN: 42, Position: 1}); err != nil {
				t.Fatal(err)
			}
			if err := store.SetPhase(ctx, pool, cursor.PhaseLive, 1, 1); err != nil {
				t.Fatal(err)
			}
			if w, ok, err := store.LoadWatermark(ctx, pool); err != nil || !ok || w.LSN != 42 || w.Phase != cursor.PhaseLive {
				t.Errorf("LoadWatermark = %+v, %v, %v", w, ok, err)
			}
			if tot, err := store.Totals(ctx, pool); err != nil || tot.Applied != 1 {
				t.Errorf("Totals = %+v, %v", tot, err)
			}
			deadFixture(t, pool, schema)
			if rows, err := deadletter.List(ctx, pool, schema, deadletter.Filter{Projection: "balances"}); err != nil || len(rows) != 4 {
				t.Errorf("List = %d rows, %v", len(rows), err)
			}
			if st, err := deadletter.GetStats(ctx, pool, schema, deadletter.Filter{}); err != nil || st.Total != 5 {
				t.Errorf("GetStats = %+v, %v", st, err)
			}
			if err := store.Reset(ctx, pool); err != nil {
				t.Fatal(err)
			}
			if has, err := store.HasCursors(ctx, pool); err != nil || has {
				t.Errorf("HasCursors after Reset = %v, %v", has, err)
			}
			var public bool
			if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'public')").Scan(&public); err != nil || !public {
				t.Errorf("schema public gone: %v", err)
			}
		})
	}
}

// TestLeaseCheckAll: the fence of a group's watermark saves checks every
// member's lease in one statement. It passes while every lease is as
// acquired, fails (fenced, as one lease's check does) when one of them was
// taken over or its row is gone, and holds every lease row for share: a
// takeover of any of them waits for the transaction.
func TestLeaseCheckAll(t *testing.T) {
	ctx := context.Background()
	pool := storeDB(t, "pgscribe")
	dsn := pool.Config().ConnConfig.ConnString()
	var ls []*leader.Lease
	for _, p := range []string{"a", "b", "c"} {
		l, err := leader.TryAcquire(ctx, dsn, "pgscribe", p, 1, "n1", 30*time.Second)
		if err != nil || l == nil {
			t.Fatalf("acquire %s: %v, %v", p, l, err)
		}
		t.Cleanup(func() { l.Release(context.Background()) })
		ls = append(ls, l)
	}
	check := func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		sql, args := leader.CheckAllStatement(ls)
		if _, err := tx.Exec(ctx, sql, args...); err != nil {
			return ls[0].CheckFailed(err)
		}
		return nil
	}
	if err := check(); err != nil {
		t.Fatalf("every lease as acquired: %v", err)
	}

	// Held for share: a takeover's bump of b waits for the open check.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sql, args := leader.CheckAllStatement(ls)
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		t.Fatal(err)
	}
	bumped := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, "UPDATE pgscribe.leases SET epoch = epoch + 1 WHERE projection = 'b' AND version = 1")
		bumped <- err
	}()
	waiting := false
	for deadline := time.Now().Add(10 * time.Second); !waiting && time.Now().Before(deadline); {
		select {
		case err := <-bumped:
			t.Fatalf("the bump of a lease did not wait for the check's transaction (err %v)", err)
		case <-time.After(20 * time.Millisecond):
		}
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE pgscribe.leases%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	if !waiting {
		t.Fatal("the bump of a lease is not waiting on a lock after 10 s")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-bumped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the bump did not go through after the check's transaction ended")
	}
	if err := check(); !errors.Is(err, event.ErrFenced) {
		t.Errorf("b taken over: check = %v, want fenced", err)
	}
	if _, err := pool.Exec(ctx, "UPDATE pgscribe.leases SET epoch = epoch - 1 WHERE projection = 'b' AND version = 1"); err != nil {
		t.Fatal(err)
	}
	if err := check(); err != nil {
		t.Fatalf("b back as acquired: %v", err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM pgscribe.leases WHERE projection = 'c'"); err != nil {
		t.Fatal(err)
	}
	if err := check(); !errors.Is(err, event.ErrFenced) {
		t.Errorf("c's row gone: check = %v, want fenced", err)
	}
}
