package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/pgscribe/pgscribe/admin"
	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/engine"
)

// A command is one entry of the command table. run dispatches on its
// name, help prints its usage in table order, and the doc test
// (doc_test.go) checks docs/cli.md against its name and flags.
type command struct {
	// name is what is typed after pgscribe: "status", "deadletters list".
	name string
	// usage is the command's lines in help: its synopsis, then what it
	// does, indented.
	usage string
	// operands names the arguments that follow the flags ("FIXTURE…");
	// empty when a stray argument is a usage error.
	operands string
	// define declares the command's flags on fs, which already has
	// -config (in c.config), and returns what runs the command once fs
	// has parsed its arguments. Nil for help, which takes no flags.
	define func(fs *flag.FlagSet, c *cmdEnv) func() error
}

// cmdEnv is what a command's run sees besides its own flags.
type cmdEnv struct {
	name           string  // the command's name in the table
	config         *string // -config
	stdout, stderr io.Writer
}

// commands is the command table, in the order help lists it.
var commands = []command{
	{name: "run", usage: `
  pgscribe run [-config FILE]
      Run the configured projections (active/standby) until SIGTERM or SIGINT.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		return func() error {
			cfg, log, progs, err := loadPrograms(*c.config, c.stderr, true)
			if err != nil {
				return err
			}
			return runEngine(cfg, progs, log)
		}
	}},
	{name: "migrate", usage: `
  pgscribe migrate [-config FILE] [-events-table]
      Create or upgrade the engine schema and the publication.
      -events-table also creates the reference events table.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		eventsTable := fs.Bool("events-table", false, "also create the reference events table")
		return func() error {
			// migrate needs no rules: a rule's mistake must not stop it.
			cfg, log, err := loadConfigWith(config.LoadSettings, *c.config, c.stderr, true)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return admin.Migrate(ctx, cfg, *eventsTable, log)
		}
	}},
	{name: "check", usage: `
  pgscribe check [-config FILE] [-offline]
      Validate the configuration and the rules, then the databases: tables,
      columns, inc types, unique indexes for upserts, privileges, wal_level,
      the publication and the engine schema. -offline skips the databases.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		offline := fs.Bool("offline", false, "check the configuration and rules only, not the databases")
		return func() error {
			cfg, _, progs, err := loadPrograms(*c.config, c.stderr, false)
			if err != nil {
				return err
			}
			if *offline || cfg.RequireDatabase() != nil {
				fmt.Fprintf(c.stdout, "%s: ok (%s; databases not checked)\n", cfg.Path, projections(len(cfg.Projections)))
				return nil
			}
			ctx, stop := signalContext()
			defer stop()
			if err := admin.Check(ctx, cfg, progs, c.stdout); err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "%s: ok (%s; databases checked)\n", cfg.Path, projections(len(cfg.Projections)))
			return nil
		}
	}},
	{name: "status", usage: `
  pgscribe status [-config FILE] [-json] [-watch [-interval 2s]]
      Per projection version: state, active node, watermark, lag, backlog,
      WAL retained by the slot, dead letters, backfill progress.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.StatusOptions
		fs.BoolVar(&o.JSON, "json", false, "print JSON")
		fs.BoolVar(&o.Watch, "watch", false, "redraw every -interval, with a progress bar per backfill, until Ctrl-C")
		fs.DurationVar(&o.Interval, "interval", 2*time.Second, "redraw interval of -watch")
		return func() error {
			cfg, _, err := loadConfig(*c.config, c.stderr, true)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			return admin.ShowStatus(ctx, cfg, o, c.stdout)
		}
	}},
	{name: "console", usage: consoleUsage, define: defineConsole},
	{name: "deadletters list", usage: `
  pgscribe deadletters list [-config FILE] [-projection NAME] [-version N]
                            [-stream ID] [-kind KIND] [-after ID] [-limit N] [-json]
      List dead letters by id, -limit (default 100, at most 10000) at a time;
      -after ID gives the next page. -json prints one JSON object a line,
      with the event's data and metadata.
`, define: deadLetters},
	{name: "deadletters stats", usage: `
  pgscribe deadletters stats [-config FILE] [-projection NAME] [-version N]
                             [-stream ID] [-kind KIND] [-json]
      Count dead letters: total, oldest, newest, by error kind, by projection.
`, define: deadLetters},
	{name: "deadletters retry", usage: `
  pgscribe deadletters retry [-config FILE] [-projection NAME -version N]
                             [-id ID]... [-stream ID] [-kind KIND] [-dry-run]
      Ask the active node to apply the selected dead letters again with the
      rules it runs now, per stream in position order; an event that fails
      again stays, with its new reason. Waits for the outcome; queued when no
      engine runs the version. -dry-run prints what the rules would write.
`, define: deadLetters},
	{name: "deadletters skip", usage: `
  pgscribe deadletters skip [-config FILE] [-projection NAME -version N]
                            [-id ID]... [-stream ID] [-kind KIND]
      Like retry, but the active node drops the dead letters (counted as
      skipped) and releases the events their streams parked (on_error = "park")
      in order, without them.
`, define: deadLetters},
	{name: "deadletters discard", usage: `
  pgscribe deadletters discard [-config FILE] [-projection NAME] [-version N]
                               [-id ID]... [-stream ID] [-kind KIND] [-yes]
      Drop the selected dead letters (counted as skipped in their cursors).
      Without -yes it prints what it would drop.
`, define: deadLetters},
	{name: "pause", usage: `
  pgscribe pause -projection NAME -version N [-config FILE] [-reason TEXT]
      The active node stops applying within a second (in-flight batches
      commit first) and keeps its lock and slot; the slot retains WAL while
      paused. Stored in the engine schema: holds across restarts and failovers.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.ControlOptions
		fs.StringVar(&o.Reason, "reason", "", "why, shown by status")
		return versionCommand(fs, c, &o.Projection, &o.Version, config.Load,
			func(ctx context.Context, cfg *config.Config) error { return admin.Pause(ctx, cfg, o, c.stdout) })
	}},
	{name: "resume", usage: `
  pgscribe resume -projection NAME -version N [-config FILE]
      End a pause, or make a halted projection's active node retry now.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.ControlOptions
		return versionCommand(fs, c, &o.Projection, &o.Version, config.Load,
			func(ctx context.Context, cfg *config.Config) error { return admin.Resume(ctx, cfg, o, c.stdout) })
	}},
	{name: "reset", usage: `
  pgscribe reset -projection NAME -version N [-config FILE] [-yes] [-dead-letters]
      Drop a projection version's slot, cursors and watermark so that its next
      run rebuilds it from the events table. Read-model tables are never
      touched; dead letters only with -dead-letters. Without -yes it prints
      what it would do. Refused while an engine runs the version.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.ResetOptions
		fs.BoolVar(&o.Yes, "yes", false, "reset; without it, only print what would be reset")
		fs.BoolVar(&o.DeadLetters, "dead-letters", false, "also delete the version's dead letters")
		return versionCommand(fs, c, &o.Projection, &o.Version, config.Load,
			func(ctx context.Context, cfg *config.Config) error { return admin.Reset(ctx, cfg, o, c.stdout) })
	}},
	{name: "test", operands: "FIXTURE…", usage: `
  pgscribe test [-config FILE] [-database] FIXTURE…
      Run rule fixtures (TOML: events and the intents, skips or dead letters
      each must produce) through the configured rules, with no engine.
      -database also applies them in a throwaway schema of the target
      database and checks the rows the fixtures' [[table]] entries list.
      Exit 1 when an expectation fails, 2 on a bad fixture.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		database := fs.Bool("database", false, "also apply the events in a throwaway schema of the target database and check [[table]] rows")
		return func() error {
			if fs.NArg() == 0 {
				return usageErr("test needs at least one FIXTURE file")
			}
			cfg, _, err := loadConfig(*c.config, c.stderr, *database)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			err = admin.Test(ctx, cfg, fs.Args(), admin.TestOptions{Database: *database}, c.stdout)
			var fe *admin.FixtureError
			if errors.As(err, &fe) {
				return &exitError{code: 2, err: err}
			}
			return err
		}
	}},
	{name: "verify", usage: `
  pgscribe verify -projection NAME -version N [-config FILE] [-stream ID]… [-limit N] [-json]
      Rebuild a projection version from the events its cursors have
      accounted for, in a scratch schema, and diff it with the live read
      model in PostgreSQL, while the engine keeps running. Exit 1 on drift.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.VerifyOptions
		fs.Func("stream", "only this stream `id` (repeatable): rebuild its events, compare the rows only such streams write", func(s string) error {
			o.Streams = append(o.Streams, s)
			return nil
		})
		fs.IntVar(&o.Limit, "limit", 100, "print at most `n` drifted rows per table (all are counted)")
		fs.BoolVar(&o.JSON, "json", false, "print the result as one JSON object (progress still goes to stderr)")
		fs.DurationVar(&o.ProgressEvery, "progress", 5*time.Second, "report the rebuild's progress on stderr this often")
		verify := versionCommand(fs, c, &o.Projection, &o.Version, config.Load,
			func(ctx context.Context, cfg *config.Config) error {
				return admin.Verify(ctx, cfg, o, c.stdout, c.stderr)
			})
		return func() error {
			// Verify's memory is the events in flight: a soft limit keeps
			// the garbage collector ahead of them (GOMEMLIMIT overrides).
			if os.Getenv("GOMEMLIMIT") == "" {
				debug.SetMemoryLimit(admin.VerifyMemoryLimit)
			}
			err := verify()
			if errors.Is(err, admin.ErrVerifyUsage) {
				return &exitError{code: 2, err: err}
			}
			return err
		}
	}},
	{name: "promote", usage: `
  pgscribe promote -projection NAME -version N [-config FILE] [-max-lag 10s]
                   [-timeout 1m] [-force]
      Serve this version: in one transaction, point every view <serve>.<table>
      at the version's <schema>.<table> and record it as served. Refused
      unless the version is live, lags at most -max-lag and is not halted;
      -force overrides and says what it overrode.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.PromoteOptions
		fs.DurationVar(&o.MaxLag, "max-lag", admin.DefaultMaxLag, "largest lag the version may have")
		fs.DurationVar(&o.Timeout, "timeout", admin.DefaultPromoteTimeout, "how long to retry while readers' transactions hold the views")
		fs.BoolVar(&o.Force, "force", false, "promote even if the version is not live, lags or is halted")
		return versionCommand(fs, c, &o.Projection, &o.Version, config.Load,
			func(ctx context.Context, cfg *config.Config) error { return admin.Promote(ctx, cfg, o, c.stdout) })
	}},
	{name: "retire", usage: `
  pgscribe retire -projection NAME -version N [-config FILE] [-drop-schema]
      Remove a version that no longer serves: its slot, cursors, watermark,
      dead letters and lease, and with -drop-schema its schema. Refused for
      the served version and while an engine runs the version.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.RetireOptions
		fs.BoolVar(&o.DropSchema, "drop-schema", false, "also drop the version's schema and its tables")
		// retire needs no rules: an old version may have left the file.
		return versionCommand(fs, c, &o.Projection, &o.Version, config.LoadSettings,
			func(ctx context.Context, cfg *config.Config) error { return admin.Retire(ctx, cfg, o, c.stdout) })
	}},
	{name: "wait", usage: `
  pgscribe wait -projection NAME -version N (-caught-up | -lsn LSN | -stream ID -position P)
                [-config FILE] [-timeout 30s]
      Wait until the projection version has accounted for every source
      transaction committed before the command started (-caught-up) or at
      or before LSN, or for that event of a stream; a progress line every
      second on stderr. Exit 0 when reached, 1 on timeout.
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		var o admin.WaitOptions
		fs.StringVar(&o.Projection, "projection", "", "projection `name` (required)")
		fs.Int64Var(&o.Version, "version", 0, "projection `version` (required)")
		fs.BoolVar(&o.CaughtUp, "caught-up", false, "wait for every transaction committed before the command started")
		fs.StringVar(&o.LSN, "lsn", "", "wait for every transaction committed at or before this source `LSN`")
		fs.StringVar(&o.Stream, "stream", "", "wait for an event of this stream `id` (with -position)")
		fs.Int64Var(&o.Position, "position", 0, "the event's stream `position` (with -stream)")
		fs.DurationVar(&o.Timeout, "timeout", 30*time.Second, "give up after this long (exit 1)")
		return func() error {
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
			cfg, _, err := loadConfig(*c.config, c.stderr, true)
			if err != nil {
				return err
			}
			ctx, stop := signalContext()
			defer stop()
			o.Progress = c.stderr
			return admin.Wait(ctx, cfg, o, c.stdout)
		}
	}},
	{name: "version", usage: `
  pgscribe version
`, define: func(fs *flag.FlagSet, c *cmdEnv) func() error {
		return func() error {
			writeVersion(c.stdout)
			return nil
		}
	}},
	{name: "help", usage: `
  pgscribe help
`},
}

// helpAliases are the other spellings of help.
var helpAliases = []string{"-h", "-help", "--help"}

const usageHead = `pgscribe keeps read-model tables up to date from a PostgreSQL events table.

Usage:
`

const usageTail = `
The config path is -config, else $PGSCRIBE_CONFIG, else ./pgscribe.toml.
PGSCRIBE_DATABASE_URL overrides [database] url; libpq variables (PGHOST …)
fill in what the URL leaves out.

Exit codes: 0 ok; 1 runtime failure (a database that cannot be reached, a
reset or retire refused because an engine runs the projection, a promote
or retire refused by the version's state); 2 usage or
configuration error, problems found by check, reset without -yes.
`

// usage is what help prints: every command of the table, in its order.
var usage = func() string {
	var b strings.Builder
	b.WriteString(usageHead)
	for _, c := range commands {
		b.WriteString(strings.TrimPrefix(c.usage, "\n"))
	}
	b.WriteString(usageTail)
	return b.String()
}()

// lookup returns the command named name, or nil.
func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

// subcommands returns the subcommands of group ("deadletters"), in table
// order: "list", "stats", …
func subcommands(group string) []string {
	var subs []string
	for _, c := range commands {
		if sub, ok := strings.CutPrefix(c.name, group+" "); ok {
			subs = append(subs, sub)
		}
	}
	return subs
}

// newFlagSet is the flag set of command c, with -config and c's own flags,
// and the function that runs c once the flag set has parsed.
func newFlagSet(c *command, stdout, stderr io.Writer) (*flag.FlagSet, func() error) {
	fs := flag.NewFlagSet("pgscribe "+c.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	env := &cmdEnv{name: c.name, stdout: stdout, stderr: stderr}
	env.config = fs.String("config", "", "configuration `file` (default $PGSCRIBE_CONFIG, else ./pgscribe.toml)")
	return fs, c.define(fs, env)
}

// deadLetters defines `deadletters list|stats|retry|skip|discard`: the
// filter flags they share and each one's own.
func deadLetters(fs *flag.FlagSet, c *cmdEnv) func() error {
	_, sub, _ := strings.Cut(c.name, " ")
	var f deadletter.Filter
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
	return func() error {
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
		cfg, _, err := loadConfig(*c.config, c.stderr, true)
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		switch sub {
		case "list":
			return admin.ListDeadLetters(ctx, cfg, f, *asJSON, c.stdout)
		case "retry", "skip":
			progs, err := engine.Compile(cfg)
			if err != nil {
				return &exitError{code: 2, err: err}
			}
			o := admin.RetryOptions{Filter: f, Skip: sub == "skip", Programs: progs}
			if dryRun != nil {
				o.DryRun = *dryRun
			}
			return admin.RetryDeadLetters(ctx, cfg, o, c.stdout)
		case "discard":
			return admin.DiscardDeadLetters(ctx, cfg, admin.DiscardOptions{Filter: f, Yes: *yes}, c.stdout)
		}
		return admin.DeadLetterStats(ctx, cfg, f, *asJSON, c.stdout)
	}
}

// versionCommand defines a command that acts on one projection version:
// it adds -projection and -version to the command's own flags and returns
// a run that refuses the command when either is missing, loads the
// configuration with load (as loadConfigWith; it must name a database)
// and calls act with it and a context that SIGINT or SIGTERM cancel.
func versionCommand(fs *flag.FlagSet, c *cmdEnv, projection *string, version *int64,
	load func(string) (*config.Config, error), act func(context.Context, *config.Config) error) func() error {
	fs.StringVar(projection, "projection", "", "projection `name` (required)")
	fs.Int64Var(version, "version", 0, "projection `version` (required)")
	return func() error {
		if *projection == "" || *version < 1 {
			return usageErr("%s needs -projection NAME and -version N (at least 1)", c.name)
		}
		cfg, _, err := loadConfigWith(load, *c.config, c.stderr, true)
		if err != nil {
			return err
		}
		ctx, stop := signalContext()
		defer stop()
		return act(ctx, cfg)
	}
}
