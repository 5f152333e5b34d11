package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/leader"
)

// saver commits the watermark saves of a group's members together: each
// member's ledger saves its own row, fenced by its own lease, and eight
// members each saving every publishGap made as many small transactions as
// their batches did at 1k events/s (bench W7), and then about 36% of the
// engine's statements: a fence check, a SET and an upsert per save. So the
// saver commits at most once per publishGap, with every save waiting then,
// in five statements whatever the number of members: BEGIN, one fence
// check of every member's lease (leader.CheckAllStatement), SET LOCAL
// synchronous_commit, one upsert of every member's row
// (cursor.SaveWatermarksStatement), COMMIT. When that fails (a member
// was fenced), each save is retried alone with its own lease's check, so
// one member's lost lease never fails another's save. A member's save
// waits up to publishGap for the next commit, which then paces its saves
// as publishGap does a projection's own (ledger.publish).
type saver struct {
	url  string
	idle string // idle_in_transaction_session_timeout (ms): as the members' pools, never holding a lease row past the lease
	log  *slog.Logger
	reqs chan *saveReq

	mu   sync.Mutex
	pool *pgxpool.Pool
}

type saveReq struct {
	lease *leader.Lease
	store *cursor.Store
	w     cursor.Watermark
	done  chan error
}

func newSaver(url string, leaseTimeout time.Duration, log *slog.Logger) *saver {
	return &saver{url: url, idle: fmt.Sprint(leaseTimeout.Milliseconds()), log: log, reqs: make(chan *saveReq, 64)}
}

// save commits the watermark w of store's version fenced by lease, with the
// other members' saves that are waiting, and returns when they committed
// or failed.
func (sv *saver) save(ctx context.Context, lease *leader.Lease, store *cursor.Store, w cursor.Watermark) error {
	r := &saveReq{lease: lease, store: store, w: w, done: make(chan error, 1)}
	select {
	case sv.reqs <- r:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run serves saves until ctx ends.
func (sv *saver) run(ctx context.Context) {
	defer func() {
		sv.mu.Lock()
		if sv.pool != nil {
			sv.pool.Close()
			sv.pool = nil // a later run opens its own
		}
		sv.mu.Unlock()
	}()
	var batch []*saveReq
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-sv.reqs:
			batch = append(batch, r)
		}
	more:
		for {
			select {
			case r := <-sv.reqs:
				batch = append(batch, r)
			default:
				break more
			}
		}
		began := time.Now()
		err := sv.commit(ctx, batch)
		if err != nil && len(batch) > 1 {
			for _, r := range batch {
				r.done <- sv.commit(ctx, []*saveReq{r})
			}
			continue
		}
		for _, r := range batch {
			r.done <- err
		}
		// Paced: the saves that come meanwhile wait for the next commit.
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(began.Add(publishGap))):
		}
	}
}

func (sv *saver) conn(ctx context.Context) (*pgxpool.Pool, error) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.pool != nil {
		return sv.pool, nil
	}
	cfg, err := pgxpool.ParseConfig(sv.url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "pgscribe"
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = sv.idle
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	sv.pool = p
	return p, nil
}

// commit runs the saves of batch in one transaction, in one round trip:
// a save alone as the ledger's own save runs it, several in one statement
// each for the fence and the rows. Asynchronous commit, as the ledger's.
func (sv *saver) commit(ctx context.Context, batch []*saveReq) error {
	var b pgx.Batch
	b.Queue("begin")
	checkAt := 1
	var lease *leader.Lease // the one to explain a failed check by
	if len(batch) == 1 {
		r := batch[0]
		lease = r.lease
		check, args := r.lease.CheckStatement()
		b.Queue(check, args...)
		sql, args, err := r.store.SaveWatermarkStatement(r.w)
		if err != nil {
			return err
		}
		b.Queue("SET LOCAL synchronous_commit = off")
		b.Queue(sql, args...)
	} else {
		leases := make([]*leader.Lease, len(batch))
		stores := make([]*cursor.Store, len(batch))
		ws := make([]cursor.Watermark, len(batch))
		for i, r := range batch {
			leases[i], stores[i], ws[i] = r.lease, r.store, r.w
		}
		lease = leases[0]
		check, args := leader.CheckAllStatement(leases)
		b.Queue(check, args...)
		sql, args, err := cursor.SaveWatermarksStatement(stores, ws)
		if err != nil {
			return err
		}
		b.Queue("SET LOCAL synchronous_commit = off")
		b.Queue(sql, args...)
	}
	b.Queue("commit")

	pool, err := sv.conn(ctx)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	n := b.Len()
	br := conn.SendBatch(ctx, &b)
	for i := 0; i < n && err == nil; i++ {
		if _, err = br.Exec(); err != nil && i == checkAt {
			err = lease.CheckFailed(err)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil && conn.Conn().PgConn().TxStatus() != 'I' {
		_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback")
	}
	return err
}
