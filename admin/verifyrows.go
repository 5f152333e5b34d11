package admin

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math/bits"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/rules"
)

// A full verify must know which rows several streams write
// non-commutatively (verifyshared.go), but the rows of a read model can be
// many more than verify can hold in memory (a ledger row per event). So the
// rebuild only streams, per write, four numbers into an unlogged scratch
// table — the table, a hash of the row key, a hash of the stream, whether
// the write commutes — and one GROUP BY in PostgreSQL finds the row hashes
// written by several streams with a write that does not commute. Only the
// streams that write those rows are then evaluated a second time (rules
// only, no writes), recording in memory the exact rows whose hash is among
// them: memory holds the shared rows, never every row. A key hash can
// only merge rows, never split one, so a shared row is never missed; a
// collision only costs a row more in the second pass, where rows are told
// apart by their exact key. (Two streams whose 64-bit hashes collide
// would pass for one; the odds are about streams² in 2^65.)

// rowSeed hashes row keys and stream ids within one verify process.
var rowSeed = maphash.MakeSeed()

// rowHash is the hash of a row key's values: equal for every key whose
// JSON text (what the second pass tells rows apart by) is equal.
func rowHash(vals []any) uint64 {
	var h maphash.Hash
	h.SetSeed(rowSeed)
	var n [8]byte
	for _, v := range vals {
		if s, ok := v.(string); ok {
			h.WriteByte('s')
			binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
			_, _ = h.Write(n[:])
			_, _ = h.WriteString(s)
			continue
		}
		b, _ := json.Marshal(v)
		h.WriteByte('j')
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		_, _ = h.Write(n[:])
		_, _ = h.Write(b)
	}
	return h.Sum64()
}

func streamHash(id string) uint64 { return maphash.String(rowSeed, id) }

// rowRec is one write of a rebuild: table (index in the verify's tables),
// row key hash, stream hash, and whether the write does not commute.
type rowRec struct {
	table   int16
	key     uint64
	stream  uint64
	nonComm bool
}

// recentBits gives the number of slots (1 << recentBits) of rowLog's cache of records already
// sent: a stream's repeated writes to its own rows (a balance updated by
// every event) are sent once while they stay in the cache.
const recentBits = 16

// rowLog copies the records of a rebuild into the scratch table
// pgscribe_rows through COPY on its own connection, through a bounded
// channel: the rebuild waits for the copy rather than the records pile up
// in memory. Safe for concurrent use by the partitions.
type rowLog struct {
	ch     chan []rowRec
	done   chan struct{} // closed when the copy returned
	err    error         // the copy's error, after done
	recent [1 << recentBits]atomic.Uint64
	rows   atomic.Int64
}

func rowsTable(s *scratch) string { return pgx.Identifier{s.schema, "pgscribe_rows"}.Sanitize() }

// startRowLog creates the scratch table and starts copying into it on
// conn, which nothing else may use until close returned.
func startRowLog(ctx context.Context, conn *pgx.Conn, s *scratch) (*rowLog, error) {
	if _, err := conn.Exec(ctx, "CREATE UNLOGGED TABLE "+rowsTable(s)+" (t smallint NOT NULL, k bigint NOT NULL, s bigint NOT NULL, nc boolean NOT NULL)"); err != nil {
		return nil, fmt.Errorf("create row log: %w", err)
	}
	l := &rowLog{ch: make(chan []rowRec, 64), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		_, err := conn.CopyFrom(ctx, pgx.Identifier{s.schema, "pgscribe_rows"}, []string{"t", "k", "s", "nc"}, &rowSource{ch: l.ch})
		if err != nil {
			l.err = fmt.Errorf("copy row log: %w", err)
			// Let senders finish: nothing reads the channel any more.
			go func() {
				for range l.ch {
				}
			}()
		}
	}()
	return l, nil
}

// add sends the records of one event's intents, except those the cache
// says were sent already.
func (l *rowLog) add(recs []rowRec) {
	out := recs[:0]
	for _, r := range recs {
		h := r.key ^ bits.RotateLeft64(r.stream*0x9e3779b97f4a7c15, 31) ^ (uint64(r.table)+1)*0xc2b2ae3d27d4eb4f
		if r.nonComm {
			h = ^h
		}
		// The slot from all of h's bits (Fibonacci hashing).
		slot := &l.recent[(h*0x9e3779b97f4a7c15)>>(64-recentBits)]
		if slot.Load() == h {
			continue
		}
		slot.Store(h)
		out = append(out, r)
	}
	if len(out) == 0 {
		return
	}
	l.rows.Add(int64(len(out)))
	select {
	case l.ch <- out:
	case <-l.done: // the copy failed: close reports it
	}
}

// close ends the copy and returns its error.
func (l *rowLog) close() error {
	close(l.ch)
	<-l.done
	return l.err
}

// rowSource feeds CopyFrom from the channel, a slice at a time.
type rowSource struct {
	ch  chan []rowRec
	cur []rowRec
	row rowRec
}

func (r *rowSource) Next() bool {
	for len(r.cur) == 0 {
		recs, ok := <-r.ch
		if !ok {
			return false
		}
		r.cur = recs
	}
	r.row, r.cur = r.cur[0], r.cur[1:]
	return true
}

func (r *rowSource) Values() ([]any, error) {
	return []any{r.row.table, int64(r.row.key), int64(r.row.stream), r.row.nonComm}, nil
}

func (r *rowSource) Err() error { return nil }

// sharedRows returns, per table index, the row hashes that several
// streams write with at least one write that does not commute, and the
// hashes of the streams that write them.
func sharedRows(ctx context.Context, conn *pgx.Conn, s *scratch) (map[int16]map[uint64]bool, map[uint64]bool, error) {
	rows, err := conn.Query(ctx, fmt.Sprintf(`WITH shared AS (
  SELECT t, k FROM %[1]s GROUP BY t, k HAVING min(s) <> max(s) AND bool_or(nc))
SELECT DISTINCT r.t, r.k, r.s FROM %[1]s r JOIN shared USING (t, k)`, rowsTable(s)))
	if err != nil {
		return nil, nil, fmt.Errorf("find shared rows: %w", err)
	}
	keys := map[int16]map[uint64]bool{}
	streams := map[uint64]bool{}
	var t int16
	var k, st int64
	if _, err := pgx.ForEachRow(rows, []any{&t, &k, &st}, func() error {
		if keys[t] == nil {
			keys[t] = map[uint64]bool{}
		}
		keys[t][uint64(k)] = true
		streams[uint64(st)] = true
		return nil
	}); err != nil {
		return nil, nil, fmt.Errorf("find shared rows: %w", err)
	}
	return keys, streams, nil
}

// sharedPass finds the rows several streams write non-commutatively from
// the row log of a full rebuild, and returns writers holding exactly those
// rows, recorded by evaluating again (rules only) the events of the
// streams that write them. Without such rows it evaluates nothing.
func sharedPass(ctx context.Context, conn, src *pgx.Conn, cfg *config.Config, s *scratch, prog *rules.Program, tables []string,
	first *writers, cursors map[string]int64, logf func(string, ...any)) (*writers, error) {
	started := time.Now()
	byIndex, streamHashes, err := sharedRows(ctx, conn, s)
	if err != nil {
		return nil, err
	}
	pass := newWriters(first.keys)
	pass.cols, pass.dead, pass.untracked = first.cols, first.dead, first.untracked
	if len(byIndex) == 0 {
		logf("shared rows: none of %d row writes is to a row another stream writes non-commutatively (%s)",
			first.log.rows.Load(), time.Since(started).Round(time.Millisecond))
		return pass, nil
	}
	pass.onlyHash = map[string]map[uint64]bool{}
	n := 0
	for i, hashes := range byIndex {
		pass.onlyHash[tables[i]] = hashes
		n += len(hashes)
	}
	var streams []string
	for id := range cursors {
		if streamHashes[streamHash(id)] {
			streams = append(streams, id)
		}
	}
	if len(streams) == len(cursors) {
		streams = nil // every stream: no list to send
	}
	sort.Strings(streams)
	var events int64
	err = readEvents(ctx, src, cfg.Source, cursors, streams, func(ev *event.Event) error {
		events++
		intents, err := prog.Eval(ev)
		if err == nil && len(intents) > 0 {
			pass.see(ev, intents)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	logf("shared rows: %d row keys written by several streams, %d events of %d streams evaluated again for them (%s)",
		n, events, len(streamHashes), time.Since(started).Round(time.Millisecond))
	return pass, nil
}

// analyze gives the planner statistics of the scratch copies (the live
// snapshots and the rebuilt tables): without, it guesses their sizes, and
// a guess of millions of rows makes it JIT-compile the diff.
func analyze(ctx context.Context, conn *pgx.Conn, s *scratch, tables []string) error {
	for _, t := range tables {
		for _, id := range []string{s.liveIdent(t), s.ident(t)} {
			if _, err := conn.Exec(ctx, "ANALYZE "+id); err != nil {
				return fmt.Errorf("analyze %s: %w", id, err)
			}
		}
	}
	return nil
}

// rebuildProgress is the rebuild's progress line: events rebuilt of
// those the live cursors account for, the rate and what remains.
func rebuildProgress(done, total int64, elapsed time.Duration) string {
	rate := float64(done) / max(elapsed.Seconds(), 1e-9)
	pct := 100.0
	if total > 0 {
		pct = min(100, 100*float64(done)/float64(total))
	}
	eta := "?"
	if rate > 0 && total >= done {
		eta = (time.Duration(float64(total-done)/rate) * time.Second).Round(time.Second).String()
	}
	return fmt.Sprintf("rebuilding: %d of %d events (%.1f%%), %.0f events/s, eta %s", done, total, pct, rate, eta)
}

// perStreamTables returns the tables of a projection no two streams can
// write a row of, from the rules alone: those where one column of the key
// verify identifies rows by (keys) takes, in every rule that writes the
// table, the event's id (unique per event) or its stream id. Their rows
// need no tracking (a ledger row per event is the common case), so a full
// verify logs none of their writes. The value is the column and what it
// holds, for the progress line.
func perStreamTables(spec rules.Spec, keys map[string][]string) map[string]string {
	out := map[string]string{}
	for t, key := range keys {
		if key == nil {
			continue
		}
		for _, c := range key {
			expr, ok := "", true
			for _, r := range spec.Rules {
				if r.Table != t || r.Op == string(event.OpSQL) {
					continue
				}
				e, found := r.Key[c]
				if !found {
					e, found = r.Set[c]
				}
				e = strings.TrimSpace(e)
				if !found || (e != "id" && e != "stream_id") || (expr != "" && e != expr) {
					ok = false
					break
				}
				expr = e
			}
			if ok && expr != "" {
				out[t] = fmt.Sprintf("its key column %s is the %s in every rule that writes it", c, map[string]string{"id": "event id", "stream_id": "stream id"}[expr])
				break
			}
		}
	}
	return out
}
