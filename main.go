// Command pgscribe keeps read-model tables up to date from an append-only
// PostgreSQL events table. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/engine"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

const usage = `pgscribe keeps read-model tables up to date from a PostgreSQL events table.

Usage:
  pgscribe run         [-config FILE]                 run projections (active/standby)
  pgscribe migrate     [-config FILE] [-events-table]  create/upgrade the engine schema and publication
  pgscribe check       [-config FILE]                 validate config and rules
  pgscribe version

The config path is -config, else $PGSCRIBE_CONFIG, else ./pgscribe.toml.
PGSCRIBE_DATABASE_URL overrides [database] url.
Exit codes: 0 ok, 1 runtime failure, 2 usage or configuration error.
`

// exitError carries an exit code to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(format string, args ...any) error {
	return &exitError{code: 2, err: fmt.Errorf(format, args...)}
}

func main() {
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	if err == nil {
		return
	}
	code := 1
	var ee *exitError
	if errors.As(err, &ee) {
		code = ee.code
	}
	fmt.Fprintln(os.Stderr, "pgscribe:", err)
	os.Exit(code)
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageErr("no command given")
	}
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("pgscribe "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "configuration file")
	switch cmd {
	case "version":
		fmt.Fprintln(stdout, "pgscribe", version)
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	case "run":
		if err := fs.Parse(rest); err != nil {
			return usageErr("%v", err)
		}
		cfg, log, err := loadConfig(*configPath, stderr, true)
		if err != nil {
			return err
		}
		return runEngine(cfg, log)
	case "migrate":
		eventsTable := fs.Bool("events-table", false, "also create the reference events table")
		if err := fs.Parse(rest); err != nil {
			return usageErr("%v", err)
		}
		cfg, log, err := loadConfig(*configPath, stderr, true)
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return engine.Migrate(ctx, cfg, *eventsTable, log)
	case "check":
		if err := fs.Parse(rest); err != nil {
			return usageErr("%v", err)
		}
		cfg, _, err := loadConfig(*configPath, stderr, false)
		if err != nil {
			return err
		}
		if _, err := engine.Compile(cfg); err != nil {
			return &exitError{code: 2, err: err}
		}
		fmt.Fprintf(stdout, "%s: ok (%d projections)\n", cfg.Path, len(cfg.Projections))
		return nil
	default:
		fmt.Fprint(stderr, usage)
		return usageErr("unknown command %q", cmd)
	}
}

// loadConfig loads and validates the configuration; errors exit 2.
func loadConfig(flagPath string, stderr io.Writer, needDB bool) (*config.Config, *slog.Logger, error) {
	cfg, err := config.Load(config.ConfigPath(flagPath))
	if err != nil {
		return nil, nil, &exitError{code: 2, err: err}
	}
	if needDB {
		if err := cfg.RequireDatabase(); err != nil {
			return nil, nil, &exitError{code: 2, err: err}
		}
	}
	return cfg, newLogger(cfg, stderr), nil
}

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.Log.Level))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.Log.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// runEngine runs until SIGINT/SIGTERM. The first signal stops gracefully:
// intake stops, in-flight batches commit or roll back, the slot is
// confirmed, locks are released. A second signal, or shutdown_timeout
// passing, stops hard.
func runEngine(cfg *config.Config, log *slog.Logger) error {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	hard, hardStop := context.WithCancel(context.Background())
	defer hardStop()
	go func() {
		s := <-sigs
		log.Info("stopping: finishing in-flight batches", "signal", s.String(), "timeout", cfg.Engine.ShutdownTimeout)
		stop()
		select {
		case s = <-sigs:
			log.Warn("second signal: stopping now", "signal", s.String())
			os.Exit(1)
		case <-time.After(cfg.Engine.ShutdownTimeout):
			log.Warn("shutdown timeout: rolling back in-flight batches")
			hardStop()
		case <-hard.Done():
		}
	}()
	log.Info("pgscribe starting", "version", version, "node", cfg.Engine.Node, "database", cfg.Database,
		"projections", len(cfg.Projections))
	return engine.RunAll(ctx, cfg, engine.RunOptions{Version: version, Logger: log, Hard: hard})
}
