// Command pgscribe keeps read-model tables up to date from an append-only
// PostgreSQL events table. See README.md.
//
// main only parses flags, handles signals and chooses exit codes; every
// command's work is in package admin (operator commands) or engine (run).
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
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pgscribe/pgscribe/admin"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/deadletter"
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

const usage = `pgscribe keeps read-model tables up to date from a PostgreSQL events table.

Usage:
  pgscribe run [-config FILE]
      Run the configured projections (active/standby) until SIGTERM or SIGINT.
  pgscribe migrate [-config FILE] [-events-table]
      Create or upgrade the engine schema and the publication.
      -events-table also creates the reference events table.
  pgscribe check [-config FILE] [-offline]
      Validate the configuration and the rules, then the databases: tables,
      columns, inc types, unique indexes for upserts, privileges, wal_level,
      the publication and the engine schema. -offline skips the databases.
  pgscribe status [-config FILE] [-json] [-watch [-interval 2s]]
      Per projection version: state, active node, watermark, lag, backlog,
      WAL retained by the slot, dead letters, backfill progress.
  pgscribe deadletters list [-config FILE] [-projection NAME] [-version N]
                            [-stream ID] [-kind KIND] [-after ID] [-limit N] [-json]
      List dead letters by id, -limit (default 100, at most 10000) at a time;
      -after ID gives the next page. -json prints one JSON object a line,
      with the event's data and metadata.
  pgscribe deadletters stats [-config FILE] [-projection NAME] [-version N]
                             [-stream ID] [-kind KIND] [-json]
      Count dead letters: total, oldest, newest, by error kind, by projection.
  pgscribe deadletters retry [-config FILE] [-projection NAME -version N]
                             [-id ID]... [-stream ID] [-kind KIND] [-dry-run]
      Ask the active node to apply the selected dead letters again with the
      rules it runs now, per stream in position order; an event that fails
      again stays, with its new reason. Waits for the outcome; queued when no
      engine runs the version. -dry-run prints what the rules would write.
  pgscribe deadletters skip [-config FILE] [-projection NAME -version N]
                            [-id ID]... [-stream ID] [-kind KIND]
      Like retry, but the active node drops the dead letters (counted as
      skipped) and releases the events their streams parked (on_error = "park")
      in order, without them.
  pgscribe deadletters discard [-config FILE] [-projection NAME] [-version N]
                               [-id ID]... [-stream ID] [-kind KIND] [-yes]
      Drop the selected dead letters (counted as skipped in their cursors).
      Without -yes it prints what it would drop.
  pgscribe pause -projection NAME -version N [-config FILE] [-reason TEXT]
      The active node stops applying within a second (in-flight batches
      commit first) and keeps its lock and slot; the slot retains WAL while
      paused. Stored in the engine schema: holds across restarts and failovers.
  pgscribe resume -projection NAME -version N [-config FILE]
      End a pause, or make a halted projection's active node retry now.
  pgscribe reset -projection NAME -version N [-config FILE] [-yes] [-dead-letters]
      Drop a projection version's slot, cursors and watermark so that its next
      run rebuilds it from the events table. Read-model tables are never
      touched; dead letters only with -dead-letters. Without -yes it prints
      what it would do. Refused while an engine runs the version.
  pgscribe test [-config FILE] [-database] FIXTURE…
      Run rule fixtures (TOML: events and the intents, skips or dead letters
      each must produce) through the configured rules, with no engine.
      -database also applies them in a throwaway schema of the target
      database and checks the rows the fixtures' [[table]] entries list.
      Exit 1 when an expectation fails, 2 on a bad fixture.
  pgscribe verify -projection NAME -version N [-config FILE] [-stream ID]… [-limit N] [-json]
      Rebuild a projection version from the events its cursors have
      accounted for, in a scratch schema, and diff it with the live read
      model in PostgreSQL, while the engine keeps running. Exit 1 on drift.
  pgscribe promote -projection NAME -version N [-config FILE] [-max-lag 10s]
                   [-timeout 1m] [-force]
      Serve this version: in one transaction, point every view <serve>.<table>
      at the version's <schema>.<table> and record it as served. Refused
      unless the version is live, lags at most -max-lag and is not halted;
      -force overrides and says what it overrode.
  pgscribe retire -projection NAME -version N [-config FILE] [-drop-schema]
      Remove a version that no longer serves: its slot, cursors, watermark,
      dead letters and lease, and with -drop-schema its schema. Refused for
      the served version and while an engine runs the version.
  pgscribe wait -projection NAME -version N (-caught-up | -lsn LSN | -stream ID -position P)
                [-config FILE] [-timeout 30s]
      Wait until the projection version has accounted for every source
      transaction committed before the command started (-caught-up) or at
      or before LSN, or for that event of a stream; a progress line every
      second on stderr. Exit 0 when reached, 1 on timeout.
  pgscribe version
  pgscribe help

The config path is -config, else $PGSCRIBE_CONFIG, else ./pgscribe.toml.
PGSCRIBE_DATABASE_URL overrides [database] url; libpq variables (PGHOST …)
fill in what the URL leaves out.

Exit codes: 0 ok; 1 runtime failure (a database that cannot be reached, a
reset or retire refused because an engine runs the projection, a promote
or retire refused by the version's state); 2 usage or
configuration error, problems found by check, reset without -yes.
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
	cmd, rest := args[0], args[1:]
	fs := flag.NewFlagSet("pgscribe "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "configuration `file` (default $PGSCRIBE_CONFIG, else ./pgscribe.toml)")
	switch cmd {
	case "version":
		if err := parse(fs, rest); err != nil {
			return err
		}
		writeVersion(stdout)
		return nil
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	case "run":
		if err := parse(fs, rest); err != nil {
			return err
		}
		cfg, log, progs, err := loadPrograms(*configPath, stderr, true)
		if err != nil {
			return err
		}
		return runEngine(cfg, progs, log)
	case "migrate":
		eventsTable := fs.Bool("events-table", false, "also create the reference events table")
		if err := parse(fs, rest); err != nil {
			return err
		}
		// migrate needs no rules: a rule's mistake must not stop it.
		cfg, log, err := loadConfigWith(config.LoadSettings, *configPath, stderr, true)
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		return admin.Migrate(ctx, cfg, *eventsTable, log)
	case "check":
		offline := fs.Bool("offline", false, "check the configuration and rules only, not the databases")
		if err := parse(fs, rest); err != nil {
			return err
		}
		cfg, _, progs, err := loadPrograms(*configPath, stderr, false)
		if err != nil {
			return err
		}
		if *offline || cfg.RequireDatabase() != nil {
			fmt.Fprintf(stdout, "%s: ok (%s; databases not checked)\n", cfg.Path, projections(len(cfg.Projections)))
			return nil
		}
		ctx, stop := signalContext()
		defer stop()
		if err := admin.Check(ctx, cfg, progs, stdout); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s: ok (%s; databases checked)\n", cfg.Path, projections(len(cfg.Projections)))
		return nil
	case "status":
		asJSON := fs.Bool("json", false, "print JSON")
		watch := fs.Bool("watch", false, "redraw every -interval, with a progress bar per backfill, until Ctrl-C")
		interval := fs.Duration("interval", 2*time.Second, "redraw interval of -watch")
		if err := parse(fs, rest); err != nil {
			return err
		}
		cfg, _, err := loadConfig(*configPath, stderr, true)
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		return admin.ShowStatus(ctx, cfg, admin.StatusOptions{JSON: *asJSON, Watch: *watch, Interval: *interval}, stdout)
	case "deadletters":
		return deadLetters(fs, configPath, rest, stdout, stderr)
	case "pause", "resume":
		var o admin.ControlOptions
		act := admin.Resume
		if cmd == "pause" {
			fs.StringVar(&o.Reason, "reason", "", "why, shown by status")
			act = admin.Pause
		}
		return runVersionCommand(fs, rest, cmd, &o.Projection, &o.Version, config.Load, configPath, stderr,
			func(ctx context.Context, cfg *config.Config) error { return act(ctx, cfg, o, stdout) })
	case "reset":
		var o admin.ResetOptions
		fs.BoolVar(&o.Yes, "yes", false, "reset; without it, only print what would be reset")
		fs.BoolVar(&o.DeadLetters, "dead-letters", false, "also delete the version's dead letters")
		return runVersionCommand(fs, rest, cmd, &o.Projection, &o.Version, config.Load, configPath, stderr,
			func(ctx context.Context, cfg *config.Config) error { return admin.Reset(ctx, cfg, o, stdout) })
	case "test":
		database := fs.Bool("database", false, "also apply the events in a throwaway schema of the target database and check [[table]] rows")
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return errHelp
			}
			return usageErr("%v", err)
		}
		if fs.NArg() == 0 {
			return usageErr("test needs at least one FIXTURE file")
		}
		cfg, _, err := loadConfig(*configPath, stderr, *database)
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		err = admin.Test(ctx, cfg, fs.Args(), admin.TestOptions{Database: *database}, stdout)
		var fe *admin.FixtureError
		if errors.As(err, &fe) {
			return &exitError{code: 2, err: err}
		}
		return err
	case "verify":
		var o admin.VerifyOptions
		fs.Func("stream", "only this stream `id` (repeatable): rebuild its events, compare the rows only such streams write", func(s string) error {
			o.Streams = append(o.Streams, s)
			return nil
		})
		fs.IntVar(&o.Limit, "limit", 100, "print at most `n` drifted rows per table (all are counted)")
		fs.BoolVar(&o.JSON, "json", false, "print the result as one JSON object (progress still goes to stderr)")
		fs.DurationVar(&o.ProgressEvery, "progress", 5*time.Second, "report the rebuild's progress on stderr this often")
		if os.Getenv("GOMEMLIMIT") == "" {
			debug.SetMemoryLimit(admin.VerifyMemoryLimit)
		}
		err := runVersionCommand(fs, rest, cmd, &o.Projection, &o.Version, config.Load, configPath, stderr,
			func(ctx context.Context, cfg *config.Config) error { return admin.Verify(ctx, cfg, o, stdout, stderr) })
		if errors.Is(err, admin.ErrVerifyUsage) {
			return &exitError{code: 2, err: err}
		}
		return err
	case "promote":
		var o admin.PromoteOptions
		fs.DurationVar(&o.MaxLag, "max-lag", admin.DefaultMaxLag, "largest lag the version may have")
		fs.DurationVar(&o.Timeout, "timeout", admin.DefaultPromoteTimeout, "how long to retry while readers' transactions hold the views")
		fs.BoolVar(&o.Force, "force", false, "promote even if the version is not live, lags or is halted")
		return runVersionCommand(fs, rest, cmd, &o.Projection, &o.Version, config.Load, configPath, stderr,
			func(ctx context.Context, cfg *config.Config) error { return admin.Promote(ctx, cfg, o, stdout) })
	case "retire":
		var o admin.RetireOptions
		fs.BoolVar(&o.DropSchema, "drop-schema", false, "also drop the version's schema and its tables")
		// retire needs no rules: an old version may have left the file.
		return runVersionCommand(fs, rest, cmd, &o.Projection, &o.Version, config.LoadSettings, configPath, stderr,
			func(ctx context.Context, cfg *config.Config) error { return admin.Retire(ctx, cfg, o, stdout) })
	case "wait":
		var o admin.WaitOptions
		fs.StringVar(&o.Projection, "projection", "", "projection `name` (required)")
		fs.Int64Var(&o.Version, "version", 0, "projection `version` (required)")
		fs.BoolVar(&o.CaughtUp, "caught-up", false, "wait for every transaction committed before the command started")
		fs.StringVar(&o.LSN, "lsn", "", "wait for every transaction committed at or before this source `LSN`")
		fs.StringVar(&o.Stream, "stream", "", "wait for an event of this stream `id` (with -position)")
		fs.Int64Var(&o.Position, "position", 0, "the event's stream `position` (with -stream)")
		fs.DurationVar(&o.Timeout, "timeout", 30*time.Second, "give up after this long (exit 1)")
		if err := parse(fs, rest); err != nil {
			return err
		}
		position := false // stream positions may start at 0: was it given?
		fs.Visit(func(f *flag.Flag) { position = position || f.Name == "position" })
		modes := 0
		for _, set := range []bool{o.CaughtUp, o.LSN != "", o.Stream != ""} {
			if set {
				modes++
			}
		}
		if o.Projection == "" || o.Version < 1 || modes != 1 || (o.Stream != "") != position || o.Timeout <= 0 {
			return usageErr("wait needs -projection NAME, -version N, one of -caught-up, -lsn LSN or -stream ID -position P, and a positive -timeout")
		}
		cfg, _, err := loadConfig(*configPath, stderr, true)
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		o.Progress = stderr
		return admin.Wait(ctx, cfg, o, stdout)
	default:
		// The error alone, not the usage: 38 lines on stderr scroll it away.
		return usageErr("unknown command %q (run 'pgscribe help' for usage)", cmd)
	}
}

// deadLetters runs `deadletters list|stats`.
func deadLetters(fs *flag.FlagSet, configPath *string, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || !slices.Contains([]string{"list", "stats", "retry", "skip", "discard"}, args[0]) {
		return usageErr("deadletters needs a subcommand: list, stats, retry, skip or discard")
	}
	sub := args[0]
	var f deadletter.Filter
	fs.Init("pgscribe deadletters "+sub, flag.ContinueOnError)
	fs.StringVar(&f.Projection, "projection", "", "only this projection `name`")
	fs.Int64Var(&f.Version, "version", 0, "only this projection `version` (0 = any)")
	fs.StringVar(&f.StreamID, "stream", "", "only this stream `id`")
	fs.StringVar(&f.ErrorKind, "kind", "", "only this error `kind`, for example rule:open or commit:23505 (unique_violation)")
	var asJSON, dryRun, yes *bool
	switch sub {
	case "list", "stats":
		asJSON = fs.Bool("json", false, "print JSON")
	case "retry", "skip":
		fs.Var((*idList)(&f.IDs), "id", "only this dead letter `id` (repeatable)")
		if sub == "retry" {
			dryRun = fs.Bool("dry-run", false, "print what the rules would write now; change nothing")
		}
	case "discard":
		fs.Var((*idList)(&f.IDs), "id", "only this dead letter `id` (repeatable)")
		yes = fs.Bool("yes", false, "discard; without it, only print what would be discarded")
	}
	if sub == "list" {
		fs.Int64Var(&f.AfterID, "after", 0, "only dead letters with a larger `id` (the last one of the previous page)")
		fs.IntVar(&f.Limit, "limit", deadletter.DefaultLimit, fmt.Sprintf("at most `n` dead letters (1 to %d)", deadletter.MaxLimit))
	}
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	switch {
	case f.Version < 0:
		return usageErr("-version must be at least 1 (or 0 for any)")
	case f.AfterID < 0:
		return usageErr("-after must not be negative")
	case sub == "list" && (f.Limit < 1 || f.Limit > deadletter.MaxLimit):
		return usageErr("-limit must be between 1 and %d", deadletter.MaxLimit)
	}
	if (sub == "retry" || sub == "skip" || sub == "discard") && (f.Projection == "") != (f.Version == 0) {
		return usageErr("%s: give -projection and -version together, or neither", sub)
	}
	cfg, _, err := loadConfig(*configPath, stderr, true)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	switch sub {
	case "list":
		return admin.ListDeadLetters(ctx, cfg, f, *asJSON, stdout)
	case "retry", "skip":
		progs, err := engine.Compile(cfg)
		if err != nil {
			return &exitError{code: 2, err: err}
		}
		o := admin.RetryOptions{Filter: f, Skip: sub == "skip", Programs: progs}
		if dryRun != nil {
			o.DryRun = *dryRun
		}
		return admin.RetryDeadLetters(ctx, cfg, o, stdout)
	case "discard":
		return admin.DiscardDeadLetters(ctx, cfg, admin.DiscardOptions{Filter: f, Yes: *yes}, stdout)
	}
	return admin.DeadLetterStats(ctx, cfg, f, *asJSON, stdout)
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

// runVersionCommand runs cmd, a command that acts on one projection
// version: it adds -projection and -version to the command's own flags,
// refuses the command when either is missing, loads the configuration with
// load (as loadConfigWith; it must name a database) and calls run with it
// and a context that SIGINT or SIGTERM cancel.
func runVersionCommand(fs *flag.FlagSet, args []string, cmd string, projection *string, version *int64,
	load func(string) (*config.Config, error), configPath *string, stderr io.Writer,
	run func(context.Context, *config.Config) error) error {
	fs.StringVar(projection, "projection", "", "projection `name` (required)")
	fs.Int64Var(version, "version", 0, "projection `version` (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *projection == "" || *version < 1 {
		return usageErr("%s needs -projection NAME and -version N (at least 1)", cmd)
	}
	cfg, _, err := loadConfigWith(load, *configPath, stderr, true)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	return run(ctx, cfg)
}

// parse parses a command's flags. -h prints them and ends the command
// with exit 0; an unknown flag or a stray argument is a usage error.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errHelp
		}
		return usageErr("%v", err)
	}
	if fs.NArg() > 0 {
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
	return engine.RunAll(ctx, cfg, engine.RunOptions{Version: version, Logger: log, Hard: hard, Programs: progs})
}
