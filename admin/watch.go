package admin

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/pgscribe/pgscribe/config"
)

// StatusOptions configures ShowStatus.
type StatusOptions struct {
	JSON bool
	// Watch redraws every Interval until ctx ends, with a progress bar per
	// backfill (JSON: one report per Interval).
	Watch    bool
	Interval time.Duration
}

// ShowStatus writes the status report to w, once or, with Watch, until
// ctx ends (which is then not an error).
func ShowStatus(ctx context.Context, cfg *config.Config, o StatusOptions, w io.Writer) error {
	for {
		rep, err := Status(ctx, cfg)
		if err != nil {
			if o.Watch && ctx.Err() != nil {
				return nil
			}
			return err
		}
		switch {
		case o.JSON:
			err = rep.WriteJSON(w)
		case o.Watch:
			fmt.Fprint(w, "\x1b[H\x1b[2J") // home and clear: redraw in place on a terminal
			if err = rep.WriteText(w); err == nil {
				err = rep.WriteProgress(w, 40)
			}
		default:
			err = rep.WriteText(w)
		}
		if err != nil || !o.Watch {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.Interval):
		}
	}
}
