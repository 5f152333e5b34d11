package event

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Table is a table name from configuration, possibly schema-qualified
// ("t" or "s.t").
type Table string

// Quoted returns the name quoted as an SQL identifier, each part on its
// own ("s"."t"): names from configuration are never interpolated raw.
func (t Table) Quoted() string { return pgx.Identifier(strings.Split(string(t), ".")).Sanitize() }

// Querier is what pgscribe's stores and commands need from a database
// handle: pgx.Tx, *pgx.Conn, *pgxpool.Pool and *pgxpool.Conn satisfy it.
// Pass a batch's transaction to make a write part of the batch.
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// QueryRows runs sql on q and collects its rows with fn; an error of the
// query or of a row says what was read ("what: err").
func QueryRows[T any](ctx context.Context, q interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, what string, fn pgx.RowToFunc[T], sql string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err == nil {
		var out []T
		if out, err = pgx.CollectRows(rows, fn); err == nil {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%s: %w", what, err)
}
