package rules

import (
	"slices"
	"strings"
)

// Spec is the TOML model of one projection's rules, as written under
// [[projection]] in the configuration file. The config package decodes it;
// Compile turns it into a Program.
type Spec struct {
	Name    string     `toml:"name"`
	Version int64      `toml:"version"`
	OnError string     `toml:"on_error"` // "dead_letter" (default), "halt" or "park"
	Rules   []RuleSpec `toml:"rule"`

	// Schema is where this version's rule tables live when a rule names
	// one without a schema (Qualify); empty keeps the names as written,
	// resolved by the target's search_path.
	Schema string `toml:"schema"`

	// The fields below are about deploying the version, not about its
	// rules: Compile ignores them.

	// Serve is the schema whose stable names (views) `pgscribe promote`
	// points at this version's tables; empty when the version is never
	// promoted.
	Serve string `toml:"serve"`
	// DDL is the read-model DDL file that `pgscribe migrate` runs in
	// Schema; config resolves it relative to the configuration file.
	DDL string `toml:"ddl"`
	// StartAfterPosition, when above 0, makes the version's first start
	// count every event at or below it as already applied (adopted from the
	// projector it replaces).
	StartAfterPosition int64 `toml:"start_after_position"`
	// Group names the projection versions that share one replication slot
	// and one decode of the events table and run together on one node;
	// empty is the default group ("default"). A group of one configured
	// version runs on a slot of its own.
	Group string `toml:"group"`
}

// DefaultGroup is the group of a version that names none.
const DefaultGroup = "default"

// GroupName is the version's group: Group, or DefaultGroup.
func (s Spec) GroupName() string {
	if s.Group == "" {
		return DefaultGroup
	}
	return s.Group
}

// Qualify maps a rule's table to the name it has for this version: a name
// without a schema is placed in s.Schema, a qualified one stays as written.
// It is the one place that decides where a version's tables are; Compile
// uses it for every rule, and a command that builds a version elsewhere
// (a scratch schema) sets Schema on a copy of the Spec.
func (s Spec) Qualify(table string) string {
	if s.Schema == "" || table == "" || strings.Contains(table, ".") {
		return table
	}
	return s.Schema + "." + table
}

// Tables lists the tables this version's rules write, as Qualify names
// them, sorted and without duplicates (sql rules name none).
func (s Spec) Tables() []string {
	var out []string
	for _, r := range s.Rules {
		if t := s.Qualify(r.Table); t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}

// RuleSpec is one [[projection.rule]] entry. On is a single event type, a
// list of types, or absent (all types). Key, Set and Inc map column names to
// expressions; Args are expressions bound to $1, $2 … of SQL.
type RuleSpec struct {
	Name    string            `toml:"name"`
	On      any               `toml:"on"`
	When    string            `toml:"when"`
	Op      string            `toml:"op"`
	Table   string            `toml:"table"`
	Key     map[string]string `toml:"key"`
	Set     map[string]string `toml:"set"`
	Inc     map[string]string `toml:"inc"`
	SQL     string            `toml:"sql"`
	Args    []string          `toml:"args"`
	Message string            `toml:"message"`
	// IfMissing is what an update or delete that matches no row does:
	// IfMissingIgnore (the default; it is counted) or IfMissingDeadLetter.
	IfMissing string `toml:"if_missing"`
}
