package migrations

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ReadModel is a projection version's read-model DDL: the SQL file the
// configuration names (ddl) and the schema it runs in (schema).
type ReadModel struct {
	Projection string
	Version    int64
	Schema     string // the version's schema; created if missing
	File       string // path, recorded for operators
	SQL        string // the file's contents
}

// ReadModelResult says what ApplyReadModel did.
type ReadModelResult int

// The outcomes of ApplyReadModel.
const (
	// ReadModelApplied: the DDL ran now.
	ReadModelApplied ReadModelResult = iota
	// ReadModelUnchanged: the same DDL ran before; nothing ran.
	ReadModelUnchanged
	// ReadModelChanged: different DDL ran before for this version; nothing
	// ran. A version's read model is built once: a changed file is a new
	// version, or a change the operator applies by hand.
	ReadModelChanged
)

// ApplyReadModel runs a version's read-model DDL once, in one transaction
// under the engine schema's migration lock: it creates the schema if
// needed, sets search_path to that schema alone (SET LOCAL, so unqualified
// names in the file create and find objects there and nowhere else:
// pgscribe never guesses a schema), runs the file and records its SHA-256
// in the engine schema's read_models table. Running it again with the
// same file does nothing (ReadModelUnchanged), so the DDL need not be
// idempotent; a different file is reported (ReadModelChanged) and not run.
// On error nothing is applied.
func ApplyReadModel(ctx context.Context, conn *pgx.Conn, engineSchema string, rm ReadModel) (ReadModelResult, error) {
	if rm.Schema == "" {
		return 0, errors.New("read-model ddl needs the version's schema")
	}
	sum := sha256.Sum256([]byte(rm.SQL))
	digest := hex.EncodeToString(sum[:])
	table := pgx.Identifier{engineSchema, "read_models"}.Sanitize()
	ident := pgx.Identifier{rm.Schema}.Sanitize()
	result := ReadModelApplied
	err := inLockedTx(ctx, conn, lockEngine, func(tx pgx.Tx) error {
		var prev string
		err := tx.QueryRow(ctx, "SELECT ddl_sha256 FROM "+table+" WHERE projection = $1 AND version = $2",
			rm.Projection, rm.Version).Scan(&prev)
		switch {
		case err == nil && prev == digest:
			result = ReadModelUnchanged
			return nil
		case err == nil:
			result = ReadModelChanged
			return nil
		case !errors.Is(err, pgx.ErrNoRows):
			return fmt.Errorf("read %s: %w", table, err)
		}
		var exists bool
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)", rm.Schema).Scan(&exists); err != nil {
			return fmt.Errorf("look up schema %s: %w", ident, err)
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA "+ident); err != nil {
				return fmt.Errorf("create schema %s: %w", ident, err)
			}
		}
		if _, err := tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", ident); err != nil {
			return fmt.Errorf("set search_path: %w", err)
		}
		if _, err := tx.Exec(ctx, rm.SQL); err != nil {
			return fmt.Errorf("run %s in schema %s: %w", rm.File, ident, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (projection, version, schema_name, ddl_file, ddl_sha256) VALUES ($1, $2, $3, $4, $5)",
			rm.Projection, rm.Version, rm.Schema, rm.File, digest); err != nil {
			return fmt.Errorf("record read-model ddl: %w", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return result, nil
}
