package apply

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"time"

	"github.com/pgscribe/pgscribe/event"
	"golang.org/x/sync/semaphore"
)

// Partition returns the partition of a stream: a stable FNV-1a hash of the
// stream id modulo n. Stable across processes and restarts, so a stream is
// always handled by the same worker and its events never run concurrently.
func Partition(streamID string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(streamID))
	return int(h.Sum32() % uint32(n))
}

// Partitions runs one worker per partition. Dispatch blocks when a
// partition's queue is full: that backpressure is what bounds memory under
// any backlog, all the way back to the replication reader.
type Partitions struct {
	queues    []chan Input
	committer *Committer
	batchSize func() int
	linger    time.Duration
	committed func(batch []Input, res Result)
	gate      gate
	// bytes bounds the weight (Weight) of the events dispatched and not
	// yet committed; nil without a bound.
	bytes    *semaphore.Weighted
	maxBytes int64
}

// Weight is what an event counts against PartitionOptions.Bytes: its JSON
// as read, and a little for the rest (the decoded fields a rule wants are
// a fraction of the text).
func Weight(ev *event.Event) int64 {
	return int64(len(ev.RawData)+len(ev.RawMetadata)) + eventOverhead
}

// eventOverhead is the weight of an event beside its JSON: the struct,
// its strings and its decoded fields, rounded up.
const eventOverhead = 1 << 10

// PartitionOptions configures Partitions.
type PartitionOptions struct {
	Count     int
	QueueSize int
	// BatchSize returns the current maximum batch size; the engine uses a
	// larger one while backfilling than when live.
	BatchSize func() int
	// Linger bounds how long a worker keeps filling a batch from a queue
	// that never runs dry (batch_timeout); 0 = only BatchSize bounds it.
	Linger time.Duration
	// Committed is called after each committed batch, from the worker's
	// goroutine, with the batch and what it did.
	Committed func(batch []Input, res Result)
	// Bytes bounds the weight of the events dispatched and not yet
	// committed ([engine] buffer_mb); 0 = only QueueSize bounds them. An
	// event heavier than the bound waits until nothing else is held.
	Bytes int64
}

// NewPartitions builds the partition workers.
func NewPartitions(c *Committer, o PartitionOptions) *Partitions {
	p := &Partitions{committer: c, batchSize: o.BatchSize, linger: o.Linger, committed: o.Committed}
	if o.Bytes > 0 {
		p.bytes, p.maxBytes = semaphore.NewWeighted(o.Bytes), o.Bytes
	}
	p.queues = make([]chan Input, o.Count)
	for i := range p.queues {
		p.queues[i] = make(chan Input, o.QueueSize)
	}
	return p
}

// Dispatch hands an event to its stream's partition, blocking while that
// partition's queue is full or the events held weigh Bytes.
func (p *Partitions) Dispatch(ctx context.Context, in Input) error {
	w := p.weight(in)
	if w > 0 {
		if err := p.bytes.Acquire(ctx, w); err != nil {
			return err
		}
	}
	in.held = w
	select {
	case p.queue(in) <- in:
		return nil
	case <-ctx.Done():
		p.release(w)
		return ctx.Err()
	}
}

// TryDispatch is Dispatch without blocking; it reports whether the event
// was queued.
func (p *Partitions) TryDispatch(in Input) bool {
	w := p.weight(in)
	if w > 0 && !p.bytes.TryAcquire(w) {
		return false
	}
	in.held = w
	select {
	case p.queue(in) <- in:
		return true
	default:
		p.release(w)
		return false
	}
}

// queue is the queue of in's stream's partition.
func (p *Partitions) queue(in Input) chan<- Input {
	return p.queues[Partition(in.Event.StreamID, len(p.queues))]
}

// weight is what in holds of the byte bound: 0 without one, or for a
// redrive; at most the bound itself.
func (p *Partitions) weight(in Input) int64 {
	if p.bytes == nil || in.Event == nil || in.Redrive != nil {
		return 0
	}
	return min(Weight(in.Event), p.maxBytes)
}

func (p *Partitions) release(w int64) {
	if w > 0 {
		p.bytes.Release(w)
	}
}

// released gives back what the events of a finished batch held.
func (p *Partitions) released(batch []Input) {
	if p.bytes == nil {
		return
	}
	var w int64
	for _, in := range batch {
		w += in.held
	}
	p.release(w)
}

// Run runs the workers until ctx ends or one fails; the first failure is
// returned. A worker finishes (or rolls back) its in-flight batch before it
// returns: the batch context is detached from ctx's cancellation, bounded by
// stop instead, so SIGTERM never aborts a commit half way.
func (p *Partitions) Run(ctx context.Context, stop <-chan struct{}) error {
	errc := make(chan error, len(p.queues))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range p.queues {
		go func(i int) {
			err := p.work(wctx, i, stop)
			if err != nil {
				err = fmt.Errorf("partition %d: %w", i, err)
				cancel()
			}
			errc <- err
		}(i)
	}
	var first error
	for range p.queues {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// grow waits up to SuspectWait for more events of the partition and appends
// what is queued, up to twice the larger of the batch size and the circuit
// threshold. more reports whether any event came; stopped, that stop or
// ctx ended the wait.
func (p *Partitions) grow(ctx context.Context, stop <-chan struct{}, q chan Input, batch []Input, held *[]Input) (_ []Input, more, stopped bool) {
	limit := 2 * max(p.batchSize(), p.committer.opts.CircuitThreshold)
	// Events queued behind a held redrive must not join a batch before it.
	if len(batch) >= limit || len(*held) > 0 {
		return batch, false, false
	}
	t := time.NewTimer(p.committer.opts.SuspectWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return batch, false, true
	case <-stop:
		return batch, false, true
	case <-t.C:
		return batch, false, false
	case in := <-q:
		if in.Redrive != nil {
			*held = append(*held, in)
			return batch, false, false
		}
		batch = append(batch, in)
	}
	for len(batch) < limit {
		select {
		case in := <-q:
			if in.Redrive != nil {
				*held = append(*held, in)
				return batch, true, false
			}
			batch = append(batch, in)
		default:
			return batch, true, false
		}
	}
	return batch, true, false
}

func (p *Partitions) work(ctx context.Context, i int, stop <-chan struct{}) error {
	q := p.queues[i]
	var part partition
	batch := make([]Input, 0, 64)
	// held is a redrive taken from the queue while a batch was filling: it
	// runs after that batch, so that the partition keeps its queue order.
	var held []Input
	for {
		batch = batch[:0]
		if len(held) > 0 {
			in := held[0]
			held = held[1:]
			if err := p.redrive(ctx, stop, in, &part); err != nil {
				return err
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-stop:
			return nil
		case in := <-q:
			if in.Redrive != nil {
				if err := p.redrive(ctx, stop, in, &part); err != nil {
					return err
				}
				continue
			}
			batch = append(batch, in)
		}
		// Natural batching: take what is queued, up to the batch size, and
		// commit as soon as the queue runs dry or the batch has been filling
		// for BatchTimeout. Idle traffic commits one event at a time with no
		// added latency; a backlog fills whole batches.
		max := p.batchSize()
		deadline := time.Now().Add(p.linger)
	fill:
		for len(batch) < max {
			select {
			case in := <-q:
				if in.Redrive != nil {
					held = append(held, in)
					break fill
				}
				batch = append(batch, in)
				if p.linger > 0 && len(batch)%64 == 0 && time.Now().After(deadline) {
					break fill
				}
			default:
				break fill
			}
		}
		// A graceful stop (stop closed) lets this commit run to completion;
		// only cancelling ctx (a hard stop) aborts it, and then it rolls back.
		// A held gate (a paused backfill) stops here, with the batch taken
		// but not applied: a stop drops it, to be read again.
		if !p.gate.pass(ctx, stop) {
			return nil
		}
		res, err := p.committer.commit(ctx, batch, &part, false)
		for errors.Is(err, errSuspect) {
			// Nothing in the batch applied. Before dead-lettering, look at
			// the events queued behind it: one that applies proves poison,
			// enough failures trip the circuit. With no more events (or a
			// batch at its bound) the failures are dead-lettered.
			var more, stopped bool
			batch, more, stopped = p.grow(ctx, stop, q, batch, &held)
			if stopped {
				return nil // nothing acknowledged: replayed after the restart
			}
			res, err = p.committer.commit(ctx, batch, &part, !more)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if p.committed != nil {
			p.committed(batch, res)
		}
		p.released(batch)
	}
}

// redrive runs a retried dead letter (see Redrive) and reports its outcome.
func (p *Partitions) redrive(ctx context.Context, stop <-chan struct{}, in Input, part *partition) error {
	if !p.gate.pass(ctx, stop) {
		return nil
	}
	out, err := p.committer.redrive(ctx, in, part)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	in.Redrive.Done(out)
	return nil
}
