package replication

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/pgscribe/pgscribe/event"
)

// Sink receives the decoded stream and says what may be confirmed.
// Begin, Event and Commit are called from the stream's goroutine in commit
// order; Confirmable and AdvanceIdle may race with the Sink's own workers.
type Sink interface {
	// Begin starts a source transaction and returns its token.
	Begin(commitLSN event.LSN, commitTime time.Time) uint64
	// Event hands over one event of the transaction. It blocks while the
	// pipeline is full; an error (ctx done) means the event was not taken
	// and will be offered again.
	Event(ctx context.Context, token uint64, ev *event.Event) error
	// Commit seals the transaction at its end LSN.
	Commit(token uint64, endLSN event.LSN)
	// Confirmable returns the contiguous watermark.
	Confirmable() event.LSN
	// AdvanceIdle says that the server has sent every transaction up to
	// walEnd (a keepalive's WAL end, between transactions): the watermark
	// may rise to walEnd once everything handed over so far is applied.
	AdvanceIdle(walEnd event.LSN)
}

// A HoldingSink is a Sink that may hold the stream inside Begin for long
// (a group's stream waiting for a member to join). Stream gives it
// keepAlive, to call from within Begin while it waits: it sends the standby
// status when one is due, so that the server's wal_sender_timeout does not
// end the connection meanwhile. Called from the stream's goroutine only.
type HoldingSink interface {
	Sink
	SetKeepAlive(keepAlive func() error)
}

// A ClockSink is a Sink that wants the server's clock: ServerClock is
// called with the send time the server stamps on each keepalive and WAL
// message, so that the sink can read commit times (the server's clock)
// against it rather than against this machine's. Called from the stream's
// goroutine only.
type ClockSink interface {
	Sink
	ServerClock(serverTime time.Time)
}

// StreamOptions tunes the stream.
type StreamOptions struct {
	// StatusInterval is how often a standby status update is sent (each
	// asks the server for a keepalive reply). Default 10s.
	StatusInterval time.Duration
	// StallTimeout: no message for this long is a broken stream. Default 30s.
	StallTimeout time.Duration
	Logger       *slog.Logger
}

// ErrStalled is returned when the server sent nothing within the stall
// timeout.
var ErrStalled = errors.New("replication stream stalled")

// Stream runs START_REPLICATION on conn from the slot's confirmed position
// and feeds sink until ctx ends or the connection fails. On return it has
// sent a final status update with the watermark when it still could.
func Stream(ctx context.Context, conn *pgconn.PgConn, src Source, sink Sink, o StreamOptions) error {
	if o.StatusInterval <= 0 {
		o.StatusInterval = 10 * time.Second
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = 30 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	pub := strings.ReplaceAll(pgx.Identifier{src.Publication}.Sanitize(), "'", "''")
	err := pglogrepl.StartReplication(ctx, conn, src.Slot, 0, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'"},
	})
	if err != nil {
		return fmt.Errorf("start replication on slot %s: %w", src.Slot, err)
	}
	cat := &lazyCatalog{url: src.URL}
	defer cat.close(context.WithoutCancel(ctx))
	s := &streamer{conn: conn, src: src, sink: sink, o: o, relations: map[uint32]*relation{}, lookup: cat}
	s.schema, s.table = src.tableName()
	if hs, ok := sink.(HoldingSink); ok {
		hs.SetKeepAlive(s.keepAlive)
	}
	s.clock, _ = sink.(ClockSink)
	err = s.run(ctx)
	// Best effort: tell the server what is durable before leaving — but
	// never on a connection pgconn is closing: after a read error it closes
	// the socket from a goroutine of its own, and writing then races it.
	if !conn.IsClosed() {
		_ = s.sendStatus()
	}
	return err
}

type relation struct {
	name string         // schema.table, for messages
	ours bool           // the events table or a partition of it
	idx  [numFields]int // column index per field, -1 if absent
	dec  *decoder
}

type streamer struct {
	conn          *pgconn.PgConn
	src           Source
	sink          Sink
	clock         ClockSink // sink, when it wants the server's clock
	o             StreamOptions
	schema, table string
	relations     map[uint32]*relation
	lookup        typeLookup
	received      event.LSN // highest WAL position seen
	keepaliveEnd  event.LSN // WAL end from the last keepalive
	inTxn         bool
	token         uint64
	commitLSN     event.LSN
	commitTime    time.Time
	nextStatus    time.Time
	lastMsg       time.Time
}

func (s *streamer) run(ctx context.Context) error {
	s.lastMsg = time.Now()
	s.nextStatus = time.Now()
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if !time.Now().Before(s.nextStatus) {
			if err := s.sendStatus(); err != nil {
				return err
			}
		}
		rctx, cancel := context.WithDeadline(ctx, s.nextStatus)
		raw, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				if time.Since(s.lastMsg) > s.o.StallTimeout {
					return fmt.Errorf("%w: nothing for %s", ErrStalled, time.Since(s.lastMsg).Round(time.Second))
				}
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("receive: %w", err)
		}
		s.lastMsg = time.Now()
		switch msg := raw.(type) {
		case *pgproto3.CopyData:
			if err := s.handleCopyData(ctx, msg.Data); err != nil {
				return err
			}
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("replication: %w", pgconn.ErrorResponseToPgError(msg))
		case *pgproto3.CopyDone:
			return ErrStreamEnded
		}
	}
}

func (s *streamer) handleCopyData(ctx context.Context, data []byte) error {
	if len(data) == 0 {
		return nil
	}
	switch data[0] {
	case pglogrepl.PrimaryKeepaliveMessageByteID:
		ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data[1:])
		if err != nil {
			return fmt.Errorf("parse keepalive: %w", err)
		}
		if s.clock != nil {
			s.clock.ServerClock(ka.ServerTime)
		}
		end := event.LSN(ka.ServerWALEnd)
		if end > s.received {
			s.received = end
		}
		if !s.inTxn {
			s.keepaliveEnd = end
			// At once, not at the next status update: a wait for an LSN
			// taken on an otherwise idle database ends when the watermark
			// reaches the WAL end, and keepalives are what report it.
			s.sink.AdvanceIdle(end)
		}
		if ka.ReplyRequested {
			return s.sendStatus()
		}
		return nil
	case pglogrepl.XLogDataByteID:
		xld, err := pglogrepl.ParseXLogData(data[1:])
		if err != nil {
			return fmt.Errorf("parse xlogdata: %w", err)
		}
		if l := event.LSN(xld.WALStart); l > s.received {
			s.received = l
		}
		if s.clock != nil {
			s.clock.ServerClock(xld.ServerTime)
		}
		return s.handleLogical(ctx, xld.WALData)
	}
	return nil
}

func (s *streamer) handleLogical(ctx context.Context, data []byte) error {
	msg, err := pglogrepl.Parse(data)
	if err != nil {
		return fmt.Errorf("parse pgoutput message: %w", err)
	}
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		rel, err := s.mapRelation(ctx, m)
		if err != nil {
			return fmt.Errorf("relation %s.%s: %w", m.Namespace, m.RelationName, err)
		}
		s.relations[m.RelationID] = rel
	case *pglogrepl.BeginMessage:
		s.inTxn = true
		s.commitLSN = event.LSN(m.FinalLSN)
		s.commitTime = m.CommitTime
		s.token = s.sink.Begin(s.commitLSN, s.commitTime)
	case *pglogrepl.InsertMessage:
		rel := s.relations[m.RelationID]
		switch {
		case rel == nil:
			return fmt.Errorf("insert into relation %d, which the stream did not describe", m.RelationID)
		case !rel.ours:
			// Dropping it would lose events if it is one (a table the
			// lookup could not place); applying it would invent them.
			return fmt.Errorf("%w: %s is neither %s nor a partition of it, yet publication %s publishes it (publish only the events table; pgscribe check tells)",
				ErrForeignRelation, rel.name, s.src.tableIdent(), s.src.Publication)
		}
		ev, err := s.decode(rel, m.Tuple)
		if err != nil {
			return err
		}
		return s.deliver(ctx, ev)
	case *pglogrepl.CommitMessage:
		s.inTxn = false
		s.sink.Commit(s.token, event.LSN(m.TransactionEndLSN))
		if l := event.LSN(m.TransactionEndLSN); l > s.received {
			s.received = l
		}
	}
	return nil
}

// deliver hands an event to the sink, keeping status updates flowing while
// the sink applies backpressure.
func (s *streamer) deliver(ctx context.Context, ev *event.Event) error {
	for {
		dctx, cancel := context.WithDeadline(ctx, s.nextStatus)
		err := s.sink.Event(dctx, s.token, ev)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := s.sendStatus(); err != nil {
			return err
		}
		// Blocked on our own pipeline is not a stalled server.
		s.lastMsg = time.Now()
	}
}

// keepAlive sends the standby status when one is due, for a sink that
// holds the stream (HoldingSink): held by our own sink is not a stalled
// server either.
func (s *streamer) keepAlive() error {
	if time.Now().Before(s.nextStatus) {
		return nil
	}
	s.lastMsg = time.Now()
	return s.sendStatus()
}

// sendStatus confirms the watermark: flush (what the slot keeps) is only
// ever what the sink says is durably accounted for.
func (s *streamer) sendStatus() error {
	s.nextStatus = time.Now().Add(s.o.StatusInterval)
	if !s.inTxn && s.keepaliveEnd > 0 {
		s.sink.AdvanceIdle(s.keepaliveEnd)
	}
	flush := s.sink.Confirmable()
	write := max(s.received, flush)
	err := pglogrepl.SendStandbyStatusUpdate(context.Background(), s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(write),
		WALFlushPosition: pglogrepl.LSN(flush),
		WALApplyPosition: pglogrepl.LSN(flush),
		ReplyRequested:   true,
	})
	if err != nil {
		return fmt.Errorf("send standby status: %w", err)
	}
	return nil
}

// mapRelation maps a relation the stream announces. The events table is
// recognised by name; any other relation is looked up, and a partition of
// the events table (announced by itself when the publication does not
// publish via the partition root) is read as the table, by column name.
// Anything else is foreign: an insert into it is an error (see
// handleLogical). Column types come from the message, so a table altered
// under a running stream is decoded as the stream's catalog sees it.
func (s *streamer) mapRelation(ctx context.Context, m *pglogrepl.RelationMessage) (*relation, error) {
	r := &relation{name: m.Namespace + "." + m.RelationName}
	for i := range r.idx {
		r.idx[i] = -1
	}
	schema := s.schema
	if schema == "" {
		schema = "public"
	}
	if m.RelationName != s.table || m.Namespace != schema {
		if s.lookup == nil {
			return r, nil
		}
		part, err := s.lookup.partitionOf(ctx, m.RelationID, s.src.tableIdent())
		if err != nil || !part {
			return r, err
		}
	}
	r.ours = true
	var cols [numFields]columnType
	for f, n := range s.src.Columns.names() {
		for ci, col := range m.Columns {
			if n == "" || col.Name != n {
				continue
			}
			r.idx[f] = ci
			cols[f] = columnType{name: n, typ: fmt.Sprintf("oid %d", col.DataType), base: col.DataType}
			if name, ok := builtin(col.DataType); ok {
				cols[f].typ = name
				continue
			}
			if s.lookup == nil {
				continue
			}
			base, shown, err := s.lookup.baseType(ctx, col.DataType)
			if err != nil {
				return nil, err
			}
			cols[f].base, cols[f].typ = base, shown
		}
		if r.idx[f] < 0 && n != "" {
			return nil, fmt.Errorf("%w: %s: column %q (source.columns.%s) is not in the stream's row", ErrUnreadable, r.name, n, fieldKeys[f])
		}
	}
	var err error
	r.dec, err = newDecoder(r.name, cols)
	return r, err
}

// ErrForeignRelation is wrapped by the error of an insert into a relation
// that is neither the events table nor one of its partitions: the
// publication publishes it, and pgscribe will not guess what it is.
var ErrForeignRelation = errors.New("insert into a relation that is not the events table")

func (s *streamer) decode(rel *relation, tup *pglogrepl.TupleData) (*event.Event, error) {
	var vals [numFields][]byte
	for f, i := range rel.idx {
		if i < 0 {
			continue
		}
		if tup == nil || i >= len(tup.Columns) {
			return nil, fmt.Errorf("%w: %s: row lacks column %q", ErrUnreadable, rel.name, s.src.Columns.names()[f])
		}
		switch col := tup.Columns[i]; col.DataType {
		case pglogrepl.TupleDataTypeText:
			vals[f] = col.Data
			if vals[f] == nil {
				vals[f] = []byte{} // an empty text, not NULL
			}
		case pglogrepl.TupleDataTypeNull:
		default:
			return nil, fmt.Errorf("%s: column %q came as %q, not text", rel.name, s.src.Columns.names()[f], col.DataType)
		}
	}
	ev, err := rel.dec.event(&vals)
	if err != nil {
		return nil, err
	}
	ev.CommitLSN, ev.CommitTime = s.commitLSN, s.commitTime
	return ev, nil
}

// lazyCatalog is the stream's typeLookup: a regular connection to the
// source, opened at the first question (most streams never ask one: the
// events table is known by name and its types are built in).
type lazyCatalog struct {
	url  string
	conn *pgx.Conn
}

func (l *lazyCatalog) open(ctx context.Context) (catalog, error) {
	if l.conn == nil || l.conn.IsClosed() {
		conn, err := pgx.Connect(ctx, l.url)
		if err != nil {
			return catalog{}, fmt.Errorf("connect for catalog lookups: %w", err)
		}
		l.conn = conn
	}
	return catalog{l.conn}, nil
}

func (l *lazyCatalog) baseType(ctx context.Context, oid uint32) (uint32, string, error) {
	c, err := l.open(ctx)
	if err != nil {
		return 0, "", err
	}
	return c.baseType(ctx, oid)
}

func (l *lazyCatalog) partitionOf(ctx context.Context, relid uint32, table string) (bool, error) {
	c, err := l.open(ctx)
	if err != nil {
		return false, err
	}
	return c.partitionOf(ctx, relid, table)
}

func (l *lazyCatalog) close(ctx context.Context) {
	if l.conn != nil {
		_ = l.conn.Close(ctx)
	}
}

// Confirm sends a standby status update confirming lsn. Used after the
// stream stopped and the last in-flight batches committed, so a graceful
// stop leaves the slot at exactly what is durable.
func Confirm(ctx context.Context, conn *pgconn.PgConn, lsn event.LSN) error {
	if lsn == 0 || conn.IsClosed() {
		return nil // a closed connection: its slot keeps what was confirmed before
	}
	err := pglogrepl.SendStandbyStatusUpdate(ctx, conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pglogrepl.LSN(lsn),
		WALFlushPosition: pglogrepl.LSN(lsn),
		WALApplyPosition: pglogrepl.LSN(lsn),
	})
	if err != nil {
		return fmt.Errorf("confirm %s: %w", lsn, err)
	}
	return nil
}
