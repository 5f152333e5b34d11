package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Modes reported by Server.Mode.
const (
	ModeExternal = "external"
	ModeDocker   = "docker"
	ModeLocal    = "local"
)

// Environment variables read by Start.
const (
	EnvDatabaseURL = "PGSCRIBE_TEST_DATABASE_URL" // external server to use as is
	EnvImage       = "PGSCRIBE_TEST_PG_IMAGE"     // docker image, default DefaultImage
	EnvBinDir      = "PGSCRIBE_PG_BIN"            // directory of initdb, pg_ctl and postgres
	EnvMode        = "PGSCRIBE_TEST_PG_MODE"      // force a mode: docker, local or external
)

// DefaultImage is the Docker image used when PGSCRIBE_TEST_PG_IMAGE is unset.
const DefaultImage = "postgres:16"

// ErrRestartUnsupported is returned by Restart on a server pgtest did not
// start (external mode).
var ErrRestartUnsupported = errors.New("pgtest: server cannot be restarted in external mode")

// readyTimeout bounds a wait for the server to accept connections when the
// caller's context has no earlier deadline.
const readyTimeout = 2 * time.Minute

// Options configure Start. The zero value is valid.
type Options struct {
	// Settings are extra server settings, passed as `-c name=value` (or
	// written to postgresql.conf in local mode). They are added to, and
	// may override, the defaults listed in the package documentation.
	// Ignored in external mode.
	Settings map[string]string
	// Logf, when set, receives progress and diagnostics (container and
	// server logs on failure). It must be safe for concurrent use.
	Logf func(format string, args ...any)
}

// defaultSettings are the settings every server started by pgtest runs with.
var defaultSettings = map[string]string{
	"wal_level":              "logical",
	"max_replication_slots":  "64",
	"max_wal_senders":        "64",
	"track_commit_timestamp": "on",
	"max_connections":        "200",
	"fsync":                  "off",
}

// backend is what differs between the modes: how the server restarts and
// what stopping it removes.
type backend interface {
	restart(ctx context.Context, immediate bool) error
	stop(ctx context.Context) error
}

// Server is a running PostgreSQL. Its methods are safe for concurrent use,
// but Restart breaks every open connection, so tests that restart the
// server must not run in parallel with tests that use it.
type Server struct {
	mode     string
	base     *url.URL // admin URL; DSN replaces its path
	hostPort string
	logf     func(format string, args ...any)
	backend  backend // nil in external mode

	mu      sync.Mutex // serialises Restart and Stop, guards created
	created map[string]bool
	stopped bool
}

// Start starts (or, in external mode, connects to) a PostgreSQL server and
// returns when it accepts connections. ctx bounds the whole start-up,
// including an image pull. The caller must call Stop.
func Start(ctx context.Context, opts Options) (*Server, error) {
	logf := func(format string, args ...any) {
		if opts.Logf != nil {
			opts.Logf("pgtest: "+format, args...)
		}
	}
	settings, err := mergeSettings(opts.Settings)
	if err != nil {
		return nil, err
	}

	mode := strings.TrimSpace(os.Getenv(EnvMode))
	if mode == "" && os.Getenv(EnvDatabaseURL) != "" {
		mode = ModeExternal
	}
	switch mode {
	case ModeExternal:
		if len(opts.Settings) > 0 {
			logf("external server: Options.Settings are not applied (%d given)", len(opts.Settings))
		}
		return startExternal(ctx, logf)
	case ModeLocal:
		return startLocal(ctx, settings, logf)
	case ModeDocker:
		return startDocker(ctx, settings, logf)
	case "":
	default:
		return nil, fmt.Errorf("pgtest: %s=%q: want docker, local or external", EnvMode, mode)
	}

	pool, err := dockerPool(ctx)
	if err != nil {
		logf("no Docker engine (%v); using local PostgreSQL binaries", err)
		return startLocal(ctx, settings, logf)
	}
	s, err := startDockerWith(ctx, pool, settings, logf)
	if errors.Is(err, errImageUnavailable) {
		logf("%v; using local PostgreSQL binaries instead (run `make pg-image` to build an image)", err)
		return startLocal(ctx, settings, logf)
	}
	return s, err
}

func newServer(mode string, base *url.URL, logf func(string, ...any), b backend) (*Server, error) {
	cfg, err := pgconn.ParseConfig(base.String())
	if err != nil {
		return nil, fmt.Errorf("pgtest: parse server url: %w", err)
	}
	return &Server{
		mode:     mode,
		base:     base,
		hostPort: net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))),
		logf:     logf,
		backend:  b,
		created:  map[string]bool{},
	}, nil
}

// serverURL is the URL of a server pgtest started: no TLS, the postgres
// superuser, the maintenance database.
func serverURL(host string, port int, password string) *url.URL {
	u := &url.URL{
		Scheme:   "postgres",
		User:     url.User("postgres"),
		Host:     net.JoinHostPort(host, strconv.Itoa(port)),
		Path:     "/postgres",
		RawQuery: "sslmode=disable",
	}
	if password != "" {
		u.User = url.UserPassword("postgres", password)
	}
	return u
}

// Mode reports where the server comes from: "external", "docker" or "local".
func (s *Server) Mode() string { return s.mode }

// DSN returns a postgres:// URL for database dbname on the server. For
// servers pgtest started it has sslmode=disable; in external mode it keeps
// the query parameters of PGSCRIBE_TEST_DATABASE_URL.
func (s *Server) DSN(dbname string) string {
	u := *s.base
	u.Path = "/" + dbname
	u.RawPath = ""
	return u.String()
}

// AdminDSN returns the URL of the maintenance database: "postgres" on
// servers pgtest started, the database of PGSCRIBE_TEST_DATABASE_URL in
// external mode.
func (s *Server) AdminDSN() string { return s.base.String() }

// HostPort returns the host:port the DSNs point at, for NewProxy.
func (s *Server) HostPort() string { return s.hostPort }

// CanRestart reports whether Restart works: false in external mode.
func (s *Server) CanRestart() bool { return s.backend != nil }

// Restart stops the server and starts it again on the same host and port,
// returning when it accepts connections. immediate=true is a crash: the
// postmaster gets SIGQUIT (pg_ctl -m immediate), open transactions are lost
// and the next start runs crash recovery; committed data survives. Otherwise
// it is a fast shutdown (SIGINT). Every open connection breaks either way.
func (s *Server) Restart(ctx context.Context, immediate bool) error {
	if s.backend == nil {
		return ErrRestartUnsupported
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return errors.New("pgtest: restart of a stopped server")
	}
	start := time.Now()
	if err := s.backend.restart(ctx, immediate); err != nil {
		return fmt.Errorf("pgtest: restart: %w", err)
	}
	s.logf("%s server restarted (immediate=%t) in %s", s.mode, immediate, time.Since(start).Round(time.Millisecond))
	return nil
}

// Stop stops the server and removes everything Start created: the
// container, or the temporary cluster. In external mode it drops the
// databases CreateDatabase made that are still there. Stop is idempotent.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	if s.backend != nil {
		return s.backend.stop(ctx)
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(s.created)) {
		if err := s.dropDatabase(ctx, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CreateDatabase creates an empty database (from template1) and returns its
// DSN.
func (s *Server) CreateDatabase(ctx context.Context, name string) (string, error) {
	if err := checkDatabaseName(name); err != nil {
		return "", err
	}
	err := s.withAdmin(ctx, func(conn *pgx.Conn) error {
		_, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
		return err
	})
	if err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	s.mu.Lock()
	s.created[name] = true
	s.mu.Unlock()
	return s.DSN(name), nil
}

// DropDatabase drops a database and everything that keeps DROP DATABASE
// from working: it refuses new connections to it, terminates its backends
// (replication connections included) and drops its replication slots, then
// runs DROP DATABASE ... WITH (FORCE). A database that does not exist is not
// an error.
func (s *Server) DropDatabase(ctx context.Context, name string) error {
	s.mu.Lock()
	delete(s.created, name)
	s.mu.Unlock()
	return s.dropDatabase(ctx, name)
}

func (s *Server) dropDatabase(ctx context.Context, name string) error {
	err := s.withAdmin(ctx, func(conn *pgx.Conn) error {
		var exists bool
		err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists)
		if err != nil || !exists {
			return err
		}
		ident := pgx.Identifier{name}.Sanitize()
		// Refuse new connections first, so that a client reconnecting with
		// backoff cannot recreate a slot between the drop of the slots and
		// the drop of the database.
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+ident+" ALLOW_CONNECTIONS false"); err != nil {
			return err
		}
		if err := dropSlots(ctx, conn, name); err != nil {
			return err
		}
		_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)")
		return err
	})
	if err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

// dropSlots terminates the backends of database name and drops its
// replication slots. DROP DATABASE fails while a logical slot exists in the
// database, and a slot cannot be dropped while a walsender uses it; the
// walsender needs a moment to exit after pg_terminate_backend, hence the
// loop.
func dropSlots(ctx context.Context, conn *pgx.Conn, name string) error {
	const terminate = `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = $1 AND pid <> pg_backend_pid()`
	const drop = `SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots
		WHERE database = $1 AND NOT active`
	const left = `SELECT count(*) FROM pg_replication_slots WHERE database = $1`
	return poll(ctx, 30*time.Second, 50*time.Millisecond, func() (bool, error) {
		if _, err := conn.Exec(ctx, terminate, name); err != nil {
			return false, err
		}
		if _, err := conn.Exec(ctx, drop, name); err != nil {
			// A walsender may activate the slot between the two
			// statements: try again.
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55006" { // object_in_use
				return false, nil
			}
			return false, err
		}
		var n int
		if err := conn.QueryRow(ctx, left, name).Scan(&n); err != nil {
			return false, err
		}
		return n == 0, nil
	})
}

// withAdmin runs f on a fresh connection to the maintenance database.
func (s *Server) withAdmin(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := pgx.Connect(ctx, s.AdminDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return f(conn)
}

// waitReady returns when the server at dsn accepts connections and answers
// a query. alive, when set, is called between attempts and stops the wait
// with its error (the container exited, say). The wait ends with the
// earlier of ctx's deadline and readyTimeout.
func waitReady(ctx context.Context, dsn string, alive func(context.Context) error) error {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.ConnectTimeout = 5 * time.Second
	var last error
	err = poll(ctx, readyTimeout, 100*time.Millisecond, func() (bool, error) {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err == nil {
			err = conn.Ping(ctx)
			conn.Close(context.WithoutCancel(ctx))
			if err == nil {
				return true, nil
			}
		}
		last = err
		if alive != nil {
			if err := alive(ctx); err != nil {
				return false, err
			}
		}
		return false, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last attempt: %v)", err, last)
	}
	return err
}

// poll calls f every interval until it reports done, returns an error, or
// timeout (or ctx) expires.
func poll(ctx context.Context, timeout, interval time.Duration, f func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		done, err := f()
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("gave up waiting: %w", context.Cause(ctx))
		case <-t.C:
		}
	}
}

var settingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.]*$`)

// mergeSettings returns the default settings overridden by extra.
func mergeSettings(extra map[string]string) (map[string]string, error) {
	out := maps.Clone(defaultSettings)
	for k, v := range extra {
		if !settingName.MatchString(k) {
			return nil, fmt.Errorf("pgtest: invalid setting name %q", k)
		}
		out[k] = v
	}
	return out, nil
}

// settingArgs renders settings as postgres command-line arguments, sorted
// by name so that the command line is stable.
func settingArgs(settings map[string]string) []string {
	var args []string
	for _, k := range slices.Sorted(maps.Keys(settings)) {
		args = append(args, "-c", k+"="+settings[k])
	}
	return args
}

// checkDatabaseName rejects names PostgreSQL would truncate or refuse.
func checkDatabaseName(name string) error {
	if name == "" || len(name) > 63 || strings.ContainsRune(name, 0) {
		return fmt.Errorf("pgtest: invalid database name %q (1 to 63 bytes)", name)
	}
	return nil
}

// randomHex returns n random bytes, hex encoded.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago. The
// caller must cope with losing it to another process before binding it.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
