package lag

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// OldestTransactionSQL reads, in seconds, how long the oldest transaction
// open on an engine session of the server has been open (0 when none):
// sessions named "pgscribe" or "pgscribe …" (batches, watermark saves,
// backfill pages, the lag probe), not the command line's or the
// console's. A transaction held open holds back vacuum in the whole
// cluster; the engine keeps each short (a backfill page, a batch), so a
// long one means a batch waits on a lock or the server is stalled.
const OldestTransactionSQL = `SELECT coalesce(extract(epoch FROM clock_timestamp() - min(xact_start)), 0)::float8
FROM pg_stat_activity
WHERE (application_name = 'pgscribe' OR application_name LIKE 'pgscribe %')
  AND backend_type = 'client backend' AND xact_start IS NOT NULL AND pid <> pg_backend_pid()`

// OldestTransaction runs OldestTransactionSQL on each of conns and returns
// the largest age.
func OldestTransaction(ctx context.Context, conns ...*pgx.Conn) (time.Duration, error) {
	var oldest float64
	for _, c := range conns {
		var s float64
		if err := c.QueryRow(ctx, OldestTransactionSQL).Scan(&s); err != nil {
			return 0, err
		}
		oldest = max(oldest, s)
	}
	return time.Duration(oldest * float64(time.Second)), nil
}

// SampleOldestTransaction sets pgscribe_oldest_transaction_seconds every
// interval from the servers at urls (the source, and the target when it
// is another database) until ctx ends, on a connection to each that it
// opens again after a failure. A failed sample leaves the gauge as it was
// and is logged at debug level (the lag probe reports the same outages).
func (m *Metrics) SampleOldestTransaction(ctx context.Context, urls []string, interval time.Duration, log *slog.Logger) {
	conns := make([]*pgx.Conn, len(urls))
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := m.sampleOldest(ctx, urls, conns); err != nil && ctx.Err() == nil {
			log.Debug("sample the oldest engine transaction", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (m *Metrics) sampleOldest(ctx context.Context, urls []string, conns []*pgx.Conn) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for i, u := range urls {
		if conns[i] != nil {
			continue
		}
		cfg, err := pgx.ParseConfig(u)
		if err != nil {
			return err
		}
		cfg.RuntimeParams["application_name"] = "pgscribe-sampler" // not an engine session: it never holds a transaction
		if conns[i], err = pgx.ConnectConfig(cctx, cfg); err != nil {
			return err
		}
	}
	d, err := OldestTransaction(cctx, conns...)
	if err != nil {
		for i, c := range conns {
			c.Close(context.WithoutCancel(ctx))
			conns[i] = nil
		}
		return err
	}
	m.OldestXact.Set(d.Seconds())
	return nil
}
