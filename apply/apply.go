package apply

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"iter"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// Evaluator turns an event into write intents, decoding the event's JSON
// documents as far as it needs them. A nil slice with a nil error means no
// rule matched (the event is skipped). An error dead-letters the
// event; if it has a Kind() string method that names the dead-letter
// error_kind. rules.Program satisfies it.
type Evaluator interface {
	Eval(ev *event.Event) ([]event.Intent, error)
}

// Fence verifies, inside a batch transaction, that this node still owns the
// projection. It must lock what a takeover changes (the lease row) so that a
// takeover waits for an in-flight batch and a batch after a takeover fails.
type Fence interface {
	// CheckStatement is the check: a statement that locks the lease row
	// for share and fails unless the lease is still ours, so that a failed
	// check stops everything pipelined behind it, the COMMIT included.
	// The batch transaction sends it right after its BEGIN.
	CheckStatement() (sql string, args []any)
	// CheckFailed explains a failure of the check statement: an error
	// wrapping event.ErrFenced when the lease changed or is gone.
	CheckFailed(err error) error
}

// Observer receives what a batch did; the engine wires it to metrics.
// Implementations must be safe for concurrent use.
type Observer interface {
	BatchDone(result string, events int, d time.Duration)
	Outcomes(applied, skipped, deadLettered int)
	DeadLettered(kind string)
	Gap()
	// Isolation counts the segment attempts (savepoint round trips) one
	// isolated pass made to find a batch's offending events.
	Isolation(attempts int)
	// RowsMissing counts n committed updates or deletes of a rule that
	// matched no row.
	RowsMissing(rule string, n int)
	// Retried counts a batch retried after a transient failure, by its
	// SQLSTATE ("" for a connection error).
	Retried(sqlstate string)
}

// Input is one event handed to a partition, with the opaque token of the
// source transaction it belongs to (for the watermark tracker).
type Input struct {
	Event *event.Event
	Token uint64
	// Redrive, when set, makes the input a dead letter to retry (see
	// Redrive), not an event from the source.
	Redrive *Redrive
	held    int64 // what it holds of PartitionOptions.Bytes (Dispatch)
}

// Options configures a Committer.
type Options struct {
	Projection  string
	Version     int64
	Schema      string        // engine schema
	HaltOnError bool          // on_error = "halt"
	Park        bool          // on_error = "park": a dead letter holds its stream's later events (park.go)
	MaxAttempts int           // transient retries per batch before giving up; 0 = forever
	Backoff     time.Duration // first retry delay, doubled up to MaxBackoff
	MaxBackoff  time.Duration
	// CircuitThreshold: this many consecutive events failing with the same
	// integrity SQLSTATE (and nothing succeeding in between) is a schema
	// mismatch, not poison: the projection halts instead of draining the
	// stream into dead letters. Default 20.
	CircuitThreshold int
	// SuspectWait bounds how long a partition waits for more events before
	// it dead-letters the integrity failures of a batch in which nothing
	// applied (see errSuspect). Default 1s.
	SuspectWait time.Duration
}

// HaltError stops a projection: a structural failure, a tripped circuit, or
// a dead-letter-worthy event under on_error = "halt". Nothing of the failing
// batch was committed.
type HaltError struct {
	Reason   string
	SQLState string
	Table    string
	Err      error
}

func (e *HaltError) Error() string {
	s := "halt: " + e.Reason
	if e.SQLState != "" {
		s += " (sqlstate " + e.SQLState + ")"
	}
	if e.Table != "" {
		s += " on table " + e.Table
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *HaltError) Unwrap() error { return e.Err }

// Committer applies batches: one transaction per batch holding the
// read-model writes, the dead letters and the per-stream cursor advances.
// It is safe for concurrent use by several partitions (each call takes its
// own connection from the pool).
type Committer struct {
	pool    *pgxpool.Pool
	opts    Options
	eval    Evaluator
	fence   Fence
	cursors *cursor.Store
	stmts   *statements
	cat     *catalog
	limits  *limits
	obs     Observer
	log     *slog.Logger
}

// NewCommitter builds a Committer.
func NewCommitter(pool *pgxpool.Pool, opts Options, eval Evaluator, fence Fence, obs Observer, log *slog.Logger) *Committer {
	if opts.CircuitThreshold <= 0 {
		opts.CircuitThreshold = 20
	}
	if opts.Backoff <= 0 {
		opts.Backoff = 200 * time.Millisecond
	}
	if opts.MaxBackoff <= 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.SuspectWait <= 0 {
		opts.SuspectWait = time.Second
	}
	return &Committer{
		pool: pool, opts: opts, eval: eval, fence: fence, obs: obs, log: log,
		cursors: cursor.New(opts.Schema, opts.Projection, opts.Version),
		stmts:   newStatements(),
		cat:     newCatalog(),
		limits:  newLimits(),
	}
}

// Result counts what a committed batch did. Duplicates are events at or
// below their stream's cursor: already accounted for by an earlier commit.
type Result struct {
	Applied, Skipped, DeadLettered, Duplicates int
	Parked                                     int // held behind their stream's dead letter
}

// outcome of one event within a batch attempt.
type outcome int

const (
	outDuplicate outcome = iota
	outSkip
	outApply
	outDead
	outPark // held: its stream is parked (on_error = "park")
)

type planned struct {
	ev       *event.Event
	intents  []event.Intent
	out      outcome
	kind     string // dead-letter error_kind
	message  string
	sqlstate string // integrity failure that dead-lettered it
	failure  error  // that failure
}

// applying yields the events of plan whose writes apply, in order.
func applying(plan []planned) iter.Seq[*planned] {
	return func(yield func(*planned) bool) {
		for i := range plan {
			if plan[i].out == outApply && !yield(&plan[i]) {
				return
			}
		}
	}
}

// circuit tracks consecutive same-SQLSTATE integrity failures of one
// partition across batches. Not safe for concurrent use: one per partition.
type circuit struct {
	state string
	count int
}

// partition is what one partition worker carries from batch to batch.
type partition struct {
	circ    circuit
	cursors cursorCache
	suspect bool // the last commit returned errSuspect
}

// errSuspect: an isolated attempt applied none of the batch's events, and
// dead-lettering its integrity failures now could drain a schema mismatch
// into the dead-letter table before the circuit has seen enough failures
// to trip (a live batch is often one or two events long). The attempt was
// rolled back; the partition grows the batch with the events queued behind
// it and commits again, and dead-letters the failures only when no more
// events come (final).
var errSuspect = errors.New("no event of the batch applied: waiting for more events before dead-lettering")

// commit is Commit. Unless final, it returns errSuspect instead of
// committing a batch in which nothing applied and integrity failures would
// be dead-lettered.
func (c *Committer) commit(ctx context.Context, batch []Input, part *partition, final bool) (Result, error) {
	start := time.Now()
	evals := make([]planned, len(batch))
	for i, in := range batch {
		p := &evals[i]
		p.ev = in.Event
		// Events arrive with raw JSON; the evaluator decodes what its rules
		// read, here in the partition workers. Evaluated once: a retried
		// batch reuses the outcome.
		intents, err := c.eval.Eval(in.Event)
		switch {
		case err != nil:
			p.out = outDead
			p.kind, p.message = evalFailure(err)
		case len(intents) == 0:
			p.out = outSkip
		default:
			p.out = outApply
			p.intents = intents
		}
	}

	// A batch grown after errSuspect holds the events that failed: its
	// pipelined attempt would fail again, so it starts isolated.
	isolate := part.suspect
	part.suspect = false
	retry := c.retryPolicy().Start()
	var deadMisses map[string]int // misses that dead-lettered their events
	for {
		res, err := c.attempt(ctx, evals, isolate, final, part)
		if errors.Is(err, errSuspect) {
			part.suspect = true
			return Result{}, err
		}
		if err == nil {
			for rule, n := range deadMisses {
				c.obs.RowsMissing(rule, n)
			}
			c.obs.BatchDone("committed", len(batch), time.Since(start))
			if isolate {
				c.obs.BatchDone("isolated", len(batch), 0)
			}
			return res, nil
		}
		var miss *missingError
		if errors.As(err, &miss) {
			if deadMisses == nil {
				deadMisses = map[string]int{}
			}
			// Dead-letter the events whose writes missed and try the rest
			// again: their other intents must not apply either.
			markMissing(evals, miss.intents)
			for _, in := range miss.intents {
				deadMisses[in.Rule]++
			}
			continue
		}
		var halt *HaltError
		if errors.As(err, &halt) || errors.Is(err, event.ErrFenced) || ctx.Err() != nil {
			if halt != nil {
				c.obs.BatchDone("halted", len(batch), time.Since(start))
			}
			return Result{}, err
		}
		switch sqlstate.Classify(err) {
		case sqlstate.ClassIntegrity:
			if !isolate {
				// Retry the same batch event by event under savepoints to
				// find exactly the offending events.
				isolate = true
				continue // the event-by-event rerun is not a new attempt
			}
			// An integrity error outside any single event (for example a
			// deferred constraint at COMMIT) cannot be pinned on an event.
			c.obs.BatchDone("halted", len(batch), time.Since(start))
			return Result{}, c.halt("integrity failure not attributable to one event", err)
		case sqlstate.ClassTransient:
			c.obs.BatchDone("retried", len(batch), 0)
			c.obs.Retried(sqlstate.Code(err))
			if retry.Exhausted() {
				return Result{}, fmt.Errorf("batch failed after %d attempts: %w", retry.Attempt(), err)
			}
			if err := retry.Wait(ctx, c.log, "transient failure, retrying batch", err); err != nil {
				return Result{}, err
			}
		default:
			c.obs.BatchDone("halted", len(batch), time.Since(start))
			return Result{}, c.halt("structural failure", err)
		}
	}
}

func (c *Committer) halt(reason string, err error) error {
	h := &HaltError{Reason: reason, SQLState: sqlstate.Code(err), Err: err}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.TableName != "" {
		h.Table = pgErr.TableName
		if pgErr.SchemaName != "" {
			h.Table = pgErr.SchemaName + "." + pgErr.TableName
		}
	}
	// PostgreSQL names no table for errors found while planning a
	// statement (42703 undefined column, 42P01 …): name the statement's.
	var se *statementError
	if h.Table == "" && errors.As(err, &se) {
		h.Table = se.table
	}
	return h
}

// statementError names the read-model table of the statement that failed.
type statementError struct {
	table string
	err   error
}

func (e *statementError) Error() string { return fmt.Sprintf("write %s: %v", e.table, e.err) }
func (e *statementError) Unwrap() error { return e.err }

// An attempt is one transaction for a batch, in stages:
//
//   - begin: BEGIN and the fence check, with the reads of the cursors the
//     partition's cache does not hold;
//   - dedupe: events at or below their stream's cursor are duplicates, the
//     others advance it;
//   - decide: the outcome of each remaining event (pre-check, isolation,
//     circuit, park), or errSuspect to wait for more events;
//   - book: count the outcomes and build the bookkeeping (dead letters,
//     held events, cursor advances);
//   - send: the writes, the bookkeeping and COMMIT;
//   - report: once committed, what the batch did, to the Observer.
//
// An attempt works on copies of the batch's outcomes and of the
// partition's circuit: only a committed attempt keeps what it decided (the
// circuit, the cursor cache) and reports it.

// attempt runs one transaction for the batch. In the common case (no
// event to isolate, every stream's cursor in the partition's cache) that is
// one round trip: BEGIN, the fence check, the writes, dead letters, cursor
// advances and COMMIT pipelined together. Cursors to read take a first
// round trip (BEGIN, fence check, reads) before the rest. On error the
// transaction is rolled back and the partition's cursor cache dropped (a
// COMMIT whose answer was lost may have committed).
func (c *Committer) attempt(ctx context.Context, evals []planned, isolate, final bool, part *partition) (res Result, err error) {
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("acquire connection: %w", err)
	}
	defer conn.Release()
	defer func() {
		if err != nil {
			part.cursors.clear()
			// The pool discards a connection left in a transaction, so a
			// rollback that fails or times out loses nothing.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
			_, _ = conn.Exec(rctx, "rollback")
			cancel()
		}
	}()

	curs, misses := cachedCursors(evals, &part.cursors)
	pl, err := c.begin(ctx, conn, curs, misses, isolate)
	if err != nil {
		return Result{}, err
	}
	a := c.dedupe(evals, curs)
	// The circuit is updated on a copy and kept only if this attempt commits,
	// so a retried attempt does not count the same failures twice.
	a.circ = part.circ
	if err := c.decide(ctx, conn, a, &pl.missing, isolate, final); err != nil {
		return Result{}, err
	}
	bk, err := c.book(a)
	if err != nil {
		return Result{}, err
	}
	if err := c.send(ctx, conn, pl, a.plan, bk, isolate); err != nil {
		return Result{}, err
	}
	part.circ = a.circ
	part.cursors.put(a.curs)
	c.report(a, bk, pl.missing)
	return bk.res, nil
}

// rollbackTimeout bounds the ROLLBACK of a failed batch transaction.
const rollbackTimeout = 5 * time.Second

// attemptPlan is what one attempt works out about its batch, stage by
// stage. A failed attempt drops it: none of its decisions leak into the
// next attempt.
type attemptPlan struct {
	plan  []planned                  // a copy of the batch's outcomes
	curs  map[string]cursor.Cursor   // each stream's cursor, moved past the batch
	adv   map[string]*cursor.Advance // each stream's cursor advance
	order []string                   // the streams of adv, in batch order
	gaps  int                        // events past a gap in their stream
	circ  circuit                    // a copy of the partition's circuit
	held  []deadletter.Row           // events held behind their parked stream
}

// cachedCursors returns the cursors of the batch's streams that the
// partition's cache holds, and the streams whose cursors must be read, in
// batch order. A cached cursor is what the partition's own commits wrote:
// valid while the fence check passes (no other node wrote since this one
// took the lease).
func cachedCursors(evals []planned, cache *cursorCache) (curs map[string]cursor.Cursor, misses []string) {
	curs = make(map[string]cursor.Cursor, len(evals))
	missed := make(map[string]struct{})
	for i := range evals {
		id := evals[i].ev.StreamID
		if _, ok := curs[id]; ok {
			continue
		}
		if _, ok := missed[id]; ok {
			continue
		}
		if cur, ok := cache.get(id); ok {
			curs[id] = cur
			continue
		}
		missed[id] = struct{}{}
		misses = append(misses, id)
	}
	return curs, misses
}

// begin queues BEGIN, the fence check and the reads of the cursors of
// misses (into curs, after the fence check). When there are cursors to
// read, or the attempt isolates (its writes take round trips of their
// own), it sends them now: the first round trip. It returns the pipeline
// the rest of the attempt adds to: a new one after a first round trip,
// else the one that holds BEGIN.
func (c *Committer) begin(ctx context.Context, tx dbtx, curs map[string]cursor.Cursor, misses []string, isolate bool) (*pipeline, error) {
	pl := &pipeline{}
	pl.exec("begin", "")
	sql, args := c.fence.CheckStatement()
	pl.add(sql, args, func(br pgx.BatchResults) error {
		if _, err := br.Exec(); err != nil {
			return c.fence.CheckFailed(err)
		}
		return nil
	})
	if !isolate && len(misses) == 0 {
		return pl, nil
	}
	if len(misses) > 0 {
		sql, args := c.cursors.LoadStatement(misses)
		pl.add(sql, args, func(br pgx.BatchResults) error {
			rows, err := br.Query()
			if err != nil {
				return fmt.Errorf("load cursors: %w", err)
			}
			return cursor.ScanInto(rows, curs)
		})
	}
	if err := pl.send(ctx, tx); err != nil {
		return nil, err
	}
	return &pipeline{}, nil
}

// dedupe starts the attempt's plan from a copy of evals: an event at or
// below its stream's cursor is a duplicate; any other moves the cursor
// (in curs) and the stream's advance to its position. An event that
// skips positions of its stream is a gap: logged now, reported to the
// Observer only once the attempt commits.
func (c *Committer) dedupe(evals []planned, curs map[string]cursor.Cursor) *attemptPlan {
	a := &attemptPlan{
		plan:  make([]planned, len(evals)),
		curs:  curs,
		adv:   make(map[string]*cursor.Advance, len(curs)),
		order: make([]string, 0, len(curs)),
	}
	copy(a.plan, evals)
	for i := range a.plan {
		p := &a.plan[i]
		cur, had := curs[p.ev.StreamID]
		if had && p.ev.StreamPosition <= cur.StreamPosition {
			p.out = outDuplicate
			continue
		}
		if (had && p.ev.StreamPosition > cur.StreamPosition+1) || (!had && p.ev.StreamPosition > 1) {
			a.gaps++
			c.log.Warn("stream gap", "projection", c.opts.Projection, "version", c.opts.Version,
				"stream_id", p.ev.StreamID, "cursor", cur.StreamPosition, "stream_position", p.ev.StreamPosition)
		}
		curs[p.ev.StreamID] = cursor.Cursor{StreamPosition: p.ev.StreamPosition, Position: p.ev.Position, Parked: cur.Parked, ParkedSince: cur.ParkedSince}
		adv, ok := a.adv[p.ev.StreamID]
		if !ok {
			adv = &cursor.Advance{StreamID: p.ev.StreamID}
			a.adv[p.ev.StreamID] = adv
			a.order = append(a.order, p.ev.StreamID)
		}
		adv.StreamPosition, adv.Position = p.ev.StreamPosition, p.ev.Position
	}
	return a
}

// decide settles the outcome of each event of the plan: the pre-check,
// the isolated pass when isolating (its writes are applied now, their
// misses added to missing), the circuit (on a.circ) and the park rule. It
// returns errSuspect, unless final, when nothing applied and integrity
// failures would be dead-lettered.
func (c *Committer) decide(ctx context.Context, conn *pgxpool.Conn, a *attemptPlan, missing *missTally, isolate, final bool) error {
	parked := c.parkedStreams(a.curs)
	if err := c.precheck(ctx, conn.Conn().PgConn(), conn, a.plan); err != nil {
		return err
	}
	if isolate {
		if err := c.isolate(ctx, conn, a.plan, a.circ, missing, parked); err != nil {
			return err
		}
	}
	if err := c.walkCircuit(a.plan, &a.circ); err != nil {
		return err
	}
	applied, failed := 0, 0
	for i := range a.plan {
		switch {
		case a.plan[i].out == outApply:
			applied++
		case a.plan[i].out == outDead && a.plan[i].sqlstate != "":
			failed++
		}
	}
	if applied == 0 && failed > 0 && !final && !c.opts.HaltOnError {
		return errSuspect
	}
	a.held = c.parkPlan(a.plan, parked, a.adv, a.curs)
	return nil
}

// bookkeeping is what a batch writes besides its read-model writes, with
// the counts of what it did.
type bookkeeping struct {
	res      Result
	dead     []deadletter.Row // dead letters to insert
	kinds    []string         // their error_kind, in order
	held     []deadletter.Row // events held behind their parked stream
	advances []cursor.Advance // per stream, in batch order
}

// book counts the plan's outcomes, for the batch and in each stream's
// advance, and gathers the batch's bookkeeping. Under on_error = "halt"
// an event to dead-letter halts the projection instead.
func (c *Committer) book(a *attemptPlan) (*bookkeeping, error) {
	// Outcomes are final here: isolation has run, and a pipelined write
	// failure fails the whole attempt.
	bk := &bookkeeping{held: a.held}
	for i := range a.plan {
		p := &a.plan[i]
		adv := a.adv[p.ev.StreamID]
		switch p.out {
		case outDuplicate:
			bk.res.Duplicates++
		case outSkip:
			bk.res.Skipped++
			adv.Skipped++
		case outApply:
			bk.res.Applied++
			adv.Applied++
		case outDead:
			bk.res.DeadLettered++
			adv.DeadLettered++
			bk.dead = append(bk.dead, deadletter.FromEvent(c.opts.Projection, c.opts.Version, p.ev, p.kind, p.message))
			bk.kinds = append(bk.kinds, p.kind)
		case outPark:
			bk.res.Parked++
			adv.Parked++
		}
	}
	if c.opts.HaltOnError && len(bk.dead) > 0 {
		d := bk.dead[0]
		return nil, &HaltError{Reason: fmt.Sprintf("on_error = halt: event %s (stream %s position %d) would be dead-lettered as %s: %s",
			d.EventID, d.StreamID, d.StreamPosition, d.ErrorKind, d.ErrorMessage)}
	}
	bk.advances = make([]cursor.Advance, 0, len(a.order))
	for _, id := range a.order {
		bk.advances = append(bk.advances, *a.adv[id])
	}
	return bk, nil
}

// writeBook writes the bookkeeping of the batch with q: its dead letters,
// held events and cursor advances. In the pipelined path q queues them in
// the same round trip as the writes.
func (c *Committer) writeBook(ctx context.Context, q event.Querier, bk *bookkeeping) error {
	if len(bk.dead) > 0 {
		if err := deadletter.Insert(ctx, q, c.opts.Schema, bk.dead); err != nil {
			return fmt.Errorf("insert dead letters: %w", err)
		}
	}
	if err := deadletter.Park(ctx, q, c.opts.Schema, bk.held); err != nil {
		return err
	}
	if len(bk.advances) > 0 {
		if err := c.cursors.Advance(ctx, q, bk.advances); err != nil {
			return fmt.Errorf("advance cursors: %w", err)
		}
	}
	return nil
}

// send writes the batch and commits it. An isolated attempt applied its
// writes in decide: its bookkeeping and COMMIT follow, one statement at a
// time. Otherwise the writes, the bookkeeping and COMMIT join pl in one
// round trip (applyPipelined).
func (c *Committer) send(ctx context.Context, tx dbtx, pl *pipeline, plan []planned, bk *bookkeeping, isolate bool) error {
	if !isolate {
		return c.applyPipelined(ctx, tx, pl, plan, bk)
	}
	if err := c.writeBook(ctx, tx, bk); err != nil {
		return err
	}
	tag, err := tx.Exec(ctx, "commit")
	return committed(tag, err)
}

// report tells the Observer what a committed attempt did.
func (c *Committer) report(a *attemptPlan, bk *bookkeeping, missing missTally) {
	for rule, n := range missing.counts {
		c.obs.RowsMissing(rule, n)
	}
	for range a.gaps {
		c.obs.Gap()
	}
	c.obs.Outcomes(bk.res.Applied, bk.res.Skipped, bk.res.DeadLettered)
	for _, k := range bk.kinds {
		c.obs.DeadLettered(k)
	}
}

// errCommitRolledBack: COMMIT answered ROLLBACK (the transaction had
// failed). Not expected, since a failed statement stops the batch first.
var errCommitRolledBack = errors.New("commit: the transaction was rolled back")

// committed checks the result of a COMMIT.
func committed(tag pgconn.CommandTag, err error) error {
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if tag.String() != "COMMIT" {
		return errCommitRolledBack
	}
	return nil
}

// dbtx is the batch transaction: a pooled connection inside the
// transaction block that the first round trip began.
type dbtx interface {
	event.Querier
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// applyPipelined adds the batch's writes, its bookkeeping and COMMIT to pl
// and sends it: one round trip. The writes are folded and grouped into
// multi-row statements where that is exact (see planGroups), else one
// statement per intent in order. A failing statement makes PostgreSQL skip
// the rest of the pipeline, the COMMIT included.
func (c *Committer) applyPipelined(ctx context.Context, tx dbtx, pl *pipeline, plan []planned, bk *bookkeeping) error {
	var intents []*event.Intent
	var streams []string
	for p := range applying(plan) {
		for j := range p.intents {
			intents = append(intents, &p.intents[j])
			streams = append(streams, p.ev.StreamID)
		}
	}
	if err := c.queueWrites(ctx, tx, pl, intents, streams, false); err != nil {
		return err
	}
	if err := c.writeBook(ctx, &queuer{pl: pl, table: c.opts.Schema + " engine tables"}, bk); err != nil {
		return err
	}
	if hasDeadLetterIfMissing(intents) {
		// A miss must roll the batch back, so read the writes' results
		// before sending COMMIT: one more round trip, only for batches
		// with if_missing = "dead_letter" rules.
		if err := pl.send(ctx, tx); err != nil {
			return err
		}
		if len(pl.missing.dead) > 0 {
			return &missingError{intents: pl.missing.dead}
		}
		return committed(tx.Exec(ctx, "commit"))
	}
	pl.add("commit", nil, func(br pgx.BatchResults) error {
		return committed(br.Exec())
	})
	return pl.send(ctx, tx)
}

// queueWrites queues intents as multi-row statements where that is exact
// (see planGroups), else one statement per intent in order.
//
// streams is the stream of each intent (for the row locks, rowLocks);
// locked says the caller took the row locks of intents already (the
// isolated pass, for all of its segments).
func (c *Committer) queueWrites(ctx context.Context, tx dbtx, pl *pipeline, intents []*event.Intent, streams []string, locked bool) error {
	if layers, ok := planGroups(intents); ok {
		for _, layer := range layers {
			for _, g := range layer {
				if err := c.queueGroup(ctx, tx, pl, g); err != nil {
					return err
				}
			}
		}
		return nil
	}
	// One statement per intent in event order: partitions whose batches
	// write the same rows (counts that every stream updates) would lock
	// them in different orders and deadlock, each deadlock costing a
	// deadlock_timeout and a retry (campaign seed 101: ten a minute).
	// The batch takes its row locks first, in one order for every batch
	// (rowLocks).
	if !locked {
		lockRows(pl, intents, streams)
	}
	for _, in := range intents {
		if err := c.queueIntent(ctx, tx, pl, in); err != nil {
			return err
		}
	}
	return nil
}

// lockRows queues the statement that takes the row locks of intents
// (rowLocks), if they have any, and says whether it did.
func lockRows(pl *pipeline, intents []*event.Intent, streams []string) bool {
	locks := rowLocks(intents, streams)
	if len(locks) > 0 {
		tables, rows, exclusive := make([]int32, len(locks)), make([]int32, len(locks)), make([]bool, len(locks))
		for i, l := range locks {
			tables[i], rows[i], exclusive[i] = l.table, l.row, l.exclusive
		}
		pl.exec(rowLockSQL, "", tables, rows, exclusive)
	}
	return len(locks) > 0
}

// rowLockSQL takes a transaction-level advisory lock per element of the
// arrays, in their order: exclusive where $3 says so, else shared. The
// two-integer form keeps them apart from the engine's leadership locks
// (the bigint form: leader.Key).
const rowLockSQL = `SELECT count(CASE WHEN x THEN pg_advisory_xact_lock(t, r) ELSE pg_advisory_xact_lock_shared(t, r) END)
FROM unnest($1::int[], $2::int[], $3::bool[]) AS u (t, r, x)`

// rowLockBudget is the most rows a batch locks one by one. PostgreSQL
// keeps every lock in one shared table sized max_locks_per_transaction
// (64) per connection: a lock per row of a backfill batch (5,000 rows,
// four partitions at once) overflowed it, and "out of shared memory"
// (53200) failed the engine's batches and every other session that
// needed a lock meanwhile, the application's included
// (TestRowLocksOfBigBatches).
const rowLockBudget = 32

// rowLock is one advisory lock of a batch: a table's (row 0) or one of
// its rows'.
type rowLock struct {
	table, row int32
	exclusive  bool
}

// rowLocks is the locks a batch takes before it writes, in the order it
// takes them: sorted, so that two batches that share rows wait for each
// other instead of deadlocking. For each table that intents with a key
// address (op = "sql" intents write rows that are not known), a lock on
// the table: shared, with an exclusive lock per row (a hash of table, key
// columns and key values) when the batch writes at most rowLockBudget
// rows; else exclusive, and no row locks. Two batches that write a row
// both lock it, or one of them holds its table exclusively: the second
// waits for the first's commit before it writes anything. Hashes that
// collide only make batches wait for each other too.
//
// streams, when not nil, is the stream of each intent: over the budget,
// the rows that two or more of the batch's streams write are locked (they
// are the rows other partitions write too: counts, shared accounts) and
// the tables shared, unless those rows are over the budget too. Big
// batches (a backfill's or a catch-up's, an isolated pass over one) then
// go on side by side instead of one at a time; a row that only one
// stream of such a batch writes, and another partition's batch too, is
// not locked by it, and the two can still deadlock (then retried). A row
// of a stream's own (keyed by the stream or the event) is only ever
// written by its partition.
func rowLocks(intents []*event.Intent, streams []string) []rowLock {
	tables := map[int32]map[int32]string{} // each row's stream, "" for two or more
	n := 0
	for i, in := range intents {
		if len(in.Key) == 0 || in.Op == event.OpSQL {
			continue
		}
		t := hash31(in.Table)
		r := hash31(in.Table + "\x00" + names(in.Key) + "\x00" + keyValues(in.Key))
		if r == 0 {
			r = 1 // 0 is the table's lock
		}
		stream := ""
		if streams != nil {
			stream = streams[i]
		}
		rows := tables[t]
		if rows == nil {
			rows = map[int32]string{}
			tables[t] = rows
		}
		if s, ok := rows[r]; !ok {
			rows[r] = stream
			n++
		} else if s != stream {
			rows[r] = ""
		}
	}
	if len(tables) == 0 {
		return nil
	}
	shared := func(s string) bool { return true } // which rows to lock
	if n > rowLockBudget && streams != nil {
		n = 0
		for _, rows := range tables {
			for _, s := range rows {
				if s == "" {
					n++
				}
			}
		}
		shared = func(s string) bool { return s == "" }
	}
	big := n > rowLockBudget
	out := make([]rowLock, 0, len(tables)+min(n, rowLockBudget))
	for t, rows := range tables {
		out = append(out, rowLock{table: t, exclusive: big})
		if !big {
			for r, s := range rows {
				if shared(s) {
					out = append(out, rowLock{table: t, row: r, exclusive: true})
				}
			}
		}
	}
	slices.SortFunc(out, func(a, b rowLock) int {
		if a.table != b.table {
			return cmp.Compare(a.table, b.table)
		}
		return cmp.Compare(a.row, b.row)
	})
	return out
}

// hash31 is a non-negative 32-bit hash of s.
func hash31(s string) int32 {
	h := fnv.New32a()
	h.Write([]byte(s))
	return int32(h.Sum32() & 0x7fffffff)
}

// pipeline is statements sent in one round trip, each with how its result
// is read; reading stops at the first failure.
type pipeline struct {
	b       pgx.Batch
	reads   []func(pgx.BatchResults) error
	missing missTally         // updates and deletes that matched no row
	tables  map[string]string // read-model table of each statement that writes one, by SQL
}

// wrote records that sql writes table, for send to name the table of a
// statement the server refused to prepare.
func (p *pipeline) wrote(sql, table string) {
	if table == "" {
		return
	}
	if p.tables == nil {
		p.tables = map[string]string{}
	}
	p.tables[sql] = table
}

func (p *pipeline) add(sql string, args []any, read func(pgx.BatchResults) error) {
	p.b.Queue(sql, args...)
	p.reads = append(p.reads, read)
}

// exec adds a statement whose failure is reported as a write to table
// (none when empty).
func (p *pipeline) exec(sql, table string, args ...any) {
	p.wrote(sql, table)
	p.add(sql, args, func(br pgx.BatchResults) error {
		_, err := br.Exec()
		if err != nil && table != "" {
			return &statementError{table: table, err: err}
		}
		return err
	})
}

func (p *pipeline) send(ctx context.Context, tx dbtx) error {
	br := tx.SendBatch(ctx, &p.b)
	for _, read := range p.reads {
		if err := read(br); err != nil {
			_ = br.Close()
			return p.attribute(err)
		}
	}
	return br.Close()
}

// attribute names the table of the statement that failed when the server
// refused to prepare it (42703 after a column was renamed, …): pgx then
// fails every result of the batch alike, the first one read included, so
// the statement whose result was read is not the one that failed. It
// depends on pgx's statement cache whether the failure comes at prepare
// or at execution (TestFaultRenamedColumn found the first unnamed).
func (p *pipeline) attribute(err error) error {
	var pe pgx.ErrPreprocessingBatch
	if !errors.As(err, &pe) {
		return err
	}
	var se *statementError
	if errors.As(err, &se) {
		err = se.err
	}
	if table := p.tables[pe.SQL()]; table != "" {
		return &statementError{table: table, err: err}
	}
	return err
}

// queuer adds Exec statements to a pipeline instead of running them; the
// pipeline's results report their errors. It supports no reads.
type queuer struct {
	pl    *pipeline
	table string
}

func (q *queuer) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.pl.exec(sql, q.table, args...)
	return pgconn.CommandTag{}, nil
}

var errQueuerRead = errors.New("apply: a queued batch statement cannot read")

func (q *queuer) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errQueuerRead }
func (q *queuer) QueryRow(context.Context, string, ...any) pgx.Row        { return errRow{} }

type errRow struct{}

func (errRow) Scan(...any) error { return errQueuerRead }

// queueGroup queues one multi-row statement.
func (c *Committer) queueGroup(ctx context.Context, tx dbtx, pl *pipeline, g *group) error {
	types, err := c.cat.types(ctx, tx, g.shape.table)
	if err != nil {
		return &statementError{table: g.shape.table, err: err}
	}
	sql, args, err := c.stmts.groupSQL(g, types)
	if err != nil {
		return &HaltError{Reason: "render intent of rule " + g.first.Rule, Err: err}
	}
	if !g.mayMiss {
		pl.exec(sql, g.shape.table, args...)
		return nil
	}
	pl.wrote(sql, g.shape.table)
	pl.add(sql, args, func(br pgx.BatchResults) error {
		if err := pl.missing.read(br, g); err != nil {
			return &statementError{table: g.shape.table, err: err}
		}
		return nil
	})
	return nil
}

// queueIntent queues one intent as its own statement.
func (c *Committer) queueIntent(ctx context.Context, tx dbtx, pl *pipeline, in *event.Intent) error {
	op, _ := in.Op.Spec()
	if op.Kind == event.KindStatement {
		pl.exec(in.SQL, in.Table, in.Args...)
		return nil
	}
	return c.queueGroup(ctx, tx, pl, &group{shape: shapeOf(in), first: in, rows: []*event.Intent{in}, mayMiss: op.MayMiss})
}

// NoObserver is an Observer that records nothing: for commits outside the
// engine (a scratch build, a test) whose batches have no metrics.
type NoObserver struct{}

func (NoObserver) BatchDone(string, int, time.Duration) {}
func (NoObserver) Isolation(int)                        {}
func (NoObserver) Outcomes(int, int, int)               {}
func (NoObserver) DeadLettered(string)                  {}
func (NoObserver) Gap()                                 {}
func (NoObserver) RowsMissing(string, int)              {}
func (NoObserver) Retried(string)                       {}
