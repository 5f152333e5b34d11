package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/console"
	"github.com/pgscribe/pgscribe/rules"
)

// defaultConsoleListen is where `pgscribe console` listens without
// -listen: loopback, next to the metrics listener's default port so that
// both run on one host.
const defaultConsoleListen = "127.0.0.1:9188"

// consoleUsage is the console's lines in help.
const consoleUsage = `
  pgscribe console [-config FILE] [-listen 127.0.0.1:9188]
      Serve the web console on its own listener, with or without an engine
      running (pgscribe run also serves it on the metrics listener while
      [metrics] console = true, the default). See docs/console.md.
`

// defineConsole defines `pgscribe console`, which serves the console until
// SIGINT or SIGTERM.
func defineConsole(fs *flag.FlagSet, c *cmdEnv) func() error {
	listen := fs.String("listen", defaultConsoleListen, "`address` to serve the console on (host:port)")
	return func() error {
		cfg, log, progs, err := loadPrograms(*c.config, c.stderr, true)
		if err != nil {
			return err
		}
		con, err := console.New(cfg, progs, log, console.Options{})
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		return console.ListenAndServe(ctx, *listen, con, func(addr string) {
			fmt.Fprintf(c.stdout, "pgscribe console at http://%s/ (Ctrl-C to stop)\n", addr)
		})
	}
}

// consoleHandler builds the console that `pgscribe run` serves on its
// metrics listener, and starts its sampler until ctx ends; nil when the
// configuration turns it off.
func consoleHandler(ctx context.Context, cfg *config.Config, progs []*rules.Program, log *slog.Logger) http.Handler {
	if !cfg.Metrics.Console || !cfg.Metrics.Enabled() {
		return nil
	}
	c, err := console.New(cfg, progs, log, console.Options{})
	if err != nil {
		log.Warn("console off", "err", err)
		return nil
	}
	go func() { _ = c.Run(ctx) }()
	if !console.Loopback(cfg.Metrics.Listen) {
		log.Warn("the console serves projection state and dead letters' event data on a non-loopback address: "+
			"set [metrics] console = false, or restrict who can reach it (docs/console.md)", "addr", cfg.Metrics.Listen)
	}
	return c
}
