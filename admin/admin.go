package admin

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/migrations"
)

// Migrate creates or upgrades the engine schema on the target database and
// the publication (and, with eventsTable, the reference events table) on
// the source. Idempotent; safe to run from several nodes at once.
func Migrate(ctx context.Context, cfg *config.Config, eventsTable bool, log *slog.Logger) error {
	target, err := pgx.Connect(ctx, cfg.TargetURL())
	if err != nil {
		return fmt.Errorf("connect target: %w", err)
	}
	defer target.Close(context.WithoutCancel(ctx))
	applied, err := migrations.Apply(ctx, target, cfg.Engine.Schema)
	if err != nil {
		return err
	}
	log.Info("engine schema", "schema", cfg.Engine.Schema, "applied", applied, "version", migrations.Latest())

	source := target
	if cfg.TargetURL() != cfg.Database.URL {
		source, err = pgx.Connect(ctx, cfg.Database.URL)
		if err != nil {
			return fmt.Errorf("connect source: %w", err)
		}
		defer source.Close(context.WithoutCancel(ctx))
	}
	if eventsTable {
		if err := migrations.CreateEventsTable(ctx, source, cfg.Source.Table); err != nil {
			return err
		}
		log.Info("events table ready", "table", cfg.Source.Table)
	}
	if err := migrations.EnsurePublication(ctx, source, cfg.Source.Publication, cfg.Source.Table); err != nil {
		return err
	}
	log.Info("publication ready", "publication", cfg.Source.Publication, "table", cfg.Source.Table)
	return nil
}
