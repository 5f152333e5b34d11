package lag

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// commitTSScanLimit bounds the rows (by position range) the commit
// timestamp query may read in one probe: about 100 ms on this project's
// reference machine. Beyond it the WAL clock answers instead.
const commitTSScanLimit = 100_000

// ProbeConfig names what a Probe reads.
type ProbeConfig struct {
	SourceURL string // events table and replication slot
	TargetURL string // engine schema; may equal SourceURL
	Schema    string // engine schema
	// Projection and Version select the cursors and watermark.
	Projection string
	Version    int64
	Slot       string
	// SlotOf, when set, names the slot at each measurement instead (a
	// version that joins its group moves to the group's slot).
	SlotOf   func() string
	Table    string // events table, may be schema-qualified
	Position string // position column
	// Timeout bounds one measurement; default 30s.
	Timeout time.Duration
	Logger  *slog.Logger
}

// probeState is what measurements of one projection version carry from
// one to the next, across standby and active periods of this process.
type probeState struct {
	mu    sync.Mutex
	clock WALClock
	tail  *sharedTail // set by the first probe
	skew  time.Duration
}

// sharedTail is the count of one events table, shared by the probes of
// every projection over it in this process: the first one counts the whole
// table, the others start from its floor. Its lock is held from query to
// total, so that no probe folds in a count made against an older floor.
type sharedTail struct {
	mu sync.Mutex
	tailCounter
}

// tail returns the shared counter of the events table key names.
func (m *Metrics) tail(key string) *sharedTail {
	m.tailsMu.Lock()
	defer m.tailsMu.Unlock()
	if m.tails == nil {
		m.tails = map[string]*sharedTail{}
	}
	t := m.tails[key]
	if t == nil {
		t = &sharedTail{}
		m.tails[key] = t
	}
	return t
}

// Probe measures a projection version's lag from PostgreSQL. It opens its
// own connections (never a batch's), lazily, and reopens them after an
// error. Tick is meant to be called from one goroutine every lag_interval;
// Close releases the connections.
type Probe struct {
	cfg      ProbeConfig
	view     *Projection
	store    *cursor.Store
	srcQuery string
	tsQuery  string
	sumQuery string
	src, tgt *pgx.Conn
	failing  bool
}

// NewProbe returns a probe that reports into view (the metrics of the
// projection version cfg names).
func NewProbe(cfg ProbeConfig, view *Projection) *Probe {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	table := event.Table(cfg.Table).Quoted()
	pos := pgx.Identifier{cfg.Position}.Sanitize()
	return &Probe{
		cfg:   cfg,
		view:  view,
		store: cursor.New(cfg.Schema, cfg.Projection, cfg.Version),
		// One statement, one snapshot: the WAL position, the slot, the
		// snapshot's xid horizon for the tail counter, and the count of
		// rows above the floor (with those up to the candidate floor).
		// The floors are cast: an integer position column would make
		// them integer parameters, and the first floor is MinInt64.
		srcQuery: `SELECT
  (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END)::text,
  clock_timestamp(),
  current_setting('track_commit_timestamp') = 'on',
  pg_snapshot_xmin(pg_current_snapshot())::text,
  pg_snapshot_xmax(pg_current_snapshot())::text,
  (SELECT max(` + pos + `) FROM ` + table + `),
  t.above, t.upto,
  s.confirmed_flush_lsn::text, s.restart_lsn::text
FROM (SELECT count(*) AS above, count(*) FILTER (WHERE ` + pos + ` <= $3::bigint) AS upto
      FROM ` + table + ` WHERE ` + pos + ` > $2::bigint) AS t
LEFT JOIN pg_replication_slots AS s ON s.slot_name = $1`,
		// Oldest commit among events committed after $2, reading only the
		// tail above a floor below every such event.
		tsQuery: `SELECT min(ts) FROM (SELECT pg_xact_commit_timestamp(xmin) AS ts FROM ` + table +
			` WHERE ` + pos + ` > $1::bigint) AS e WHERE ts > $2`,
		sumQuery: `SELECT coalesce(sum(applied + skipped + dead_lettered + parked), 0)::bigint, max(updated_at) FROM ` +
			pgx.Identifier{cfg.Schema, "cursors"}.Sanitize() + ` WHERE projection = $1 AND version = $2`,
	}
}

// Tick takes one measurement and sets the projection's lag metrics. local
// is nil on a standby. A failed database read is counted
// (pgscribe_lag_probe_errors_total) and logged once until it recovers; the
// metrics are then set from local alone, or left as they were on a standby.
func (p *Probe) Tick(ctx context.Context, local *Local) (Reading, error) {
	st := &p.view.probe
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.tail == nil {
		st.tail = p.view.m.tail(p.cfg.SourceURL + "\x00" + p.cfg.Table + "\x00" + p.cfg.Position)
	}
	mctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	db, err := p.read(mctx, st, local)
	if err != nil {
		p.closeConns(ctx)
		if ctx.Err() != nil {
			return Reading{}, ctx.Err()
		}
		p.view.ProbeFailed()
		if !p.failing {
			// The class tells a lost connection (transient) from a revoked
			// privilege or a dropped table (structural), as at every stage.
			p.cfg.Logger.Warn("lag probe failed; lag metrics come from this node's state until it recovers",
				"stage", "probe", "class", sqlstate.Classify(err).String(), "sqlstate", sqlstate.Code(err), "err", err)
			p.failing = true
		}
		if local == nil {
			return Reading{}, err
		}
		db = DBView{Skew: st.skew}
	} else if p.failing {
		p.cfg.Logger.Info("lag probe recovered")
		p.failing = false
	}
	r := compute(time.Now(), db, local, &st.clock)
	p.view.Report(r)
	return r, err
}

// read runs the probe's queries. When source and target are one database
// they run in one REPEATABLE READ transaction, so that the count of events
// and the sum of the cursors come from the same snapshot and the backlog
// is exact.
func (p *Probe) read(ctx context.Context, st *probeState, local *Local) (DBView, error) {
	if err := p.connect(ctx); err != nil {
		return DBView{}, err
	}
	// Held for the whole read: its snapshot must not be older than the
	// one another projection's probe promoted the shared floor with.
	st.tail.mu.Lock()
	defer st.tail.mu.Unlock()
	var db DBView
	srcQ := pgx.Tx(nil)
	tgtQ := event.Querier(p.tgt)
	same := p.tgt == nil
	if same {
		tx, err := p.src.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			return DBView{}, fmt.Errorf("lag probe: begin: %w", err)
		}
		defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
		srcQ, tgtQ = tx, tx
	}

	// Target first: the snapshot is taken by its first statement.
	wm, haveWM, err := p.store.LoadWatermark(ctx, tgtQ)
	if err != nil {
		return DBView{}, fmt.Errorf("lag probe: %w", err)
	}
	if haveWM {
		db.StoredLSN, db.StoredTime, db.StoredPhase = wm.LSN, wm.CommitTime, wm.Phase
	}
	var last *time.Time
	if err := tgtQ.QueryRow(ctx, p.sumQuery, p.cfg.Projection, p.cfg.Version).Scan(&db.Accounted, &last); err != nil {
		return DBView{}, fmt.Errorf("lag probe: sum cursors: %w", err)
	}
	if last != nil {
		db.LastCommit = *last
	}

	var q interface {
		QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	} = p.src
	if srcQ != nil {
		q = srcQ
	}
	floor, cand := st.tail.query(time.Now().Add(st.skew))
	var (
		wal, xmin, xmax    string
		confirmed, restart *string
		maxPos             *int64
		serverNow          time.Time
		s                  tailSample
	)
	sent := time.Now()
	slot := p.cfg.Slot
	if p.cfg.SlotOf != nil {
		slot = p.cfg.SlotOf()
	}
	err = q.QueryRow(ctx, p.srcQuery, slot, floor, cand).Scan(&wal, &serverNow, &db.CommitTS, &xmin, &xmax,
		&maxPos, &s.above, &s.upToCand, &confirmed, &restart)
	if err != nil {
		return DBView{}, fmt.Errorf("lag probe: read source: %w", err)
	}
	// The server read its clock about half way through the round trip.
	st.skew = serverNow.Sub(sent.Add(time.Since(sent) / 2))
	db.Skew = st.skew
	if db.WAL, err = event.ParseLSN(wal); err != nil {
		return DBView{}, fmt.Errorf("lag probe: %w", err)
	}
	if confirmed != nil && restart != nil {
		db.SlotExists = true
		if db.Confirmed, err = event.ParseLSN(*confirmed); err != nil {
			return DBView{}, fmt.Errorf("lag probe: %w", err)
		}
		if db.Restart, err = event.ParseLSN(*restart); err != nil {
			return DBView{}, fmt.Errorf("lag probe: %w", err)
		}
	}
	s.floor, s.cand, s.at = floor, cand, serverNow
	if s.xmin, err = strconv.ParseUint(xmin, 10, 64); err != nil {
		return DBView{}, fmt.Errorf("lag probe: snapshot xmin: %w", err)
	}
	if s.xmax, err = strconv.ParseUint(xmax, 10, 64); err != nil {
		return DBView{}, fmt.Errorf("lag probe: snapshot xmax: %w", err)
	}
	s.empty = maxPos == nil
	if maxPos != nil {
		s.maxPos = *maxPos
	}
	db.Events = st.tail.total(s)
	db.Counted = true
	st.clock.Observe(db.WAL, serverNow)
	if db.Events < db.Accounted && floor != math.MinInt64 {
		// Rows the floor logic did not expect (deleted events, positions
		// not from a sequence): count the whole table next time.
		st.tail.reset()
	}

	// The oldest unreceived event's commit time, when it is cheap to read.
	threshold := db.StoredTime
	idle := true
	if local != nil {
		threshold, idle = local.WatermarkTime, local.Idle && !local.Backfilling
	}
	if db.CommitTS && idle && db.Events > db.Accounted && !threshold.IsZero() && db.StoredPhase != "backfilling" {
		if f, ok := st.tail.floorFor(threshold); ok && (s.empty || s.maxPos-f <= commitTSScanLimit) {
			var oldest *time.Time
			if err := q.QueryRow(ctx, p.tsQuery, f, threshold).Scan(&oldest); err != nil {
				return DBView{}, fmt.Errorf("lag probe: oldest commit timestamp: %w", err)
			}
			db.OldestRead = true
			if oldest != nil {
				db.OldestUnaccounted = *oldest
			}
		}
	}
	db.Valid = true
	return db, nil
}

func (p *Probe) connect(ctx context.Context) error {
	if p.src != nil {
		return nil
	}
	open := func(url string) (*pgx.Conn, error) {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		cfg.RuntimeParams["application_name"] = "pgscribe lag"
		return pgx.ConnectConfig(ctx, cfg)
	}
	src, err := open(p.cfg.SourceURL)
	if err != nil {
		return fmt.Errorf("lag probe: connect source: %w", err)
	}
	if p.cfg.TargetURL != "" && p.cfg.TargetURL != p.cfg.SourceURL {
		tgt, err := open(p.cfg.TargetURL)
		if err != nil {
			_ = src.Close(ctx)
			return fmt.Errorf("lag probe: connect target: %w", err)
		}
		p.tgt = tgt
	}
	p.src = src
	return nil
}

func (p *Probe) closeConns(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	var errs []error
	if p.src != nil {
		errs = append(errs, p.src.Close(ctx))
		p.src = nil
	}
	if p.tgt != nil {
		errs = append(errs, p.tgt.Close(ctx))
		p.tgt = nil
	}
	_ = errors.Join(errs...)
}

// Close releases the probe's connections. The measurement history stays
// with the projection's metrics view for the next probe.
func (p *Probe) Close(ctx context.Context) { p.closeConns(ctx) }
