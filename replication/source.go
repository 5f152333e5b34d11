package replication

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
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
// order, in pages. It holds one REPEATABLE READ transaction open.
type Snapshot struct {
	conn  *pgx.Conn
	tx    pgx.Tx
	src   Source
	after int64
	query string
	Total int64 // events visible in the snapshot
}

// OpenSnapshot imports the exported snapshot on a regular connection and
// counts the events it sees (the first query that pins the snapshot).
func OpenSnapshot(ctx context.Context, conn *pgx.Conn, src Source, snapshot string) (*Snapshot, error) {
	if !snapshotName.MatchString(snapshot) {
		return nil, fmt.Errorf("unexpected snapshot name %q", snapshot)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, fmt.Errorf("begin snapshot transaction: %w", err)
	}
	s := &Snapshot{conn: conn, tx: tx, src: src, after: -1 << 63}
	if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+snapshot+"'"); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("import snapshot: %w", err)
	}
	if err := tx.QueryRow(ctx, "SELECT count(*) FROM "+src.tableIdent()).Scan(&s.Total); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("count events in snapshot: %w", err)
	}
	c := src.Columns
	id := func(n string) string { return pgx.Identifier{n}.Sanitize() }
	s.query = fmt.Sprintf(`SELECT %s, %s::text, %s, %s, %s, %s::text, %s::text, %s FROM %s WHERE %s > $1 ORDER BY %s LIMIT $2`,
		id(c.Position), id(c.ID), id(c.StreamID), id(c.StreamPosition), id(c.Type), id(c.Data), id(c.Metadata), id(c.OccurredAt),
		src.tableIdent(), id(c.Position), id(c.Position))
	return s, nil
}

// Next returns the next page of at most n events; an empty page means the
// snapshot is exhausted.
func (s *Snapshot) Next(ctx context.Context, n int) ([]*event.Event, error) {
	rows, err := s.tx.Query(ctx, s.query, s.after, n)
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	defer rows.Close()
	var out []*event.Event
	for rows.Next() {
		ev := &event.Event{}
		var data, meta *string
		if err := rows.Scan(&ev.Position, &ev.ID, &ev.StreamID, &ev.StreamPosition, &ev.Type, &data, &meta, &ev.OccurredAt); err != nil {
			return nil, fmt.Errorf("scan event: %w", err)
		}
		if err := decodeDocuments(ev, data, meta); err != nil {
			return nil, err
		}
		out = append(out, ev)
		s.after = ev.Position
	}
	return out, rows.Err()
}

// Close ends the snapshot transaction.
func (s *Snapshot) Close(ctx context.Context) error {
	return s.tx.Rollback(context.WithoutCancel(ctx))
}

// decodeDocuments keeps the raw JSON of data and metadata; the apply
// stage decodes it (event.Event.Decode) in its partition workers.
func decodeDocuments(ev *event.Event, data, meta *string) error {
	if data != nil {
		ev.RawData = []byte(*data)
	}
	if meta != nil {
		ev.RawMetadata = []byte(*meta)
	}
	return nil
}

// parseTimestamptz parses PostgreSQL's ISO text form of timestamptz.
func parseTimestamptz(s string) (time.Time, error) {
	for _, layout := range []string{"2006-01-02 15:04:05.999999999-07", "2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999-07:00:00"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t, nil
		}
	}
	return time.Time{}, fmt.Errorf("parse timestamptz %q", s)
}

func parseInt(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }
