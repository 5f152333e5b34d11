// Command devdb starts a PostgreSQL for the demo and for trying pgscribe by
// hand, with internal/pgtest (Docker when an engine answers, else this
// machine's binaries, or the server of PGSCRIBE_TEST_DATABASE_URL), creates
// a database in it and prints its URL:
//
//	go run ./internal/tools/devdb [-db pgscribe_demo] [-print-env] [-dsn-file path]
//
// stdout gets one line, PGSCRIBE_DATABASE_URL=<dsn> (plus PGHOST, PGPORT,
// PGUSER, PGPASSWORD and PGDATABASE lines with -print-env, for psql), once
// the database is ready; logs go to stderr. devdb then runs until SIGINT or
// SIGTERM and stops the server, removing it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgscribe/pgscribe/internal/pgtest"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("devdb", flag.ContinueOnError)
	db := fs.String("db", "pgscribe_demo", "database to create")
	printEnv := fs.Bool("print-env", false, "also print PGHOST, PGPORT, PGUSER, PGPASSWORD and PGDATABASE lines")
	dsnFile := fs.String("dsn-file", "", "write the database URL to this file once ready (removed on exit)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	srv, err := pgtest.Start(startCtx, pgtest.Options{
		// A demo shows pgscribe as it runs in production: durable commits.
		Settings: map[string]string{"fsync": "on"},
		Logf:     func(format string, args ...any) { log.Info(fmt.Sprintf(format, args...)) },
	})
	cancel()
	if err != nil {
		log.Error("start postgres", "err", err)
		return 1
	}
	code := serve(ctx, log, srv, *db, *printEnv, *dsnFile)

	stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := srv.Stop(stopCtx); err != nil {
		log.Error("stop postgres", "err", err)
		return 1
	}
	return code
}

// serve creates the database, announces it and waits for a signal.
func serve(ctx context.Context, log *slog.Logger, srv *pgtest.Server, db string, printEnv bool, dsnFile string) int {
	dsn, err := srv.CreateDatabase(ctx, db)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database
		// Only an external server can already have it: keep its data.
		log.Info("database exists; using it", "database", db)
		dsn, err = srv.DSN(db), nil
	}
	if err != nil {
		log.Error("create database", "err", err)
		return 1
	}
	if dsnFile != "" {
		// Written aside and renamed, so that a script polling for the file
		// never reads half of it.
		tmp := dsnFile + ".tmp"
		err := os.WriteFile(tmp, []byte(dsn+"\n"), 0o600)
		if err == nil {
			err = os.Rename(tmp, dsnFile)
		}
		if err != nil {
			log.Error("write dsn file", "err", err)
			return 1
		}
		defer os.Remove(dsnFile)
	}
	fmt.Println("PGSCRIBE_DATABASE_URL=" + dsn)
	if printEnv {
		if err := printLibpqEnv(dsn); err != nil {
			log.Error("print env", "err", err)
			return 1
		}
	}
	log.Info("ready; stop with Ctrl-C", "mode", srv.Mode(), "address", srv.HostPort(), "database", db)
	<-ctx.Done()
	log.Info("stopping")
	return 0
}

// printLibpqEnv prints the libpq variables that point psql at dsn.
func printLibpqEnv(dsn string) error {
	u, err := url.Parse(dsn)
	if err != nil {
		return err
	}
	password, _ := u.User.Password()
	fmt.Println("PGHOST=" + u.Hostname())
	fmt.Println("PGPORT=" + u.Port())
	fmt.Println("PGUSER=" + u.User.Username())
	fmt.Println("PGPASSWORD=" + password)
	fmt.Println("PGDATABASE=" + u.Path[1:])
	return nil
}
