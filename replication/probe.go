package replication

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// ErrNotPublished is returned by Probe when the publication exists but
// does not cover the events table.
var ErrNotPublished = errors.New("publication does not cover the events table")

// Probe checks what reading the source needs, cheaply and without side
// effects, the way the engine uses it: a regular connection (a failed
// password, 28P01), a replication connection (a role without REPLICATION,
// 42501), the publication (42704 when missing, ErrNotPublished when it
// does not cover the table) and a read of every mapped column (42501
// without SELECT, 42703 for a column dropped or renamed). The first
// failure is returned as the server reported it.
//
// On success it returns a fingerprint of what decoding depends on: the
// publication's identity and the table's columns with their types. A
// halted projection whose cause the checks cannot see (a slot whose
// history cannot be decoded, a value the decoder cannot read) resumes
// once the fingerprint changes.
func Probe(ctx context.Context, src Source) (fingerprint string, err error) {
	conn, err := pgx.Connect(ctx, src.URL)
	if err != nil {
		return "", fmt.Errorf("connect source: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	repl, err := ConnectReplication(ctx, src.URL)
	if err != nil {
		return "", err
	}
	repl.Close(context.WithoutCancel(ctx))

	var pubOID uint32
	var covered bool
	// pg_get_publication_tables raises 42704 for a missing publication; it
	// lists leaf partitions or the root depending on
	// publish_via_partition_root, so coverage looks at the table's tree
	// (which pg_partition_tree leaves empty for a table not partitioned).
	err = conn.QueryRow(ctx, `SELECT p.oid, EXISTS (SELECT 1 FROM pg_get_publication_tables($1::text) AS t
		WHERE t.relid = $2::regclass OR t.relid IN (SELECT relid FROM pg_partition_tree($2::regclass)))
		FROM pg_publication p WHERE p.pubname = $1`, src.Publication, src.tableIdent()).Scan(&pubOID, &covered)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("probe publication %s: %w", src.Publication, err)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// Ask the server, for its own error (42704) and wording.
		_, err = conn.Exec(ctx, `SELECT FROM pg_get_publication_tables($1::text)`, src.Publication)
		if err == nil {
			err = pgx.ErrNoRows
		}
		return "", fmt.Errorf("probe publication %s: %w", src.Publication, err)
	}
	if !covered {
		return "", fmt.Errorf("probe publication %s: %w (%s)", src.Publication, ErrNotPublished, src.Table)
	}

	c := src.Columns
	var cols []string
	for _, n := range []string{c.Position, c.ID, c.StreamID, c.StreamPosition, c.Type, c.Data, c.Metadata, c.OccurredAt} {
		if n != "" {
			cols = append(cols, pgx.Identifier{n}.Sanitize())
		}
	}
	if _, err := conn.Exec(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM "+src.tableIdent()+" LIMIT 0"); err != nil {
		return "", fmt.Errorf("probe events table %s: %w", src.Table, err)
	}
	var columns string
	if err := conn.QueryRow(ctx, `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`, src.tableIdent()).Scan(&columns); err != nil {
		return "", fmt.Errorf("probe events table %s: %w", src.Table, err)
	}
	return fmt.Sprintf("publication %d; %s (%s)", pubOID, src.Table, columns), nil
}
