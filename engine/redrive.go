package engine

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/apply"
	"github.com/pgscribe/pgscribe/control"
	"github.com/pgscribe/pgscribe/deadletter"
)

// redrivePage is how many dead letters a retry reads at a time: memory is
// bounded by it and the partitions' queues, however many it selects.
const redrivePage = 500

// runRetry runs one queued `pgscribe deadletters retry` request: it reads
// the selected dead letters in per-stream position order and hands each to
// its stream's partition, which re-evaluates it with the rules this node
// runs and applies it in a transaction of its own (apply.Redrive). Then it
// records the counts on the request. When the session ends first the
// request stays pending and the next session runs it again (what was
// applied is gone from the table by then). It reports whether the request
// is done.
func (s *session) runRetry(ctx context.Context, id int64) bool {
	schema := s.cfg.Engine.Schema
	r, err := control.LoadRetry(ctx, s.pool, schema, id)
	if err != nil {
		s.log.Warn("retry request", "id", id, "err", err)
		return false
	}
	if err := s.fenced(ctx, func(tx pgx.Tx) error { return control.StartRetry(ctx, tx, schema, id, s.cfg.Engine.Node) }); err != nil {
		s.log.Warn("start retry request", "id", id, "err", err)
		return false
	}
	s.log.Info("retrying dead letters", "request", id, "skip", r.Skip, "requested_by", r.RequestedBy, "ids", r.IDs,
		"kind", r.ErrorKind, "stream", r.StreamID)
	f := deadletter.Filter{Projection: s.spec.Name, Version: s.spec.Version, IDs: r.IDs, StreamID: r.StreamID, ErrorKind: r.ErrorKind}

	var mu sync.Mutex
	var selected, pending, applied, failed int64
	allDone := make(chan struct{})
	dispatched := false
	finish := func(out apply.RedriveOutcome) {
		mu.Lock()
		defer mu.Unlock()
		switch out {
		case apply.RedriveApplied:
			applied++
		case apply.RedriveFailed:
			failed++
		}
		pending--
		if dispatched && pending == 0 {
			close(allDone)
		}
	}
	var after deadletter.Row
	var readErr error
	for readErr == nil {
		rows, err := deadletter.StreamOrder(ctx, s.pool, schema, f, after, redrivePage)
		if err != nil {
			readErr = err
			break
		}
		if len(rows) == 0 {
			break
		}
		for _, row := range rows {
			mu.Lock()
			selected++
			pending++
			mu.Unlock()
			in := apply.Input{Event: row.Event(), Redrive: &apply.Redrive{DeadLetterID: row.ID, Skip: r.Skip, Done: finish}}
			if err := s.parts.Dispatch(ctx, in); err != nil {
				readErr = err
				break
			}
		}
		after = rows[len(rows)-1]
	}
	if readErr != nil {
		if ctx.Err() == nil {
			s.log.Warn("retry request: read dead letters", "id", id, "err", readErr)
		}
		return false // pending: run again
	}
	mu.Lock()
	dispatched = true
	if pending == 0 {
		close(allDone)
	}
	mu.Unlock()
	select {
	case <-ctx.Done():
		return false
	case <-allDone:
	}
	mu.Lock()
	sel, app, fail := selected, applied, failed
	mu.Unlock()
	if err := s.fenced(ctx, func(tx pgx.Tx) error {
		return control.FinishRetry(ctx, tx, schema, id, sel, app, fail, "")
	}); err != nil {
		s.log.Warn("finish retry request", "id", id, "err", err)
		return false
	}
	s.log.Info("dead letters retried", "request", id, "selected", sel, "applied", app, "failed_again", fail)
	return true
}
