package rules

// Spec is the TOML model of one projection's rules, as written under
// [[projection]] in the configuration file. The config package decodes it;
// Compile turns it into a Program.
type Spec struct {
	Name    string     `toml:"name"`
	Version int64      `toml:"version"`
	OnError string     `toml:"on_error"` // "dead_letter" (default), "halt" or "park"
	Rules   []RuleSpec `toml:"rule"`
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
