package admin

import (
	"context"
	"fmt"
	"log/slog"
	"os"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/migrations"
)

// Migrate creates or upgrades the engine schema on the target database,
// runs each configured version's read-model DDL (once per version) in its
// schema, and creates the publication (and, with eventsTable, the reference
// events table) on the source. Idempotent; safe to run from several nodes
// at once.
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
	if err := migrateReadModels(ctx, cfg, target, log); err != nil {
		return err
	}

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

// migrateReadModels runs the read-model DDL file of every configured
// version that names one (ddl), in the version's schema; see
// migrations.ApplyReadModel.
func migrateReadModels(ctx context.Context, cfg *config.Config, target *pgx.Conn, log *slog.Logger) error {
	for _, spec := range cfg.Projections {
		if spec.DDL == "" {
			continue
		}
		sql, err := os.ReadFile(spec.DDL)
		if err != nil {
			return fmt.Errorf("read-model ddl of %s v%d: %w", spec.Name, spec.Version, err)
		}
		res, err := migrations.ApplyReadModel(ctx, target, cfg.Engine.Schema, migrations.ReadModel{
			Projection: spec.Name, Version: spec.Version, Schema: spec.Schema, File: spec.DDL, SQL: string(sql)})
		if err != nil {
			return fmt.Errorf("read-model ddl of %s v%d: %w", spec.Name, spec.Version, err)
		}
		attrs := []any{"projection", spec.Name, "version", spec.Version, "schema", spec.Schema, "ddl", spec.DDL}
		switch res {
		case migrations.ReadModelApplied:
			log.Info("read-model ddl applied", attrs...)
		case migrations.ReadModelUnchanged:
			log.Info("read-model ddl already applied", attrs...)
		case migrations.ReadModelChanged:
			log.Warn("read-model ddl changed since it was applied; not run again: apply the change by hand, or build a new version", attrs...)
		}
	}
	return nil
}
