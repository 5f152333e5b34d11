// Command pgscribe keeps read-model tables up to date from an append-only
// PostgreSQL events table. See README.md.
//
// main only parses flags, handles signals and chooses exit codes; every
// command's work is in package admin (operator commands) or engine (run).
// The commands, their flags and their usage are the command table in
// commands.go; docs/cli.md documents each, and doc_test.go holds the two
// together.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgscribe/pgscribe/admin"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/engine"
	"github.com/pgscribe/pgscribe/rules"
)

// version, commit and commitDate are set at build time by `make build` and
// the Dockerfile (-ldflags "-X main.version=… -X main.commit=…
// -X main.commitDate=…"). A plain `go build` in a git clone leaves commit
// and commitDate empty and the binary reads them from its embedded VCS
// information instead (see buildInfo).
var (
	version    = "dev"
	commit     = ""
	commitDate = ""
)

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

// errHelp ends a command that was asked for its flags (-h): exit 0.
var errHelp = errors.New("help requested")

func main() {
	engine.SetGCPercent()
	err := run(os.Args[1:], os.Stdout, os.Stderr)
	if err == nil || errors.Is(err, errHelp) {
		return
	}
	fmt.Fprintln(os.Stderr, "pgscribe:", err)
	os.Exit(exitCode(err))
}

// exitCode maps an error to the documented exit codes.
func exitCode(err error) int {
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, admin.ErrProblems), errors.Is(err, admin.ErrNotConfirmed), errors.Is(err, admin.ErrDiscardNotConfirmed),
		errors.Is(err, admin.ErrWrongCommand):
		return 2
	}
	return 1
}

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return usageErr("no command given")
	}
	name, rest := args[0], args[1:]
	if slices.Contains(helpAliases, name) {
		name = "help"
	}
	if subs := subcommands(name); len(subs) > 0 {
		if len(rest) == 0 || !slices.Contains(subs, rest[0]) {
			return usageErr("%s needs a subcommand: %s or %s", name, strings.Join(subs[:len(subs)-1], ", "), subs[len(subs)-1])
		}
		name, rest = name+" "+rest[0], rest[1:]
	}
	c := lookup(name)
	switch {
	case c == nil:
		// The error alone, not the usage: 38 lines on stderr scroll it away.
		return usageErr("unknown command %q (run 'pgscribe help' for usage)", name)
	case c.define == nil: // help
		fmt.Fprint(stdout, usage)
		return nil
	}
	fs, runCmd := newFlagSet(c, stdout, stderr)
	if err := parse(fs, rest, c.operands != ""); err != nil {
		return err
	}
	return runCmd()
}

// idList is a repeatable -id flag.
type idList []int64

func (l *idList) String() string { return fmt.Sprint([]int64(*l)) }

func (l *idList) Set(s string) error {
	for _, part := range strings.Split(s, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(part), 10, 64)
		if err != nil || id < 1 {
			return fmt.Errorf("not a dead letter id: %q", part)
		}
		*l = append(*l, id)
	}
	return nil
}

// parse parses a command's flags. -h prints them and ends the command
// with exit 0; an unknown flag, or a stray argument when the command takes
// no operands, is a usage error.
func parse(fs *flag.FlagSet, args []string, operands bool) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return usageErr("%v", err)
	}
	if fs.NArg() > 0 && !operands {
		return usageErr("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// signalContext is cancelled by SIGINT or SIGTERM: a command's queries stop.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// projections is "1 projection" or "N projections".
func projections(n int) string {
	if n == 1 {
		return "1 projection"
	}
	return fmt.Sprintf("%d projections", n)
}

// loadConfig loads and validates the configuration; errors exit 2.
func loadConfig(flagPath string, stderr io.Writer, needDB bool) (*config.Config, *slog.Logger, error) {
	return loadConfigWith(config.Load, flagPath, stderr, needDB)
}

// loadPrograms is loadConfig that also compiles the rules. A rule that does
// not compile is a configuration error (exit 2, which the systemd unit does
// not restart), not a runtime failure.
func loadPrograms(flagPath string, stderr io.Writer, needDB bool) (*config.Config, *slog.Logger, []*rules.Program, error) {
	cfg, log, err := loadConfig(flagPath, stderr, needDB)
	if err != nil {
		return nil, nil, nil, err
	}
	progs, err := engine.Compile(cfg)
	if err != nil {
		return nil, nil, nil, &exitError{code: 2, err: err}
	}
	return cfg, log, progs, nil
}

// loadConfigWith is loadConfig with the loader of a command's choice.
func loadConfigWith(load func(string) (*config.Config, error), flagPath string, stderr io.Writer, needDB bool) (*config.Config, *slog.Logger, error) {
	cfg, err := load(config.ConfigPath(flagPath))
	if errors.Is(err, fs.ErrNotExist) {
		err = fmt.Errorf("%w\n%s", err, missingConfigHint(flagPath))
	}
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

// missingConfigHint says where the configuration path came from and how
// to give another: a new user running `pgscribe status` in an empty
// directory otherwise only learns that ./pgscribe.toml does not exist.
func missingConfigHint(flagPath string) string {
	from := "neither -config nor $" + config.EnvConfig + " is set"
	switch {
	case flagPath != "":
		from = "the path is -config's"
	case os.Getenv(config.EnvConfig) != "":
		from = "the path is $" + config.EnvConfig + "'s"
	}
	return fmt.Sprintf("  (%s; pass the configuration with -config FILE or %s=FILE; config.toml.example is a complete example)",
		from, config.EnvConfig)
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
func runEngine(cfg *config.Config, progs []*rules.Program, log *slog.Logger) error {
	engine.SetMemoryLimit(cfg, log)
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
	return engine.RunAll(ctx, cfg, engine.RunOptions{Version: version, Logger: log, Hard: hard, Programs: progs,
		Console: consoleHandler(ctx, cfg, progs, log)})
}
