package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgscribe/pgscribe/config"
	"github.com/pgscribe/pgscribe/control"
	"github.com/pgscribe/pgscribe/cursor"
	"github.com/pgscribe/pgscribe/deadletter"
	"github.com/pgscribe/pgscribe/engine"
	"github.com/pgscribe/pgscribe/event"
	"github.com/pgscribe/pgscribe/lag"
	"github.com/pgscribe/pgscribe/leader"
	"github.com/pgscribe/pgscribe/migrations"
	"github.com/pgscribe/pgscribe/sqlstate"
)

// This file implements `pgscribe status`. It reads everything from the
// databases, never from a running engine, so it works on any host and with
// no engine running at all.
//
// How the state of a projection version is derived:
//
//   - stopped: no backend holds the version's advisory lock on the target
//     database. Nothing runs it: never started, shut down, killed, or
//     between two restarts of its pipeline.
//   - halted: the lock is held and the lease row records a halt: the active
//     node halted the projection on a structural failure and keeps the lock
//     (so no standby takes over only to halt the same way) until it is
//     restarted; halt_reason says why.
//   - backfilling: the lock is held and the watermark row is missing or in
//     phase "backfilling".
//   - live: the lock is held, the phase is "live" and a walsender streams the
//     slot (pg_replication_slots.active_pid is set).
//   - paused: the lock is held and an operator paused the version
//     (`pgscribe pause`, the controls table): the active node applies
//     nothing and keeps its lock and slot. A halt shows as halted.
//   - starting: the lock is held and the phase is "live" but no walsender
//     streams the slot yet: the active node is opening or reopening its
//     stream. It only lasts long when that node is stuck.
//
// A standby node holds nothing in the database (it polls
// pg_try_advisory_lock every standby_poll), so standby cannot be seen from
// the database either; a projection run by one node and waited for by
// others shows the active node's state.

// StatusReport is what `pgscribe status` prints: one entry per configured
// projection version, in configuration order.
type StatusReport struct {
	CheckedAt time.Time `json:"checked_at"`     // source database clock
	SourceWAL string    `json:"source_wal_lsn"` // current WAL position of the source
	Events    int64     `json:"events"`         // rows in the events table
	// OldestTransactionSeconds is how long the oldest transaction open on
	// an engine session of the source or target server has been open (any
	// node's; 0 when none): lag.OldestTransactionSQL.
	OldestTransactionSeconds float64            `json:"oldest_engine_transaction_seconds"`
	Projections              []ProjectionStatus `json:"projections"`
	// Unconfigured lists the source database's slots named like this
	// configuration's (<slot_prefix>_<name>_v<version>) that no configured
	// projection version uses, typically one left by a version that was
	// bumped: it retains WAL until `pgscribe reset` drops it.
	Unconfigured []UnconfiguredSlot `json:"unconfigured_slots"`
	// UnconfiguredMembers lists the versions that are not configured yet
	// whose watermark is recorded on a group's slot: each holds that slot's
	// WAL back at its watermark until `pgscribe retire` or `reset`.
	UnconfiguredMembers []UnconfiguredMember `json:"unconfigured_members"`
	// Served lists, per projection that `pgscribe promote` promoted, the
	// version its stable names read, configured or not.
	Served []Served `json:"served"`
}

// UnconfiguredSlot is a slot of a projection version that is no longer
// (or not yet) configured.
type UnconfiguredSlot struct {
	Slot             string `json:"slot"`
	Projection       string `json:"projection"`
	Version          int64  `json:"version"`
	Group            string `json:"group,omitempty"` // a group's slot, when Projection is empty
	ActivePID        int32  `json:"active_pid,omitempty"`
	WALRetainedBytes *int64 `json:"wal_retained_bytes"`
}

// UnconfiguredMember is a version not in the configuration whose watermark
// is recorded on a group's slot.
type UnconfiguredMember struct {
	Projection string `json:"projection"`
	Version    int64  `json:"version"`
	Slot       string `json:"slot"`
	LSN        string `json:"watermark_lsn"`
}

// unconfiguredMembers reads the versions recorded on a slot of this
// configuration's groups (<prefix>_group_…) that cfg does not configure.
func unconfiguredMembers(ctx context.Context, q event.Querier, schema, prefix string, cfg *config.Config) ([]UnconfiguredMember, error) {
	projs, versions := make([]string, len(cfg.Projections)), make([]int64, len(cfg.Projections))
	for i, spec := range cfg.Projections {
		projs[i], versions[i] = spec.Name, spec.Version
	}
	scan := func(r pgx.CollectableRow) (UnconfiguredMember, error) {
		var m UnconfiguredMember
		err := r.Scan(&m.Projection, &m.Version, &m.Slot, &m.LSN)
		return m, err
	}
	out, err := event.QueryRows(ctx, q, "read watermarks on group slots", scan, `SELECT w.projection, w.version, w.slot_name, coalesce(w.lsn::text, '')
FROM `+pgx.Identifier{schema, "watermarks"}.Sanitize()+` AS w
WHERE starts_with(w.slot_name, $1)
  AND NOT EXISTS (SELECT 1 FROM unnest($2::text[], $3::bigint[]) AS c (projection, version)
                  WHERE c.projection = w.projection AND c.version = w.version)
ORDER BY w.slot_name, w.projection, w.version`, prefix+"_group_", projs, versions)
	if err != nil {
		return nil, err
	}
	return append([]UnconfiguredMember{}, out...), nil
}

// ProjectionStatus is the state of one projection version. Pointer fields
// are null in JSON when the value is unknown or does not apply (no slot, no
// watermark, not backfilling).
type ProjectionStatus struct {
	Group      string       `json:"group"`                 // the version's group (config key group)
	SharedSlot bool         `json:"shared_slot,omitempty"` // it streams from its group's slot
	Projection string       `json:"projection"`
	Version    int64        `json:"version"`
	State      engine.State `json:"state"`
	// Schema and Serve are the version's configured schema and serve
	// schema; Served is true when promote made it the version that serve's
	// views read.
	Schema string `json:"schema,omitempty"`
	Serve  string `json:"serve,omitempty"`
	Served bool   `json:"served"`
	// Node is the lease's node while its advisory lock is held; LockPID the
	// target backend that holds it.
	Node    string `json:"node,omitempty"`
	LockPID int32  `json:"lock_pid,omitempty"`
	// HaltedAt and HaltReason are set when the active node halted the
	// projection (it keeps the lock while halted).
	HaltedAt   *time.Time `json:"halted_at,omitempty"`
	HaltReason string     `json:"halt_reason,omitempty"`
	// HaltStage (source or commit) and HaltSQLState are read from the
	// halt reason; a source halt resumes by itself once its cause is gone.
	HaltStage    string `json:"halt_stage,omitempty"`
	HaltSQLState string `json:"halt_sqlstate,omitempty"`
	// Paused is set while an operator paused the version (with or without
	// an engine running it: a node that starts obeys it).
	Paused *PauseStatus `json:"paused,omitempty"`
	// PendingRetries counts `deadletters retry` requests not run yet.
	PendingRetries int64            `json:"pending_retries"`
	Slot           SlotStatus       `json:"slot"`
	Watermark      *WatermarkStatus `json:"watermark"`
	// LagSeconds is 0 when every event is accounted for, else the age of
	// the watermark's commit: an upper bound of the age of the oldest event
	// not yet applied. The stored watermark trails the engine's by up to
	// lag_interval.
	LagSeconds *float64 `json:"lag_seconds"`
	// LagBytes is the source's WAL position minus the slot's confirmed LSN.
	LagBytes *int64 `json:"lag_bytes"`
	// BacklogEvents is the number of events not yet accounted for: rows in
	// the events table minus applied, skipped, dead-lettered and parked
	// events of the version's cursors (never below 0).
	BacklogEvents int64 `json:"backlog_events"`
	// AdoptedEvents is how many events the version adopted on its first
	// start (start_after_position) instead of applying them.
	AdoptedEvents int64 `json:"adopted_events"`
	// WALRetainedBytes is the WAL the slot keeps on the source: its WAL
	// position minus the slot's restart LSN.
	WALRetainedBytes *int64 `json:"wal_retained_bytes"`
	DeadLetters      int64  `json:"dead_letters"`
	// ParkedEvents are events held behind a dead letter of their stream,
	// in ParkedStreams streams (on_error = "park").
	ParkedEvents  int64           `json:"parked_events"`
	ParkedStreams int64           `json:"parked_streams"`
	Backfill      *BackfillStatus `json:"backfill,omitempty"`
	// Notes are remarks an operator should read (a lost slot, a missing
	// one), in plain sentences.
	Notes []string `json:"notes,omitempty"`
}

// PauseStatus is an operator's pause of a projection version.
type PauseStatus struct {
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
	By     string    `json:"by,omitempty"`
}

// SlotStatus is the projection version's replication slot on the source.
type SlotStatus struct {
	Name       string `json:"name"`
	Exists     bool   `json:"exists"`
	ActivePID  int32  `json:"active_pid,omitempty"` // walsender streaming it; 0 when none
	WALStatus  string `json:"wal_status,omitempty"` // reserved, extended, unreserved or lost
	Confirmed  string `json:"confirmed_flush_lsn,omitempty"`
	RestartLSN string `json:"restart_lsn,omitempty"`
}

// WatermarkStatus is the stored contiguous watermark.
type WatermarkStatus struct {
	Phase      string     `json:"phase"`
	LSN        string     `json:"lsn"`
	Position   int64      `json:"position"`
	CommitTime *time.Time `json:"commit_time"`
	UpdatedAt  time.Time  `json:"updated_at"`
}

// BackfillStatus is the progress of a backfill, from the counts the engine
// stores every few seconds. ETASeconds assumes the rate so far, measured
// from the lease's acquisition (the backfill starts right after it); null
// until there is a rate to go by.
type BackfillStatus struct {
	Total      int64    `json:"total"`
	Done       int64    `json:"done"`
	Percent    float64  `json:"percent"`
	ETASeconds *float64 `json:"eta_seconds"`
}

// conns are the connections of an operator command: target holds the
// engine tables, the read models and the advisory locks; source holds the
// events table, the publication and the slots. source is target when both
// are the same database.
type conns struct {
	target, source *pgx.Conn
}

func connect(ctx context.Context, cfg *config.Config) (*conns, error) {
	target, err := connectCLI(ctx, cfg.TargetURL())
	if err != nil {
		return nil, fmt.Errorf("connect target: %s%w", noRoom(err), err)
	}
	c := &conns{target: target, source: target}
	if cfg.TargetURL() != cfg.Database.URL {
		if c.source, err = connectCLI(ctx, cfg.Database.URL); err != nil {
			target.Close(context.WithoutCancel(ctx))
			return nil, fmt.Errorf("connect source: %s%w", noRoom(err), err)
		}
	}
	return c, nil
}

// noRoom explains a connection the server refused for want of room
// (53300): what an operator can read meanwhile, and what to change. ""
// for any other error.
func noRoom(err error) string {
	if sqlstate.ResourceSetting(err) != "max_connections" {
		return ""
	}
	return "the server has no room for another connection (max_connections); each engine node still answers on its " +
		"metrics listener (/readyz, pgscribe_halted in /metrics, the console) and logs why it halted; close a connection or raise max_connections: "
}

func (c *conns) close(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if c.source != c.target {
		c.source.Close(ctx)
	}
	c.target.Close(ctx)
}

// connectCLI opens a connection named pgscribe-cli in pg_stat_activity.
func connectCLI(ctx context.Context, url string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "pgscribe-cli"
	return pgx.ConnectConfig(ctx, cfg)
}

// withMigrated runs fn on the connections of connectMigrated, closed when
// fn returns, with the engine schema.
func withMigrated(ctx context.Context, cfg *config.Config, fn func(c *conns, schema string) error) error {
	c, err := connectMigrated(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.close(ctx)
	return fn(c, cfg.Engine.Schema)
}

// connectMigrated connects as connect does and verifies that the engine
// schema is migrated, for the commands that read or change its tables.
func connectMigrated(ctx context.Context, cfg *config.Config) (*conns, error) {
	c, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := requireMigrated(ctx, c.target, cfg.Engine.Schema); err != nil {
		c.close(ctx)
		return nil, err
	}
	return c, nil
}

// requireMigrated returns an error unless the engine schema is at the
// version this binary knows.
func requireMigrated(ctx context.Context, q migrations.Querier, schema string) error {
	v, err := migrations.Current(ctx, q, schema)
	if err != nil {
		return err
	}
	switch {
	case v == 0:
		return fmt.Errorf("engine schema %q does not exist on the target database: run pgscribe migrate", schema)
	case v < migrations.Latest():
		return fmt.Errorf("engine schema %q is at version %d, this pgscribe needs %d: run pgscribe migrate", schema, v, migrations.Latest())
	case v > migrations.Latest():
		return fmt.Errorf("engine schema %q is at version %d: %w (it knows up to %d)", schema, v, migrations.ErrSchemaTooNew, migrations.Latest())
	}
	return nil
}

// slotRow is what status needs of pg_replication_slots.
type slotRow struct {
	SlotStatus
	lagBytes, retainedBytes *int64
}

func loadSlots(ctx context.Context, q event.Querier, wal string, names []string) (map[string]slotRow, error) {
	rows, err := q.Query(ctx, `SELECT slot_name::text, coalesce(active_pid, 0), coalesce(wal_status, ''),
  coalesce(confirmed_flush_lsn::text, ''), coalesce(restart_lsn::text, ''),
  pg_wal_lsn_diff($1::pg_lsn, confirmed_flush_lsn)::bigint, pg_wal_lsn_diff($1::pg_lsn, restart_lsn)::bigint
FROM pg_replication_slots WHERE slot_name = ANY($2)`, wal, names)
	if err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}
	defer rows.Close()
	out := make(map[string]slotRow, len(names))
	for rows.Next() {
		var s slotRow
		if err := rows.Scan(&s.Name, &s.ActivePID, &s.WALStatus, &s.Confirmed, &s.RestartLSN, &s.lagBytes, &s.retainedBytes); err != nil {
			return nil, fmt.Errorf("read replication slots: %w", err)
		}
		s.Exists = true
		out[s.Name] = s
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}
	return out, nil
}

// Status reads the state of every configured projection version from the
// source and target databases. It changes nothing. Counting the events
// table is a full scan: fine for an operator command, not for a probe.
func Status(ctx context.Context, cfg *config.Config) (*StatusReport, error) {
	c, err := connect(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer c.close(ctx)
	return StatusOn(ctx, cfg, c.target, c.source)
}

// StatusOn is Status on connections the caller holds (the console keeps
// its own between two refreshes): target holds the engine tables, source
// the events table and the slots; pass target twice when they are the
// same database. It must not run on one connection from two goroutines.
// It reads the counts (ReadStatusCounts) and then the rest (StatusWith).
func StatusOn(ctx context.Context, cfg *config.Config, target, source *pgx.Conn) (*StatusReport, error) {
	if err := requireMigrated(ctx, target, cfg.Engine.Schema); err != nil {
		return nil, err
	}
	counts, err := readStatusCounts(ctx, cfg, target, source)
	if err != nil {
		return nil, err
	}
	return statusWith(ctx, cfg, target, source, counts, false)
}

// StatusCounts are the figures of status that count whole tables, and so
// grow with them: the events table's rows, each version's dead letters and
// its cursors' totals (applied, skipped, dead-lettered, adopted, parked;
// the backlog is the events minus these). The console reads them less
// often than the rest (ReadStatusCounts, then StatusWith at each refresh).
type StatusCounts struct {
	At          time.Time // source database clock when counted
	Events      int64
	Head        int64 // the events' highest position then (0 when none)
	DeadLetters map[event.VersionKey]int64
	Totals      map[event.VersionKey]cursor.Totals
}

// ReadStatusCounts reads the StatusCounts on connections the caller holds
// (as StatusOn's).
func ReadStatusCounts(ctx context.Context, cfg *config.Config, target, source *pgx.Conn) (*StatusCounts, error) {
	if err := requireMigrated(ctx, target, cfg.Engine.Schema); err != nil {
		return nil, err
	}
	return readStatusCounts(ctx, cfg, target, source)
}

func readStatusCounts(ctx context.Context, cfg *config.Config, target, source *pgx.Conn) (*StatusCounts, error) {
	schema := cfg.Engine.Schema
	n := &StatusCounts{}
	table := event.Table(cfg.Source.Table).Quoted()
	if err := source.QueryRow(ctx, "SELECT count(*), coalesce(max(position), 0), now() FROM "+table).Scan(&n.Events, &n.Head, &n.At); err != nil {
		return nil, fmt.Errorf("count events in %s: %w", table, err)
	}
	// One count for every version: a query per version costs 50 visits of
	// scattered rows where one pass over the index does.
	var err error
	if n.DeadLetters, err = deadletter.Counts(ctx, target, schema); err != nil {
		return nil, err
	}
	if n.Totals, err = cursor.AllTotals(ctx, target, schema); err != nil {
		return nil, err
	}
	return n, nil
}

// StatusWith is StatusOn with counts read earlier (by ReadStatusCounts):
// everything else — watermarks, leases, halts, pauses, slots, served
// versions — is read now, a few cheap statements per version. The events,
// backlog, dead letters, parked and adopted events are the counts'. Since
// a backlog that old cannot say whether events wait now, the lag also
// reads the events' highest position now (an index probe): a version has
// events pending, and a lag (the age of its watermark's commit), while
// that position is above its watermark's and either the counts found a
// backlog or events came since they were taken; else its lag is 0.
func StatusWith(ctx context.Context, cfg *config.Config, target, source *pgx.Conn, counts *StatusCounts) (*StatusReport, error) {
	if counts == nil {
		return nil, errors.New("status: no counts read")
	}
	if err := requireMigrated(ctx, target, cfg.Engine.Schema); err != nil {
		return nil, err
	}
	return statusWith(ctx, cfg, target, source, counts, true)
}

// statusWith reads all but the counts; byHead judges the lag by the
// events' highest position (StatusWith) rather than by the backlog.
func statusWith(ctx context.Context, cfg *config.Config, target, source *pgx.Conn, counts *StatusCounts, byHead bool) (*StatusReport, error) {
	c := &conns{target: target, source: source}
	schema := cfg.Engine.Schema
	rep := &StatusReport{Projections: []ProjectionStatus{}, Unconfigured: []UnconfiguredSlot{}, UnconfiguredMembers: []UnconfiguredMember{}, Served: []Served{}}
	served, err := loadServed(ctx, c.target, schema)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(served)) {
		rep.Served = append(rep.Served, served[name])
	}
	// A standby source (logical decoding on a standby, PostgreSQL 16+) has
	// no current WAL insert position; its replay position stands in.
	if err := c.source.QueryRow(ctx, `SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
  ELSE pg_current_wal_lsn() END::text, now()`).Scan(&rep.SourceWAL, &rep.CheckedAt); err != nil {
		return nil, fmt.Errorf("read source WAL position: %w", err)
	}
	rep.Events = counts.Events
	oldestOn := []*pgx.Conn{c.source}
	if c.target != c.source {
		oldestOn = append(oldestOn, c.target)
	}
	oldest, err := lag.OldestTransaction(ctx, oldestOn...)
	if err != nil {
		return nil, fmt.Errorf("read the oldest engine transaction: %w", err)
	}
	rep.OldestTransactionSeconds = oldest.Seconds()
	var head int64
	if byHead {
		table := event.Table(cfg.Source.Table).Quoted()
		if err := c.source.QueryRow(ctx, "SELECT coalesce(max(position), 0) FROM "+table).Scan(&head); err != nil {
			return nil, fmt.Errorf("read the highest position of %s: %w", table, err)
		}
	}
	// A version that joined its group's stream streams from the group's
	// slot (its watermark is recorded there); any other from its own.
	// Each version's watermark is read once, here, and used below too.
	names := make([]string, len(cfg.Projections))
	wms := make([]cursor.Watermark, len(cfg.Projections))
	haveWMs := make([]bool, len(cfg.Projections))
	for i, spec := range cfg.Projections {
		names[i] = cfg.SlotName(spec)
		wm, ok, err := cursor.New(schema, spec.Name, spec.Version).LoadWatermark(ctx, c.target)
		if err != nil {
			return nil, err
		}
		wms[i], haveWMs[i] = wm, ok
		if g := cfg.GroupSlotName(spec.GroupName()); ok && wm.SlotName == g {
			names[i] = g
		}
	}
	slots, err := loadSlots(ctx, c.source, rep.SourceWAL, names)
	if err != nil {
		return nil, err
	}
	if rep.Unconfigured, err = unconfiguredSlots(ctx, c.source, rep.SourceWAL, cfg.Source.SlotPrefix, names); err != nil {
		return nil, err
	}
	if rep.UnconfiguredMembers, err = unconfiguredMembers(ctx, c.target, schema, cfg.Source.SlotPrefix, cfg); err != nil {
		return nil, err
	}
	holders, err := leader.AdvisoryHolders(ctx, c.target)
	if err != nil {
		return nil, err
	}
	for i, spec := range cfg.Projections {
		ps := ProjectionStatus{Projection: spec.Name, Version: spec.Version, Slot: SlotStatus{Name: names[i]},
			Schema: spec.Schema, Serve: spec.Serve, Group: spec.GroupName(), SharedSlot: names[i] == cfg.GroupSlotName(spec.GroupName())}
		if sv, ok := served[spec.Name]; ok && sv.Version == spec.Version {
			ps.Served = true
		}
		slot, hasSlot := slots[names[i]]
		if hasSlot {
			ps.Slot = slot.SlotStatus
			ps.LagBytes, ps.WALRetainedBytes = slot.lagBytes, slot.retainedBytes
		}
		key := event.VersionKey{Projection: spec.Name, Version: spec.Version}
		wm, haveWM := wms[i], haveWMs[i]
		totals := counts.Totals[key]
		ls, haveLease, err := leader.Load(ctx, c.target, schema, spec.Name, spec.Version)
		if err != nil {
			return nil, err
		}
		pid := holders[leader.Key(schema, spec.Name, spec.Version)]

		ctl, pendingRetries, err := loadControls(ctx, c.target, schema, spec.Name, spec.Version)
		if err != nil {
			return nil, err
		}
		ps.State = deriveState(pid != 0, haveWM, wm.Phase, slot.ActivePID != 0)
		ps.PendingRetries = pendingRetries
		if ctl.Paused() {
			ps.Paused = &PauseStatus{At: *ctl.PausedAt, Reason: ctl.PauseReason, By: ctl.PausedBy}
			if pid != 0 {
				ps.State = engine.StatePaused
			}
		}
		if pid != 0 && haveLease && ls.HaltedAt != nil {
			// A halted engine keeps the lock and records why (engine.Run).
			ps.State = engine.StateHalted
			ps.HaltedAt = ls.HaltedAt
			if ls.HaltReason != nil {
				ps.HaltReason = *ls.HaltReason
				ps.HaltStage, ps.HaltSQLState = engine.HaltCause(ps.HaltReason)
			}
		}
		if pid != 0 {
			ps.LockPID = pid
			if haveLease {
				ps.Node = ls.Node
			}
		}
		if haveWM {
			w := &WatermarkStatus{Phase: wm.Phase, LSN: wm.LSN.String(), Position: wm.Position, UpdatedAt: wm.UpdatedAt}
			if !wm.CommitTime.IsZero() {
				ct := wm.CommitTime
				w.CommitTime = &ct
			}
			ps.Watermark = w
		}
		ps.DeadLetters = counts.DeadLetters[key]
		ps.ParkedEvents, ps.ParkedStreams = totals.Parked, totals.ParkedStreams
		ps.BacklogEvents = max(rep.Events-totals.Accounted(), 0)
		ps.AdoptedEvents = totals.Adopted
		pending := ps.BacklogEvents > 0
		if byHead {
			pending = pendingNow(ps.BacklogEvents, wm.Position, counts.Head, head)
		}
		ps.LagSeconds = lagSeconds(ps.State, pending, wm.CommitTime, rep.CheckedAt)
		if ps.State == engine.StateBackfilling || ps.State == engine.StatePaused && (!haveWM || wm.Phase != cursor.PhaseLive) {
			var started time.Time
			if haveLease {
				started = ls.Acquired
			}
			ps.Backfill = backfillProgress(wm.BackfillTotal, wm.BackfillDone, started, wm.UpdatedAt, rep.CheckedAt)
		}
		ps.Notes = statusNotes(ps, haveWM, wm.SlotName, totals.Streams > 0)
		rep.Projections = append(rep.Projections, ps)
	}
	return rep, nil
}

// unconfiguredSlots finds the source database's slots that parseSlotName
// recognises but that are not among configured.
func unconfiguredSlots(ctx context.Context, q event.Querier, wal, prefix string, configured []string) ([]UnconfiguredSlot, error) {
	names, err := queryStrings(ctx, q, `SELECT slot_name::text FROM pg_replication_slots
WHERE database = current_database() AND NOT (slot_name = ANY($1)) ORDER BY slot_name`, configured)
	if err != nil {
		return nil, fmt.Errorf("read replication slots: %w", err)
	}
	out := []UnconfiguredSlot{}
	var found []string
	for _, n := range names {
		if proj, v, ok := parseSlotName(prefix, n); ok {
			out = append(out, UnconfiguredSlot{Slot: n, Projection: proj, Version: v})
			found = append(found, n)
		} else if strings.HasPrefix(n, prefix+"_group_") {
			// A group slot no configured version streams from.
			out = append(out, UnconfiguredSlot{Slot: n, Group: strings.TrimPrefix(n, prefix+"_group_")})
			found = append(found, n)
		}
	}
	if len(found) == 0 {
		return out, nil
	}
	slots, err := loadSlots(ctx, q, wal, found)
	if err != nil {
		return nil, err
	}
	for i := range out {
		s := slots[out[i].Slot]
		out[i].ActivePID, out[i].WALRetainedBytes = s.ActivePID, s.retainedBytes
	}
	return out, nil
}

// parseSlotName splits <prefix>_<name>_v<version>, the form of
// config.SlotName, into name and version.
func parseSlotName(prefix, slot string) (string, int64, bool) {
	rest, ok := strings.CutPrefix(slot, prefix+"_")
	if !ok {
		return "", 0, false
	}
	i := strings.LastIndex(rest, "_v")
	if i <= 0 {
		return "", 0, false
	}
	v, err := strconv.ParseInt(rest[i+2:], 10, 64)
	if err != nil || v < 1 || strconv.FormatInt(v, 10) != rest[i+2:] {
		return "", 0, false
	}
	return rest[:i], v, true
}

// deriveState maps what the databases say to a state; see the file comment.
func deriveState(locked, haveWatermark bool, phase string, streaming bool) engine.State {
	switch {
	case !locked:
		return engine.StateStopped
	case !haveWatermark || phase != cursor.PhaseLive:
		return engine.StateBackfilling
	case streaming:
		return engine.StateLive
	default:
		return engine.StateStarting
	}
}

// loadControls reads a version's pause and counts its pending retries.
func loadControls(ctx context.Context, q event.Querier, schema, projection string, version int64) (control.State, int64, error) {
	st, err := control.Load(ctx, q, schema, projection, version)
	if err != nil {
		return control.State{}, 0, err
	}
	n, err := control.PendingRetries(ctx, q, schema, projection, version)
	return st, n, err
}

// pendingNow says whether a version has events pending now, from counts
// taken earlier (its backlog then, the events' highest position then) and
// the highest position now against its watermark's: the counts' backlog
// is gone once the watermark reached the highest position, and events
// that came since are pending until it does.
func pendingNow(countedBacklog, watermark, countedHead, head int64) bool {
	return watermark < head && (countedBacklog > 0 || head > countedHead)
}

// lagSeconds is 0 when nothing is pending, the age of the watermark's commit
// when events are, and unknown while backfilling or without a commit time.
func lagSeconds(state engine.State, pending bool, commit, now time.Time) *float64 {
	var s float64
	switch {
	case state == engine.StateBackfilling:
		return nil
	case !pending:
	case commit.IsZero():
		return nil
	default:
		s = max(now.Sub(commit).Seconds(), 0)
	}
	return &s
}

// backfillProgress turns the stored counts into a percentage and an ETA.
// started is when the active node took the lock (zero when unknown),
// updated when the counts were stored, now the database clock. The rate is
// done / (updated - started); the ETA counts from updated, so it shrinks
// between two stores of the counts.
func backfillProgress(total, done int64, started, updated, now time.Time) *BackfillStatus {
	b := &BackfillStatus{Total: total, Done: done}
	if total <= 0 {
		return b
	}
	b.Percent = min(100*float64(done)/float64(total), 100)
	elapsed := updated.Sub(started).Seconds()
	if started.IsZero() || done <= 0 || elapsed < 1 {
		return b
	}
	remaining := float64(max(total-done, 0)) / (float64(done) / elapsed)
	eta := max(remaining-now.Sub(updated).Seconds(), 0)
	b.ETASeconds = &eta
	return b
}

// statusNotes explains states an operator should act on.
func statusNotes(ps ProjectionStatus, haveWM bool, wmSlot string, hasCursors bool) []string {
	var notes []string
	switch {
	case ps.Slot.WALStatus == "lost":
		notes = append(notes, "the slot was invalidated (its WAL is gone): the next run resyncs from a new snapshot; cursors skip what was applied")
	case !ps.Slot.Exists && hasCursors && ps.State != engine.StateBackfilling:
		notes = append(notes, "the slot is missing: the next run resyncs from a new snapshot; cursors skip what was applied")
	case !ps.Slot.Exists && !hasCursors && !haveWM:
		notes = append(notes, "never run: the next run creates the slot and backfills")
	}
	if ps.SharedSlot {
		notes = append(notes, fmt.Sprintf("streams from its group's shared slot %q: one decode for the group's versions; the slot's WAL is held back by the lowest of their watermarks", wmSlot))
	}
	if haveWM && wmSlot != "" && wmSlot != ps.Slot.Name {
		notes = append(notes, fmt.Sprintf("the watermark belongs to slot %q (slot_prefix changed?): the next run rebuilds", wmSlot))
	}
	if ps.State == engine.StateHalted && engine.SourceHalt(ps.HaltReason) {
		notes = append(notes, fmt.Sprintf("halted on node %s: %s — the source cannot be read; the engine probes it every standby_poll and resumes by itself once the cause is fixed (pgscribe resume -projection %s -version %d retries at once); nothing was acknowledged",
			ps.Node, ps.HaltReason, ps.Projection, ps.Version))
	} else if ps.State == engine.StateHalted && engine.ResourceHalt(ps.HaltReason) {
		notes = append(notes, fmt.Sprintf("halted on node %s: %s — the server has no room for what the engine needs (raise the setting named, or group projections, or lower parallelism); the engine checks every standby_poll and resumes by itself once there is room (pgscribe resume -projection %s -version %d retries at once); nothing was acknowledged",
			ps.Node, ps.HaltReason, ps.Projection, ps.Version))
	} else if ps.State == engine.StateHalted {
		notes = append(notes, fmt.Sprintf("halted on node %s: %s — fix the cause, then run pgscribe resume -projection %s -version %d (or restart pgscribe on that node); nothing of the failing batch was acknowledged",
			ps.Node, ps.HaltReason, ps.Projection, ps.Version))
	}
	if p := ps.Paused; p != nil {
		what := "paused"
		if p.Reason != "" {
			what += " (" + p.Reason + ")"
		}
		what += " by " + orDash(p.By) + " at " + p.At.UTC().Format(time.RFC3339)
		if ps.State == engine.StatePaused {
			notes = append(notes, fmt.Sprintf("%s: node %s applies nothing and keeps its lock; the slot retains WAL (%s now) until pgscribe resume -projection %s -version %d",
				what, ps.Node, formatBytesPtr(ps.WALRetainedBytes), ps.Projection, ps.Version))
		} else {
			notes = append(notes, fmt.Sprintf("%s: the node that runs it next will wait for pgscribe resume -projection %s -version %d", what, ps.Projection, ps.Version))
		}
	}
	if ps.ParkedStreams > 0 {
		notes = append(notes, fmt.Sprintf("%d stream(s) parked behind a dead letter, holding %d event(s): pgscribe deadletters retry applies them in order once the cause is fixed, pgscribe deadletters skip releases them without it",
			ps.ParkedStreams, ps.ParkedEvents))
	}
	if ps.PendingRetries > 0 {
		notes = append(notes, fmt.Sprintf("%d dead-letter retry request(s) wait for the active node", ps.PendingRetries))
	}
	if ps.State == engine.StateStopped && ps.Slot.Exists {
		notes = append(notes, "nothing runs it, and its slot retains WAL on the source until it runs again (or pgscribe reset drops it)")
	}
	return notes
}

// WriteJSON writes the report as one indented JSON document.
func (r *StatusReport) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report as a table, then the notes.
func (r *StatusReport) WriteText(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROJECTION\tSTATE\tNODE\tWATERMARK\tPOSITION\tCOMMITTED\tLAG\tLAG BYTES\tBACKLOG\tWAL RETAINED\tDEAD LETTERS\tBACKFILL")
	for _, p := range r.Projections {
		lsn, pos, committed := "-", "-", "-"
		if wm := p.Watermark; wm != nil {
			lsn, pos = wm.LSN, fmt.Sprint(wm.Position)
			if wm.CommitTime != nil {
				committed = wm.CommitTime.UTC().Format(time.RFC3339)
			}
		}
		lag := "-"
		if p.LagSeconds != nil {
			lag = formatSeconds(*p.LagSeconds)
		}
		name := fmt.Sprintf("%s v%d", p.Projection, p.Version)
		if p.Served {
			name += " (served)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%d\t%s\n",
			name, p.State, orDash(p.Node), lsn, pos, committed, lag,
			formatBytesPtr(p.LagBytes), p.BacklogEvents, formatBytesPtr(p.WALRetainedBytes), p.DeadLetters,
			formatBackfill(p.Backfill))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range r.Projections {
		for _, n := range p.Notes {
			if _, err := fmt.Fprintf(w, "%s v%d: %s\n", p.Projection, p.Version, n); err != nil {
				return err
			}
		}
	}
	for _, u := range r.Unconfigured {
		var err error
		if u.Group != "" {
			_, err = fmt.Fprintf(w, "slot %q of group %s, which no configured version streams from, retains %s of WAL: retire or reset the versions recorded on it (the last one drops it), or drop it with pg_drop_replication_slot\n",
				u.Slot, u.Group, formatBytesPtr(u.WALRetainedBytes))
		} else {
			_, err = fmt.Fprintf(w, "slot %q of %s v%d, which is not configured, retains %s of WAL: pgscribe reset -projection %s -version %d drops it\n",
				u.Slot, u.Projection, u.Version, formatBytesPtr(u.WALRetainedBytes), u.Projection, u.Version)
		}
		if err != nil {
			return err
		}
	}
	for _, m := range r.UnconfiguredMembers {
		if _, err := fmt.Fprintf(w, "%s v%d, which is not configured, is recorded on group slot %q at %s and holds its WAL back there: pgscribe retire -projection %s -version %d (or reset) releases it\n",
			m.Projection, m.Version, m.Slot, orDash(m.LSN), m.Projection, m.Version); err != nil {
			return err
		}
	}
	for _, s := range r.Served {
		if _, err := fmt.Fprintf(w, "served: %s v%d in schema %s (promoted %s)\n",
			s.Projection, s.Version, s.ServeSchema, s.PromotedAt.UTC().Format(time.RFC3339)); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintf(w, "events: %d, source WAL at %s, oldest engine transaction open %.1f s, as of %s\n",
		r.Events, r.SourceWAL, r.OldestTransactionSeconds, r.CheckedAt.UTC().Format(time.RFC3339))
	return err
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func formatBackfill(b *BackfillStatus) string {
	if b == nil {
		return "-"
	}
	s := fmt.Sprintf("%.1f%% (%d/%d)", b.Percent, b.Done, b.Total)
	if b.ETASeconds != nil {
		s += " eta " + formatSeconds(*b.ETASeconds)
	}
	return s
}

// formatSeconds renders a duration for people: 0s, 1.5s, 2m3s, 4h5m.
func formatSeconds(s float64) string {
	d := time.Duration(s * float64(time.Second))
	switch {
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

func formatBytesPtr(b *int64) string {
	if b == nil {
		return "-"
	}
	return formatBytes(*b)
}

// formatBytes renders a byte count with binary units: 512 B, 1.5 MiB.
func formatBytes(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	v, i := float64(b)/unit, 0
	for v >= unit && i < 5 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", v, "KMGTPE"[i])
}

// WriteProgress draws one progress bar per backfilling projection version,
// width characters wide, for `pgscribe status -watch`.
func (r *StatusReport) WriteProgress(w io.Writer, width int) error {
	for _, p := range r.Projections {
		if p.Backfill == nil || p.State != engine.StateBackfilling {
			continue
		}
		if _, err := fmt.Fprintf(w, "%s v%d %s %s\n", p.Projection, p.Version,
			progressBar(p.Backfill.Percent, width), formatBackfill(p.Backfill)); err != nil {
			return err
		}
	}
	return nil
}

// progressBar renders percent (0–100) as [#####-----] of width cells.
func progressBar(percent float64, width int) string {
	width = max(width, 1)
	filled := int(percent / 100 * float64(width))
	filled = min(max(filled, 0), width)
	return "[" + strings.Repeat("#", filled) + strings.Repeat("-", width-filled) + "]"
}

// FormatBytes renders a byte count as status does: 512 B, 1.5 MiB.
func FormatBytes(b int64) string { return formatBytes(b) }

// FormatSeconds renders a duration in seconds as status does: 1.5s, 2m3s.
func FormatSeconds(s float64) string { return formatSeconds(s) }
