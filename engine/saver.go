package engine

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgscribe/pgscribe/leader"
)

// saver commits the watermark saves of a group's members together: each
// member's ledger saves its own row (fenced by its own lease) within
// ~publishGap of a move, and eight members doing that alone made as many
// small transactions as their batches did at 1k events/s (bench W7). The
// saves that wait while one transaction is in flight go in the next one:
// BEGIN, then each member's fence check and statements, COMMIT. When that
// fails (a member was fenced), each save of it is retried alone, so one
// member's lost lease never fails another's save.
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
	stmts []statement
	done  chan error
}

func newSaver(url string, leaseTimeout time.Duration, log *slog.Logger) *saver {
	return &saver{url: url, idle: fmt.Sprint(leaseTimeout.Milliseconds()), log: log, reqs: make(chan *saveReq, 64)}
}

// save commits stmts fenced by lease, with the other members' saves that
// are waiting, and returns when they committed or failed.
func (sv *saver) save(ctx context.Context, lease *leader.Lease, stmts ...statement) error {
	r := &saveReq{lease: lease, stmts: stmts, done: make(chan error, 1)}
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

// commit runs the saves of batch in one transaction, in one round trip.
func (sv *saver) commit(ctx context.Context, batch []*saveReq) error {
	pool, err := sv.conn(ctx)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var b pgx.Batch
	b.Queue("begin")
	checks := map[int]*leader.Lease{}
	for _, r := range batch {
		check, args := r.lease.CheckStatement()
		checks[b.Len()] = r.lease
		b.Queue(check, args...)
		for _, st := range r.stmts {
			b.Queue(st.sql, st.args...)
		}
	}
	b.Queue("commit")
	n := b.Len()
	br := conn.SendBatch(ctx, &b)
	for i := 0; i < n && err == nil; i++ {
		if _, err = br.Exec(); err != nil {
			if l := checks[i]; l != nil {
				err = l.CheckFailed(err)
			}
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
