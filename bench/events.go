package main

import (
	"context"
	"fmt"
	"time"
)

// history describes a generated event history: accounts (streams) that are
// opened, receive deposits and withdrawals, and sometimes close, written in
// waves of `active` streams whose events interleave round-robin in position
// order, so a page of the table holds many streams, each in order.
type history struct {
	streams   int64 // accounts
	perStream int64 // events per stream
	active    int64 // streams interleaved at a time; divides streams
	// poison is how many in 1,000 deposits and withdrawals, chosen by a
	// hash of the position, carry a reference of 48 characters (commit-time
	// poison for a varchar(40) column, as W6's); 0 for none.
	poison int64
	// pad adds a "doc" field of about pad bytes to every event's data (big
	// events, W9); 0 for none. Its text repeats, so TOAST stores it small;
	// the engine reads it whole.
	pad int64
}

// newHistory spreads about `events` events over `streams` streams; the
// total is rounded down to a multiple of streams (at least one event each).
func newHistory(events, streams, active int64) history {
	streams = max(streams, 1)
	active = min(max(active, 1), streams)
	for streams%active != 0 {
		active-- // a wave must hold whole streams
	}
	return history{streams: streams, perStream: max(events/streams, 1), active: active}
}

// events is the number of events the history holds.
func (h history) events() int64 { return h.streams * h.perStream }

// generateSQL appends the events with index [$1, $2) of the history.
// Event i belongs to wave i / (active × perStream); within its wave,
// streams take turns, so stream_position runs 1..perStream per stream in
// position order. Position 1 opens the account, the last one closes every
// tenth account, the rest are deposits and (one in three) withdrawals with
// a payload and metadata of realistic size (~250 and ~170 bytes of jsonb);
// $6 in 1,000 of those carry a 48-character reference (history.poison).
const generateSQL = `
INSERT INTO events (stream_id, stream_position, type, data, metadata, occurred_at)
SELECT stream_id, pos, type,
  CASE type
    WHEN 'AccountOpened' THEN jsonb_build_object('account_id', stream_id, 'owner', 'Owner ' || s,
      'initial', h % 10000, 'currency', 'EUR', 'branch', 'branch-' || s % 40,
      'kyc', jsonb_build_object('level', 1 + s % 3, 'checked', true))
    WHEN 'AccountClosed' THEN jsonb_build_object('account_id', stream_id, 'reason', 'customer request',
      'closed_by', 'user-' || s % 500)
    ELSE jsonb_build_object('account_id', stream_id, 'amount', 1 + h % 1000, 'currency', 'EUR',
      'reference', CASE WHEN (hashint8(-i) & 2147483647) % 1000 < $6::bigint THEN repeat('r', 40) || lpad(i::text, 8, '0')
        ELSE 'tx-' || i END, 'channel', (ARRAY['card', 'sepa', 'cash', 'wire'])[1 + h % 4],
      'description', 'payment ' || i || ' for order ' || h % 100000)
  END || CASE WHEN $7::bigint > 0 THEN jsonb_build_object('doc', repeat(md5(i::text), ($7::bigint / 32)::int)) ELSE '{}' END,
  jsonb_build_object('correlation_id', md5(i::text)::uuid, 'causation_id', md5((i + 1)::text)::uuid,
    'user_id', 'user-' || s % 500, 'source', 'bench', 'schema_version', 1),
  $5::timestamptz + i * interval '1 millisecond'
FROM (
  SELECT i, s, pos, h, 'acct-' || lpad(s::text, 7, '0') AS stream_id,
    CASE WHEN pos = 1 THEN 'AccountOpened'
         WHEN pos = $3::bigint AND pos > 1 AND s % 10 = 0 THEN 'AccountClosed'
         WHEN h % 3 = 0 THEN 'Withdrawn'
         ELSE 'Deposited' END AS type
  FROM (
    SELECT i, (i / (a * n)) * a + (i % (a * n)) % a AS s, (i % (a * n)) / a + 1 AS pos,
      (hashint8(i) & 2147483647)::bigint AS h
    FROM generate_series($1::bigint, $2::bigint - 1) AS i, (SELECT $3::bigint AS n, $4::bigint AS a) p
  ) g
) e
ORDER BY i`

// historyEpoch is the occurred_at of event 0.
var historyEpoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

// generate appends the whole history to the events table of db, txEvents
// events per transaction, in order (so commit order is position order).
func (h history) generate(ctx context.Context, db *database, txEvents int64, progress func(done int64)) error {
	total := h.events()
	txEvents = max(txEvents, 1)
	for lo := int64(0); lo < total; lo += txEvents {
		hi := min(lo+txEvents, total)
		if _, err := db.pool.Exec(ctx, generateSQL, lo, hi, h.perStream, h.active, historyEpoch, h.poison, h.pad); err != nil {
			return fmt.Errorf("generate events [%d, %d): %w", lo, hi, err)
		}
		if progress != nil {
			progress(hi)
		}
	}
	return nil
}
