package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/migrations"
	"github.com/pgscribe/pgscribe/rules"
)

// scratch is a throwaway schema in the target database holding an engine
// schema of its own (cursors, dead letters …, made by the real migrations)
// and one empty copy of each read-model table a projection writes, created
// LIKE the live table INCLUDING ALL: same types, defaults, NOT NULL, CHECK,
// unique and exclusion constraints and indexes (foreign keys and triggers
// are not copied by LIKE). Builds write there through apply's Committer,
// so they take the engine's own SQL path, dedup and integrity isolation.
type scratch struct {
	schema string
	tables map[string]string // live table name (as rules write it) → scratch table, schema-qualified
}

// scratchTableName is the name of a live table's copy inside the scratch
// schema: a qualified name cannot keep its dot.
func scratchTableName(live string) string { return strings.ReplaceAll(live, ".", "__") }

// newScratch creates the scratch schema named prefix plus a unique suffix,
// with an engine schema and copies of tables. The caller drops it.
//
// conn holds the schema's advisory lock (scratchLockClass, hashtext of the
// name) for as long as it lives: a scratch schema whose lock nobody holds
// was left by a process that died (kill -9, a lost connection) before it
// could drop it, and the next newScratch of the same prefix drops it.
func newScratch(ctx context.Context, conn *pgx.Conn, prefix string, tables []string) (*scratch, error) {
	s := &scratch{schema: fmt.Sprintf("%s_%x", prefix, time.Now().UnixNano()), tables: map[string]string{}}
	// Locked before the schema exists, so that no other process ever sees
	// it unlocked.
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1, hashtext($2))", scratchLockClass, s.schema); err != nil {
		return nil, fmt.Errorf("lock scratch schema: %w", err)
	}
	if err := dropAbandoned(ctx, conn, prefix); err != nil {
		return nil, err
	}
	if _, err := migrations.Apply(ctx, conn, s.schema); err != nil {
		return s, fmt.Errorf("create scratch schema: %w", err)
	}
	// Nothing in a scratch schema outlives it: no WAL for what it holds.
	for _, t := range []string{"cursors", "dead_letters"} {
		if _, err := conn.Exec(ctx, "ALTER TABLE "+pgx.Identifier{s.schema, t}.Sanitize()+" SET UNLOGGED"); err != nil {
			return s, fmt.Errorf("scratch table %s: %w", t, err)
		}
	}
	for _, t := range tables {
		if _, done := s.tables[t]; done {
			continue
		}
		name := s.schema + "." + scratchTableName(t)
		for live, other := range s.tables {
			if other == name {
				return s, fmt.Errorf("tables %s and %s have the same scratch name", live, t)
			}
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE UNLOGGED TABLE %s (LIKE %s INCLUDING ALL)",
			pgx.Identifier{s.schema, scratchTableName(t)}.Sanitize(), event.Table(t).Quoted())); err != nil {
			return s, fmt.Errorf("copy table %s: %w", t, err)
		}
		if err := s.ownSequences(ctx, conn, t); err != nil {
			return s, err
		}
		s.tables[t] = name
	}
	return s, nil
}

// ownSequences gives the copy of t sequences of its own: LIKE copies a
// serial column's DEFAULT nextval('live_seq'), and a build must not
// advance the live table's sequence. (Identity columns already get new
// sequences from INCLUDING ALL.)
func (s *scratch) ownSequences(ctx context.Context, conn *pgx.Conn, t string) error {
	cols, err := queryStrings(ctx, conn, `SELECT a.attname FROM pg_attrdef d
JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
WHERE d.adrelid = $1::regclass AND pg_get_expr(d.adbin, d.adrelid) LIKE 'nextval(%'`, s.ident(t))
	if err != nil {
		return fmt.Errorf("read defaults of %s: %w", t, err)
	}
	for i, c := range cols {
		seq := pgx.Identifier{s.schema, fmt.Sprintf("%s__seq%d", scratchTableName(t), i)}.Sanitize()
		literal := "'" + strings.ReplaceAll(seq, "'", "''") + "'"
		for _, stmt := range []string{"CREATE SEQUENCE " + seq,
			fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s SET DEFAULT nextval(%s::regclass)", s.ident(t), pgx.Identifier{c}.Sanitize(), literal)} {
			if _, err := conn.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("give %s.%s a scratch sequence: %w", t, c, err)
			}
		}
	}
	return nil
}

// scratchLockClass is the first key of a scratch schema's advisory lock:
// "pgsx" (promote and migrations use "pgsc").
const scratchLockClass int32 = 0x70677378

// dropAbandoned drops the scratch schemas of prefix whose advisory lock no
// session holds: their process died before it could drop them.
func dropAbandoned(ctx context.Context, conn *pgx.Conn, prefix string) error {
	names, err := queryStrings(ctx, conn, `SELECT nspname FROM pg_namespace WHERE nspname ~ ('^' || $1 || '_[0-9a-f]+$') ORDER BY 1`, prefix)
	if err != nil {
		return fmt.Errorf("look for abandoned scratch schemas: %w", err)
	}
	for _, n := range names {
		var free bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, hashtext($2))", scratchLockClass, n).Scan(&free); err != nil {
			return fmt.Errorf("lock scratch schema %s: %w", n, err)
		}
		if !free {
			continue // in use
		}
		_, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{n}.Sanitize()+" CASCADE")
		if _, uerr := conn.Exec(ctx, "SELECT pg_advisory_unlock($1, hashtext($2))", scratchLockClass, n); err == nil {
			err = uerr
		}
		if err != nil {
			return fmt.Errorf("drop abandoned scratch schema %s: %w", n, err)
		}
	}
	return nil
}

// withScratch runs fn with a new scratch schema (see newScratch) and
// drops the schema afterwards, whatever fn returned.
func withScratch(ctx context.Context, conn *pgx.Conn, prefix string, tables []string, fn func(*scratch) error) (err error) {
	s, err := newScratch(ctx, conn, prefix, tables)
	if s != nil {
		defer func() {
			if derr := s.drop(conn); err == nil {
				err = derr
			}
		}()
	}
	if err != nil {
		return err
	}
	return fn(s)
}

// ident is the scratch copy of live table t, quoted.
func (s *scratch) ident(t string) string {
	return pgx.Identifier{s.schema, scratchTableName(t)}.Sanitize()
}

// drop removes the scratch schema and everything in it; it runs even when
// ctx was cancelled (Ctrl-C), so nothing is left behind. A cancelled
// query can leave conn closed, or closing a moment later (pgx ends a
// connection whose cancelled query does not stop in time): when conn
// cannot drop the schema, a new connection does.
func (s *scratch) drop(conn *pgx.Conn) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(context.Background()), time.Minute)
	defer cancel()
	var err error
	if !conn.IsClosed() {
		if err = s.dropOn(ctx, conn); err == nil {
			return nil
		}
	}
	c, cerr := pgx.ConnectConfig(ctx, conn.Config())
	if cerr != nil {
		return fmt.Errorf("drop scratch schema %s: %w", s.schema, errors.Join(err, cerr))
	}
	defer c.Close(ctx)
	// The lock goes with the old session; unlocking it here only warns.
	return s.dropOn(ctx, c)
}

func (s *scratch) dropOn(ctx context.Context, conn *pgx.Conn) error {
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{s.schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop scratch schema %s: %w", s.schema, err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1, hashtext($2))", scratchLockClass, s.schema); err != nil {
		return fmt.Errorf("unlock scratch schema %s: %w", s.schema, err)
	}
	return nil
}

// projectionTables lists the tables a projection's data rules write, in
// rule order, each once.
func projectionTables(prog *rules.Program) []string {
	var out []string
	for _, t := range prog.Targets() {
		if !slices.Contains(out, t.Table) {
			out = append(out, t.Table)
		}
	}
	return out
}

// scratchEval evaluates the projection's rules and points every write at
// the scratch copy of its table. seen, if set, is told of every event's
// intents (as the rules wrote them); it may be called again for the same
// event when a batch is retried, and from several partitions at once.
type scratchEval struct {
	prog   *rules.Program
	tables map[string]string
	seen   func(ev *event.Event, intents []event.Intent)
}

func (e *scratchEval) Eval(ev *event.Event) ([]event.Intent, error) {
	intents, err := e.prog.Eval(ev)
	if err != nil || len(intents) == 0 {
		return intents, err
	}
	if e.seen != nil {
		e.seen(ev, intents)
	}
	out := make([]event.Intent, len(intents))
	copy(out, intents)
	for i := range out {
		if out[i].Op == event.OpSQL {
			continue // runs with search_path = the scratch schema (see buildPool)
		}
		t, ok := e.tables[out[i].Table]
		if !ok {
			// Never write a live table from a build.
			return nil, fmt.Errorf("table %s has no scratch copy", out[i].Table)
		}
		out[i].Table = t
	}
	return out, nil
}

// checkSQLRules refuses sql rules that a scratch build cannot confine: it
// runs them with search_path = the scratch schema, so only a qualified
// name ("app.audit", or any "." in the statement, to be safe) could reach
// a live table.
func checkSQLRules(spec rules.Spec) error {
	for _, r := range spec.Rules {
		if r.Op == string(event.OpSQL) && strings.Contains(r.SQL, ".") {
			return fmt.Errorf("projection %s v%d, rule %q: its sql contains a \".\" (a schema-qualified name could write a live table from a scratch build): name its tables unqualified",
				spec.Name, spec.Version, r.Name)
		}
	}
	return nil
}

// noFence is the fence of a scratch build: nothing else writes there.
type noFence struct{}

func (noFence) CheckStatement() (string, []any) { return "SELECT 1", nil }
func (noFence) CheckFailed(err error) error     { return err }

// buildPool connects to the target for a build. Its search_path is the
// scratch schema alone, so an sql rule's unqualified table names resolve
// to scratch copies, never to live tables.
func buildPool(ctx context.Context, url, schema string, conns int) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse target url: %w", err)
	}
	pc.MaxConns = int32(conns)
	pc.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{schema}.Sanitize() + ", pg_catalog"
	// A build's writes are thrown away with the schema: no commit waits
	// for its WAL flush, and no statement is worth compiling.
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pc.ConnConfig.RuntimeParams["jit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to target: %w", err)
	}
	return pool, nil
}

// buildOptions tunes a scratch build.
type buildOptions struct {
	Parallelism int
	BatchSize   int
	QueueSize   int
	Bytes       int64         // bound on the bytes of the events in flight (apply.PartitionOptions.Bytes)
	Retry       apply.Options // MaxAttempts, Backoff, MaxBackoff
	SuspectWait time.Duration
	Progress    func(done int64)
	// ProgressEvery is how often Progress is called (default 5s).
	ProgressEvery time.Duration
}

// build applies the events feed hands it to the scratch schema through
// apply's Committer and partitions, as the engine would, and returns once
// every event is accounted for (committed as applied, skipped or dead
// letter) or the build failed (a halt: structural error, tripped circuit).
// feed calls dispatch for each event, in the order the engine applies them.
func (s *scratch) build(ctx context.Context, pool *pgxpool.Pool, spec rules.Spec, eval apply.Evaluator, o buildOptions,
	feed func(ctx context.Context, dispatch func(*event.Event) error) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// Builds never halt on a dead letter: a fixture or a verify must see
	// what would be dead-lettered (under on_error = "halt", what halts).
	c := apply.NewCommitter(pool, apply.Options{
		Projection: spec.Name, Version: spec.Version, Schema: s.schema,
		MaxAttempts: o.Retry.MaxAttempts, Backoff: o.Retry.Backoff, MaxBackoff: o.Retry.MaxBackoff,
		SuspectWait: o.SuspectWait,
	}, eval, noFence{}, apply.NoObserver{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var done atomic.Int64
	progressed := make(chan struct{}, 1)
	parts := apply.NewPartitions(c, apply.PartitionOptions{
		Count: max(o.Parallelism, 1), QueueSize: max(o.QueueSize, 1),
		BatchSize: func() int { return max(o.BatchSize, 1) },
		Bytes:     o.Bytes,
		Committed: func(batch []apply.Input, _ apply.Result) {
			done.Add(int64(len(batch)))
			select {
			case progressed <- struct{}{}:
			default:
			}
		},
	})
	stop := make(chan struct{})
	runErr := make(chan error, 1)
	go func() { runErr <- parts.Run(ctx, stop) }()

	fed := make(chan int64, 1)
	feedErr := make(chan error, 1)
	go func() {
		var n int64
		err := feed(ctx, func(ev *event.Event) error {
			n++
			return parts.Dispatch(ctx, apply.Input{Event: ev})
		})
		if err != nil {
			feedErr <- err
			return
		}
		fed <- n
	}()
	total := int64(-1)
	every := o.ProgressEvery
	if every <= 0 {
		every = 5 * time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		if total >= 0 && done.Load() >= total {
			close(stop)
			return <-runErr
		}
		select {
		case n := <-fed:
			total = n
		case err := <-feedErr:
			cancel()
			<-runErr
			return err
		case err := <-runErr:
			if err == nil {
				err = ctx.Err()
			}
			if err == nil {
				err = fmt.Errorf("build stopped before every event was applied")
			}
			return err
		case <-progressed:
		case <-tick.C:
			if o.Progress != nil {
				o.Progress(done.Load())
			}
		}
	}
}
