package pgtest

import (
	"context"
	"fmt"
	"net/url"
	"os"

	"github.com/jackc/pgx/v5"
)

// startExternal uses the server of PGSCRIBE_TEST_DATABASE_URL as it is.
func startExternal(ctx context.Context, logf func(string, ...any)) (*Server, error) {
	raw := os.Getenv(EnvDatabaseURL)
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("pgtest: %s must be a postgres:// URL", EnvDatabaseURL)
	}
	s, err := newServer(ModeExternal, u, logf, nil)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, raw)
	if err != nil {
		return nil, fmt.Errorf("pgtest: connect to %s: %w", EnvDatabaseURL, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var walLevel string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&walLevel); err != nil {
		return nil, fmt.Errorf("pgtest: query %s: %w", EnvDatabaseURL, err)
	}
	if walLevel != "logical" {
		logf("warning: external server has wal_level=%s; replication tests need logical", walLevel)
	}
	logf("using external server %s", s.hostPort)
	return s, nil
}
