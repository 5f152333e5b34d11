package main

import (
	"context"
	"fmt"
)

// W4P is W4's live latency with poison: the activity log written with each
// event's reference into a varchar(40) column, at 1k events/s, first clean
// and then with 0.1% of the events carrying a reference too long for it
// (dead-lettered at commit), in one engine run.

// activityRefTable is W4P's read model.
const activityRefTable = `
CREATE TABLE IF NOT EXISTS account_activity_ref (
  event_id    uuid        PRIMARY KEY,
  account_id  text        NOT NULL,
  type        text        NOT NULL,
  amount      bigint      NOT NULL,
  reference   varchar(40) NOT NULL,
  occurred_at timestamptz NOT NULL
);`

// w4Poison is W4P's poison share.
const w4Poison = 0.001

func (b *bench) livePoison(ctx context.Context) error {
	o := b.opts
	targets := []target{{projection: "activity_ref", version: 1}}
	w := b.res.workload("W4P", "live with poison: W4 at 1k events/s, clean and with 0.1% commit-time poison",
		fmt.Sprintf("%s per step; activity with each event's reference in a varchar(40) column; %d producer connections over %s streams",
			o.w4Step(), o.w4Producers, thousands(o.streams)), 0)
	lv, err := b.startLive(ctx, "W4P", targets)
	if err != nil {
		return err
	}
	defer lv.close(ctx)
	lv.table = "account_activity_ref"
	for _, share := range []float64{0, w4Poison} {
		lv.prod.poison = share
		row, err := b.liveStep(ctx, lv, 1000, nil)
		if err != nil {
			return err
		}
		w.Latency = append(w.Latency, row)
	}
	return lv.p.stop()
}
