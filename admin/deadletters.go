package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/deadletter"
)

// This file implements `pgscribe deadletters list|stats`: read-only views
// of the dead_letters table on the target database.

// messageWidth is how many characters of an error message the list table
// shows: the end of it, because messages read "context: context: cause"
// and the context (projection, rule, event) has columns of its own. -json
// shows all of it.
const messageWidth = 60

// ListDeadLetters writes the dead letters matching f, in id order, at most
// f.Limit of them after f.AfterID. As text it writes a table and, when the
// page is full, how to ask for the next one; with asJSON one JSON object per
// line (JSON lines) with the event's data and metadata, so a script pages
// with the last id it read.
func ListDeadLetters(ctx context.Context, cfg *config.Config, f deadletter.Filter, asJSON bool, w io.Writer) error {
	text := func(w io.Writer, rows []deadletter.Row) error { return writeDeadLettersText(w, rows, f.Limit) }
	return showDeadLetters(ctx, cfg, f, deadletter.List, asJSON, writeDeadLettersJSON, text, w)
}

// showDeadLetters reads what read gives for f on the target and writes it
// with asJSON or asText: the read-only deadletters subcommands.
func showDeadLetters[T any](ctx context.Context, cfg *config.Config, f deadletter.Filter,
	read func(context.Context, deadletter.Querier, string, deadletter.Filter) (T, error),
	jsonOut bool, asJSON, asText func(io.Writer, T) error, w io.Writer,
) error {
	return withTarget(ctx, cfg, func(conn *pgx.Conn, schema string) error {
		v, err := read(ctx, conn, schema, f)
		if err != nil {
			return err
		}
		if jsonOut {
			return asJSON(w, v)
		}
		return asText(w, v)
	})
}

// withTarget runs fn on a connection to the migrated target database (see
// openTarget), closed when fn returns, with the engine schema.
func withTarget(ctx context.Context, cfg *config.Config, fn func(conn *pgx.Conn, schema string) error) error {
	conn, err := openTarget(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return fn(conn, cfg.Engine.Schema)
}

// openTarget connects to the target database, whose engine schema must be
// migrated.
func openTarget(ctx context.Context, cfg *config.Config) (*pgx.Conn, error) {
	conn, err := connectCLI(ctx, cfg.TargetURL())
	if err != nil {
		return nil, fmt.Errorf("connect target: %w", err)
	}
	if err := requireMigrated(ctx, conn, cfg.Engine.Schema); err != nil {
		conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return conn, nil
}

// DeadLetterJSON is one line of `deadletters list -json`: a dead letter as
// scripts read it. Its field names are a contract (integration/cli_test.go
// checks them).
type DeadLetterJSON struct {
	ID             int64           `json:"id"`
	Projection     string          `json:"projection"`
	Version        int64           `json:"version"`
	Position       int64           `json:"position"`
	EventID        string          `json:"event_id"`
	StreamID       string          `json:"stream_id"`
	StreamPosition int64           `json:"stream_position"`
	EventType      string          `json:"event_type"`
	ErrorKind      string          `json:"error_kind"`
	ErrorMessage   string          `json:"error_message"`
	EventData      json.RawMessage `json:"event_data"`
	EventMetadata  json.RawMessage `json:"event_metadata"`
	OccurredAt     *time.Time      `json:"occurred_at"`
	DeadLetteredAt time.Time       `json:"dead_lettered_at"`
}

func writeDeadLettersJSON(w io.Writer, rows []deadletter.Row) error {
	enc := json.NewEncoder(w)
	for _, r := range rows {
		j := DeadLetterJSON{
			ID: r.ID, Projection: r.Projection, Version: r.Version, Position: r.Position,
			EventID: r.EventID, StreamID: r.StreamID, StreamPosition: r.StreamPosition, EventType: r.EventType,
			ErrorKind: r.ErrorKind, ErrorMessage: r.ErrorMessage,
			EventData: json.RawMessage(r.EventData), EventMetadata: json.RawMessage(r.EventMetadata),
			DeadLetteredAt: r.DeadLetteredAt,
		}
		if !r.OccurredAt.IsZero() {
			t := r.OccurredAt
			j.OccurredAt = &t
		}
		if err := enc.Encode(j); err != nil {
			return fmt.Errorf("dead letter %d: %w", r.ID, err)
		}
	}
	return nil
}

func writeDeadLettersText(w io.Writer, rows []deadletter.Row, limit int) error {
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "no dead letters")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPROJECTION\tPOSITION\tSTREAM\tTYPE\tERROR KIND\tMESSAGE\tDEAD-LETTERED AT")
	for _, r := range rows {
		fmt.Fprintf(tw, "%d\t%s v%d\t%d\t%s/%d\t%s\t%s\t%s\t%s\n", r.ID, cell(r.Projection), r.Version, r.Position,
			cell(r.StreamID), r.StreamPosition, cell(r.EventType), cell(r.ErrorKind),
			tail(cell(r.ErrorMessage), messageWidth), r.DeadLetteredAt.UTC().Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if limit <= 0 {
		limit = deadletter.DefaultLimit
	}
	if len(rows) >= min(limit, deadletter.MaxLimit) {
		_, err := fmt.Fprintf(w, "more may follow: add -after %d for the next page\n", rows[len(rows)-1].ID)
		return err
	}
	return nil
}

// cell makes a value safe for one table cell: control characters (tabs,
// newlines) become spaces.
func cell(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
}

// tail keeps the last width characters of s, starting with "…" when it cut.
func tail(s string, width int) string {
	rs := []rune(s)
	if len(rs) <= width {
		return s
	}
	return "…" + string(rs[len(rs)-width+1:])
}

// DeadLetterStats writes a summary of the dead letters matching f (AfterID
// and Limit are ignored): the total, the oldest and newest, and counts by
// error kind and by projection version.
func DeadLetterStats(ctx context.Context, cfg *config.Config, f deadletter.Filter, asJSON bool, w io.Writer) error {
	return showDeadLetters(ctx, cfg, f, deadletter.GetStats, asJSON, writeStatsJSON, writeStatsText, w)
}

// statsJSON is the -json form of the stats: the lists are never null.
type statsJSON struct {
	Total        int64           `json:"total"`
	Oldest       *time.Time      `json:"oldest"`
	Newest       *time.Time      `json:"newest"`
	ByErrorKind  []kindCountJSON `json:"by_error_kind"`
	ByProjection []projCountJSON `json:"by_projection"`
}

type kindCountJSON struct {
	ErrorKind string `json:"error_kind"`
	Count     int64  `json:"count"`
}

type projCountJSON struct {
	Projection string `json:"projection"`
	Version    int64  `json:"version"`
	Count      int64  `json:"count"`
}

func writeStatsJSON(w io.Writer, st deadletter.Stats) error {
	j := statsJSON{Total: st.Total, Oldest: st.Oldest, Newest: st.Newest,
		ByErrorKind: []kindCountJSON{}, ByProjection: []projCountJSON{}}
	for _, k := range st.ByKind {
		j.ByErrorKind = append(j.ByErrorKind, kindCountJSON{ErrorKind: k.Kind, Count: k.Count})
	}
	for _, p := range st.ByProjection {
		j.ByProjection = append(j.ByProjection, projCountJSON{Projection: p.Projection, Version: p.Version, Count: p.Count})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(j)
}

func writeStatsText(w io.Writer, st deadletter.Stats) error {
	if st.Total == 0 {
		_, err := fmt.Fprintln(w, "no dead letters")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "total\t%d\n", st.Total)
	if st.Oldest != nil && st.Newest != nil {
		fmt.Fprintf(tw, "oldest\t%s\n", st.Oldest.UTC().Format(time.RFC3339))
		fmt.Fprintf(tw, "newest\t%s\n", st.Newest.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "ERROR KIND\tCOUNT")
	for _, k := range st.ByKind {
		fmt.Fprintf(tw, "%s\t%d\n", cell(k.Kind), k.Count)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "PROJECTION\tCOUNT")
	for _, p := range st.ByProjection {
		fmt.Fprintf(tw, "%s v%d\t%d\n", cell(p.Projection), p.Version, p.Count)
	}
	return tw.Flush()
}
