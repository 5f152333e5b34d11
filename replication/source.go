package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/event"
)

// Columns names the events table's physical columns for each event field.
type Columns struct {
	Position, ID, StreamID, StreamPosition, Type, Data, Metadata, OccurredAt string
}

// Source describes the events table and the replication objects.
type Source struct {
	URL         string // source database (a regular DSN; the replication flag is added here)
	Table       string // may be schema-qualified
	Publication string
	Slot        string
	Columns     Columns
}

func (s Source) tableIdent() string { return event.Table(s.Table).Quoted() }

func (s Source) tableName() (schema, name string) {
	if i := strings.LastIndex(s.Table, "."); i >= 0 {
		return s.Table[:i], s.Table[i+1:]
	}
	return "", s.Table
}

// ConnectReplication opens a replication-protocol connection
// (replication=database) to the source with a stable text format for
// timestamps.
func ConnectReplication(ctx context.Context, url string) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse source url: %w", err)
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.RuntimeParams["DateStyle"] = "ISO"
	cfg.RuntimeParams["TimeZone"] = "UTC"
	cfg.RuntimeParams["application_name"] = "pgscribe"
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect for replication: %w", err)
	}
	return conn, nil
}

// SlotInfo is what pg_replication_slots says of a slot.
type SlotInfo struct {
	Exists    bool
	Database  string
	ActivePID int32 // 0 when no walsender holds it
	WALStatus string
	Confirmed event.LSN
}

// Lost reports whether PostgreSQL invalidated the slot (its WAL is gone).
func (s SlotInfo) Lost() bool { return s.Exists && s.WALStatus == "lost" }

// Querier is the part of pgx a slot query needs.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// InspectSlot reads the slot's state over a regular connection.
func InspectSlot(ctx context.Context, q Querier, slot string) (SlotInfo, error) {
	var info SlotInfo
	var confirmed *string
	var walStatus *string
	var pid *int32
	err := q.QueryRow(ctx, `SELECT database, active_pid, wal_status, confirmed_flush_lsn::text
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&info.Database, &pid, &walStatus, &confirmed)
	if errors.Is(err, pgx.ErrNoRows) {
		return SlotInfo{}, nil
	}
	if err != nil {
		return SlotInfo{}, fmt.Errorf("inspect slot %s: %w", slot, err)
	}
	info.Exists = true
	if pid != nil {
		info.ActivePID = *pid
	}
	if walStatus != nil {
		info.WALStatus = *walStatus
	}
	if confirmed != nil {
		if info.Confirmed, err = event.ParseLSN(*confirmed); err != nil {
			return SlotInfo{}, err
		}
	}
	return info, nil
}

// TerminateSlotHolder ends a walsender still attached to the slot (for
// example one left by a node that died), so the slot can be used or dropped
// without waiting for TCP timeouts.
func TerminateSlotHolder(ctx context.Context, q Querier, slot string) error {
	_, err := q.Exec(ctx, `SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots
		WHERE slot_name = $1 AND active_pid IS NOT NULL AND active_pid <> pg_backend_pid()`, slot)
	if err != nil {
		return fmt.Errorf("terminate walsender of slot %s: %w", slot, err)
	}
	// The walsender releases the slot as it exits; wait for that (bounded),
	// so START_REPLICATION does not fail with "slot is active".
	deadline := time.Now().Add(10 * time.Second)
	for {
		var active bool
		err := q.QueryRow(ctx, `SELECT COALESCE(bool_or(active), false) FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&active)
		if err != nil {
			return fmt.Errorf("inspect slot %s: %w", slot, err)
		}
		if !active || time.Now().After(deadline) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// DropSlot drops the slot if it exists, terminating its holder first.
func DropSlot(ctx context.Context, q Querier, slot string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := TerminateSlotHolder(ctx, q, slot); err != nil {
			return err
		}
		_, err := q.Exec(ctx, `SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1`, slot)
		if err == nil {
			return nil
		}
		// 55006 object_in_use: the terminated walsender has not exited yet.
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "55006" || time.Now().After(deadline) {
			return fmt.Errorf("drop slot %s: %w", slot, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// CreateSlot creates the logical slot (pgoutput) on a replication
// connection and exports a snapshot. The snapshot stays importable only
// until conn sends its next command: import it (OpenSnapshot) first.
func CreateSlot(ctx context.Context, conn *pgconn.PgConn, slot string) (consistent event.LSN, snapshot string, err error) {
	res, err := conn.Exec(ctx, fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput EXPORT_SNAPSHOT", slot)).ReadAll()
	if err != nil {
		return 0, "", fmt.Errorf("create slot %s: %w", slot, err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 3 {
		return 0, "", fmt.Errorf("create slot %s: unexpected reply", slot)
	}
	row := res[0].Rows[0]
	consistent, err = event.ParseLSN(string(row[1]))
	if err != nil {
		return 0, "", err
	}
	return consistent, string(row[2]), nil
}

var snapshotName = regexp.MustCompile(`^[0-9A-Fa-f-]+$`)

// Snapshot reads the events visible in an exported snapshot, in position
// order, in pages. It opens a REPEATABLE READ transaction on the snapshot;
// after Release, each page is read in a transaction of its own (see Scout)
// and Seen says where the WAL stood when it was read.
type Snapshot struct {
	conn    *pgx.Conn
	tx      pgx.Tx
	src     Source
	dec     *decoder
	fields  []int // event field of each selected column
	formats pgx.QueryResultFormats
	after   int64
	query   string
	Total   int64 // events visible in the snapshot
	// UpTo is the highest position the snapshot sees: no page reads
	// above it (what commits later with a higher position streams).
	UpTo int64
	// Seen is the WAL insert position read after the last page, once
	// Release has ended the snapshot's transaction: every transaction the
	// page saw committed below it.
	Seen event.LSN
	// rowBytes is the weight of the last page's rows on average (their
	// JSON and rowOverhead), which sizes the next page under a byte bound.
	rowBytes int64
}

// rowOverhead is what a row weighs in a page beside its JSON (as
// apply.Weight counts an event).
const rowOverhead = 1 << 10

// firstPageRows bounds the first page read under a byte bound, before
// the size of the rows is known.
const firstPageRows = 256

// OpenSnapshot imports the exported snapshot on a regular connection and
// counts the events it sees (the first query that pins the snapshot). It
// fails with ErrUnreadable (wrapped) when a mapped column is missing or of
// a type pgscribe cannot read.
func OpenSnapshot(ctx context.Context, conn *pgx.Conn, src Source, snapshot string) (*Snapshot, error) {
	if !snapshotName.MatchString(snapshot) {
		return nil, fmt.Errorf("unexpected snapshot name %q", snapshot)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("begin snapshot transaction: %w", err)
	}
	s := &Snapshot{conn: conn, tx: tx, src: src, after: -1 << 63}
	fail := func(err error) (*Snapshot, error) {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, err
	}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+snapshot+"'"); err != nil {
		return fail(fmt.Errorf("import snapshot: %w", err))
	}
	pos := pgx.Identifier{src.Columns.Position}.Sanitize()
	if err := tx.QueryRow(ctx, "SELECT count(*), coalesce(max("+pos+")::bigint, -9223372036854775808) FROM "+src.tableIdent()).Scan(&s.Total, &s.UpTo); err != nil {
		return fail(fmt.Errorf("count events in snapshot: %w", err))
	}
	// The text the rows are read in is what pgoutput prints on the
	// replication connection (ConnectReplication sets the same).
	if _, err := tx.Exec(ctx, "SET LOCAL DateStyle = 'ISO'; SET LOCAL TimeZone = 'UTC'"); err != nil {
		return fail(fmt.Errorf("set snapshot session: %w", err))
	}
	if err := s.prepare(ctx, catalog{tx}); err != nil {
		return fail(err)
	}
	return s, nil
}

// ResumeSnapshot reads, on a regular connection, the rest of a snapshot an
// interrupted backfill read up to after: the events at most upTo (the
// snapshot's highest position) above after, in pages read as after
// Release, each seeing what committed since (a Scout streaming the slot
// from its consistent point again tells those apart). total is the
// snapshot's count of events, as OpenSnapshot found it.
func ResumeSnapshot(ctx context.Context, conn *pgx.Conn, src Source, upTo, after, total int64) (*Snapshot, error) {
	s := &Snapshot{conn: conn, src: src, after: after, UpTo: upTo, Total: total}
	if _, err := conn.Exec(ctx, "SET DateStyle = 'ISO'; SET TimeZone = 'UTC'"); err != nil {
		return nil, fmt.Errorf("set snapshot session: %w", err)
	}
	if err := s.prepare(ctx, catalog{conn}); err != nil {
		return nil, err
	}
	return s, nil
}

// prepare describes the events table's columns and builds the page query.
func (s *Snapshot) prepare(ctx context.Context, cat catalog) error {
	src := s.src
	pos := pgx.Identifier{src.Columns.Position}.Sanitize()
	var err error
	if s.dec, err = describe(ctx, cat, src); err != nil {
		return err
	}
	var sel []string
	for f, n := range src.Columns.names() {
		if s.dec.kinds[f] == kindAbsent {
			continue
		}
		sel = append(sel, pgx.Identifier{n}.Sanitize())
		s.fields = append(s.fields, f)
		s.formats = append(s.formats, pgx.TextFormatCode)
	}
	// $1 and $3 are cast so that an integer position column compares with
	// the bigint bounds of the page.
	s.query = fmt.Sprintf(`SELECT %s FROM %s WHERE %s > $1::bigint AND %s <= $3::bigint ORDER BY %s LIMIT $2`,
		strings.Join(sel, ", "), src.tableIdent(), pos, pos, pos)
	return nil
}

// Release ends the snapshot's transaction: the pages that follow are read
// in transactions of their own, each seeing what committed since, which a
// Scout tells apart. What needs the snapshot itself (Heads, the commit
// time of its newest events) is read before.
func (s *Snapshot) Release(ctx context.Context) error {
	if s.tx == nil {
		return nil
	}
	err := s.tx.Rollback(context.WithoutCancel(ctx))
	s.tx = nil
	if err != nil {
		return fmt.Errorf("end snapshot transaction: %w", err)
	}
	// The session settings the snapshot's transaction had locally.
	if _, err := s.conn.Exec(ctx, "SET DateStyle = 'ISO'; SET TimeZone = 'UTC'"); err != nil {
		return fmt.Errorf("set snapshot session: %w", err)
	}
	return nil
}

// Next returns the next page of at most n events and, when maxBytes > 0,
// of about maxBytes of JSON at most (at least one event): big events make
// smaller pages. An empty page means the snapshot is exhausted.
func (s *Snapshot) Next(ctx context.Context, n int, maxBytes int64) ([]*event.Event, error) {
	limit := n
	if maxBytes > 0 {
		if s.rowBytes > 0 {
			limit = int(min(int64(n), max(maxBytes/s.rowBytes, 1)))
		} else {
			limit = min(n, firstPageRows)
		}
	}
	var q interface {
		Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	} = s.conn
	if s.tx != nil {
		q = s.tx
	}
	rows, err := q.Query(ctx, s.query, s.formats, s.after, limit, s.UpTo)
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	defer rows.Close()
	var out []*event.Event
	var bytes int64
	for rows.Next() {
		var vals [numFields][]byte
		for i, raw := range rows.RawValues() {
			vals[s.fields[i]] = raw
		}
		ev, err := s.dec.event(&vals)
		if err != nil {
			return nil, fmt.Errorf("read snapshot: %w", err)
		}
		out = append(out, ev)
		s.after = ev.Position
		bytes += int64(len(ev.RawData)+len(ev.RawMetadata)) + rowOverhead
		if maxBytes > 0 && bytes >= maxBytes {
			break // rows bigger than the last page's: the rest is read again
		}
	}
	if len(out) > 0 {
		s.rowBytes = bytes / int64(len(out))
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	if s.tx == nil {
		if s.Seen, err = s.flushedPast(ctx); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// flushedPast returns a WAL position past the commit of every transaction
// the last page saw, and makes sure it is flushed: the scout can only see
// flushed WAL, and a backfill whose own batches keep WAL unflushed would
// otherwise wait for their commits page after page. The position is read
// in a transaction that takes a transaction id, so that its commit (a
// synchronous one) flushes the WAL up to it.
func (s *Snapshot) flushedPast(ctx context.Context) (event.LSN, error) {
	var lsn string
	err := pgx.BeginFunc(ctx, s.conn, func(tx pgx.Tx) error {
		// Flushed here, not on a synchronous standby: a page need not wait
		// for one.
		if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = local"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, pg_current_xact_id()::text").Scan(&lsn, new(string))
	})
	if err != nil {
		return 0, fmt.Errorf("read snapshot: WAL position: %w", err)
	}
	return event.ParseLSN(lsn)
}

// Head is where one stream stands at a position (see Heads).
type Head struct {
	StreamID                 string
	StreamPosition, Position int64 // its last event at or below the position
	Events                   int64 // its events at or below the position
}

// Heads calls fn with every stream that has events at or below upTo in the
// snapshot, in pages of at most page streams. It reads the whole table
// below upTo in one aggregate; call it before Next, which it does not move.
// The last event of a stream is the one with the highest stream_position:
// positions are not commit-ordered across streams, but within a stream
// they grow with stream_position.
func (s *Snapshot) Heads(ctx context.Context, upTo int64, page int, fn func([]Head) error) error {
	c := s.src.Columns
	id := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	rows, err := s.tx.Query(ctx, fmt.Sprintf(`SELECT %s::text, max(%s)::bigint, max(%s)::bigint, count(*)
FROM %s WHERE %s <= $1 GROUP BY 1`, id(c.StreamID), id(c.StreamPosition), id(c.Position), s.src.tableIdent(), id(c.Position)), upTo)
	if err != nil {
		return fmt.Errorf("read stream heads: %w", err)
	}
	defer rows.Close()
	heads := make([]Head, 0, page)
	for rows.Next() {
		var h Head
		if err := rows.Scan(&h.StreamID, &h.StreamPosition, &h.Position, &h.Events); err != nil {
			return fmt.Errorf("read stream heads: %w", err)
		}
		if heads = append(heads, h); len(heads) == page {
			if err := fn(heads); err != nil {
				return err
			}
			heads = heads[:0]
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read stream heads: %w", err)
	}
	if len(heads) > 0 {
		return fn(heads)
	}
	return nil
}

// Close ends the snapshot transaction if Release did not.
func (s *Snapshot) Close(ctx context.Context) error {
	if s.tx == nil {
		return nil
	}
	return s.tx.Rollback(context.WithoutCancel(ctx))
}

// CheckTable reads the events table's mapped columns from the catalog and
// fails with ErrUnreadable (wrapped, naming each column and its type) when
// one is missing or of a type pgscribe cannot read, so that `run` refuses
// such a table at start rather than at its first event. A table that does
// not exist is an error that does not wrap ErrUnreadable.
func CheckTable(ctx context.Context, q Querier, src Source) error {
	_, err := describe(ctx, catalog{q}, src)
	return err
}

// describe builds the decoder of the table's mapped columns from the
// catalog.
func describe(ctx context.Context, c catalog, src Source) (*decoder, error) {
	var relid uint32
	err := c.q.QueryRow(ctx, "SELECT c.oid FROM pg_class c WHERE c.oid = to_regclass($1)", src.tableIdent()).Scan(&relid)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("events table %s does not exist", src.tableIdent())
	}
	if err != nil {
		return nil, fmt.Errorf("look up events table %s: %w", src.tableIdent(), err)
	}
	var cols [numFields]columnType
	var missing []error
	for f, n := range src.Columns.names() {
		if n == "" {
			continue
		}
		var typ uint32
		err := c.q.QueryRow(ctx, `SELECT a.atttypid, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped`, relid, n).Scan(&typ, &cols[f].typ)
		if errors.Is(err, pgx.ErrNoRows) {
			missing = append(missing, fmt.Errorf("column %q (source.columns.%s) does not exist", n, fieldKeys[f]))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("look up column %q of %s: %w", n, src.tableIdent(), err)
		}
		cols[f].name = n
		if cols[f].base, _, err = c.baseType(ctx, typ); err != nil {
			return nil, err
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s: %w", ErrUnreadable, src.tableIdent(), errors.Join(missing...))
	}
	return newDecoder(src.tableIdent(), cols)
}

// catalog answers typeLookup from the catalog over a regular connection.
type catalog struct{ q Querier }

func (c catalog) baseType(ctx context.Context, oid uint32) (uint32, string, error) {
	shown := ""
	for depth := 0; ; depth++ {
		var typtype string
		var next uint32
		var name string
		err := c.q.QueryRow(ctx, "SELECT typtype::text, typbasetype, format_type(oid, NULL) FROM pg_type WHERE oid = $1", oid).Scan(&typtype, &next, &name)
		if err != nil {
			return 0, "", fmt.Errorf("look up type %d: %w", oid, err)
		}
		if shown == "" {
			shown = name
		}
		if typtype != "d" || depth > 32 {
			return oid, shown, nil
		}
		oid = next
	}
}

func (c catalog) partitionOf(ctx context.Context, relid uint32, table string) (bool, error) {
	var ok bool
	err := c.q.QueryRow(ctx, "SELECT coalesce(pg_partition_root($1::oid::regclass) = to_regclass($2), false)", relid, table).Scan(&ok)
	if err != nil {
		return false, fmt.Errorf("look up relation %d: %w", relid, err)
	}
	return ok, nil
}

// CreateSlotAt creates the logical slot (pgoutput) on a replication
// connection without a snapshot and returns its consistent point: it
// streams every transaction that commits after it.
func CreateSlotAt(ctx context.Context, conn *pgconn.PgConn, slot string) (event.LSN, error) {
	res, err := conn.Exec(ctx, fmt.Sprintf("CREATE_REPLICATION_SLOT %s LOGICAL pgoutput NOEXPORT_SNAPSHOT", slot)).ReadAll()
	if err != nil {
		return 0, fmt.Errorf("create slot %s: %w", slot, err)
	}
	if len(res) != 1 || len(res[0].Rows) != 1 || len(res[0].Rows[0]) < 2 {
		return 0, fmt.Errorf("create slot %s: unexpected reply", slot)
	}
	return event.ParseLSN(string(res[0].Rows[0][1]))
}

// CopySlot creates slot dst as a copy of the logical slot src: it keeps
// the same WAL and streams from src's confirmed position, whatever src
// does after. It returns that position.
func CopySlot(ctx context.Context, q Querier, src, dst string) (event.LSN, error) {
	var lsn string
	err := q.QueryRow(ctx, `SELECT c.lsn::text FROM pg_copy_logical_replication_slot($1, $2) AS c`, src, dst).Scan(&lsn)
	if err != nil {
		return 0, fmt.Errorf("copy slot %s to %s: %w", src, dst, err)
	}
	info, err := InspectSlot(ctx, q, dst)
	if err != nil {
		return 0, err
	}
	return info.Confirmed, nil
}
