package integration

// The seeded fault campaign, part one: the plan (issue 30,
// docs/testing.md#the-fault-campaign-make-campaign). Everything a campaign
// does is drawn from one seed here, before anything runs: the
// configuration (projections, their groups, rules and read models), the
// shape of the history the writers append, and the schedule of faults and
// operator actions. The same seed gives the same plan on every machine;
// campaign_test.go runs it.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// The parts a campaign projection is made of. Each is one rule (and,
// except fail, one read-model table) whose exact content the oracle
// computes from the events table alone (cPart.want).
const (
	partRows  = "rows"  // insert keyed by event id, set from the event
	partSeen  = "seen"  // key-only insert (stream id, position)
	partTrail = "trail" // sql: the stream's positions appended in order
	partTotal = "total" // upsert with inc on rows every stream shares (accounts)
	partNote  = "note"  // insert into varchar(8): a long name fails at commit (22001)
	partCheck = "check" // insert under CHECK (q >= 0): a negative q fails at commit (23514)
	partFail  = "fail"  // op fail when data.fail: fails at the rule
	// Drawn apart from the rest (generator 4, cPlan.more):
	partUpd = "upd" // insert of the stream's row at its first event, update (set, inc) when data.v is even, if_missing drawn
	partDel = "del" // key-only insert (stream id, position), delete of position - 2 when data.v % 3 == 0 (if_missing "ignore")
)

// campaignParts lists every part; a projection draws a subset.
var campaignParts = []string{partRows, partSeen, partTrail, partTotal, partNote, partCheck, partFail}

// campaignTypes are the event types the writers append; a projection's
// rules match a subset.
var campaignTypes = []string{"A", "B", "C"}

// cProj is one projection of a campaign's configuration.
type cProj struct {
	name  string
	group string // "" = the default group
	types []string
	parts []string
	// ifMissing is the if_missing of the upd part's update rule:
	// "ignore" or "dead_letter".
	ifMissing string
	// first is the position of a stream's first event (cShape.first),
	// which the upd part's row is inserted at.
	first int
	// onError is "" (dead_letter), "halt" or "park" (cPlan.more).
	onError string
	// version is 0 (1) or, for the version bump's new version, 2 with
	// its own schema (where its tables are), serve (where promote points
	// views at them) and ddl file.
	version       int
	schema, serve string
}

// ver is the projection's version.
func (p cProj) ver() int { return max(p.version, 1) }

// tbl is the read model of part: schema-qualified for a version that has
// its own schema.
func (p cProj) tbl(part string) string {
	if p.schema != "" {
		return p.schema + "." + p.name + "_" + part
	}
	return p.name + "_" + part
}

// ddlFile is the version's ddl file, beside the configuration.
func (p cProj) ddlFile() string { return fmt.Sprintf("%s_v%d.sql", p.name, p.ver()) }

func (p cProj) has(part string) bool { return slices.Contains(p.parts, part) }

// groupName is the group the projection is in.
func (p cProj) groupName() string {
	if p.group == "" {
		return "default"
	}
	return p.group
}

// typesSQL is the projection's types as an SQL array literal (they are
// campaignTypes: no quoting needed).
func (p cProj) typesSQL() string {
	return "ARRAY['" + strings.Join(p.types, "','") + "']::text[]"
}

// poison is the SQL condition (on the events table, unaliased) of the
// events this projection must dead-letter, among those of its types.
func (p cProj) poison() string { return p.poisonOf("events") }

// poisonOf is poison on the events row a: the static poison, and with the
// upd part under if_missing = "dead_letter" an update (data.v even) on a
// stream whose row was never inserted (no kept event of the projection's
// types at the stream's first position; the first event is never behind
// another, so on_error does not change that). Those misses are
// permanent: a retry fails again.
func (p cProj) poisonOf(a string) string {
	static := p.staticPoisonOf(a)
	if !p.has(partUpd) || p.ifMissing != "dead_letter" {
		return static
	}
	return fmt.Sprintf(`(%s OR ((%s.data->>'v')::bigint %% 2 = 0 AND NOT EXISTS (SELECT 1 FROM events o
  WHERE o.stream_id = %s.stream_id AND o.stream_position = %d AND o.type = ANY(%s) AND NOT %s)))`,
		static, a, a, p.first, p.typesSQL(), p.staticPoisonOf("o"))
}

// staticPoisonOf is the condition of the events (row a) that fail whatever
// the read models hold: a long name, a negative q, data.fail.
func (p cProj) staticPoisonOf(a string) string {
	var or []string
	if p.has(partNote) {
		or = append(or, `length(`+a+`.data->>'name') > 8`)
	}
	if p.has(partCheck) {
		or = append(or, `(`+a+`.data->>'q')::int < 0`)
	}
	if p.has(partFail) {
		or = append(or, `(`+a+`.data->>'fail')::boolean`)
	}
	if len(or) == 0 {
		return "false"
	}
	return "(" + strings.Join(or, " OR ") + ")"
}

// behind is, under on_error "park" or "halt", the condition of the events
// (unaliased) behind a failing event of their stream that an operator did
// not skip: a parked stream holds them; a halted projection acknowledges
// nothing from the failing event on. Under "dead_letter": false.
func (p cProj) behind() string {
	if p.onError == "" {
		return "false"
	}
	// Uncorrelated, so that PostgreSQL computes it once (a hashed subplan).
	return fmt.Sprintf(`(events.stream_id, events.stream_position) IN (SELECT a.stream_id, a.stream_position FROM events a
  JOIN (SELECT b.stream_id, min(b.stream_position) AS pos FROM events b WHERE b.type = ANY(%s) AND %s
    AND b.id::text NOT IN (SELECT event_id FROM campaign_skipped WHERE projection = '%s') GROUP BY b.stream_id) f
  ON a.stream_id = f.stream_id AND a.stream_position > f.pos)`,
		p.typesSQL(), p.poisonOf("b"), p.name)
}

// kept is the SQL condition of the events the projection applies ($1 is
// its types). Under "halt", of those it may have applied: exact only while
// nothing of its types fails.
func (p cProj) kept() string {
	return `type = ANY($1) AND NOT ` + p.poison() + ` AND NOT ` + p.behind()
}

// deadSQL is the query of the events that must be dead-lettered ($1 the
// projection, $2 its types): under "park" the first failing event of a
// stream (later ones are held behind it), under "halt" none.
func (p cProj) deadSQL() string {
	if p.onError == "halt" {
		return `SELECT id::text FROM events WHERE false AND $1::text <> '' AND type = ANY($2)`
	}
	return `SELECT id::text FROM events WHERE type = ANY($2) AND ` + p.poison() + ` AND NOT ` + p.behind() + `
EXCEPT ALL SELECT event_id FROM campaign_skipped WHERE projection = $1 AND version = ` + fmt.Sprint(p.ver())
}

// ddl creates the projection's read models.
func (p cProj) ddl() string {
	var b strings.Builder
	table := func(part, cols string) {
		if p.has(part) {
			fmt.Fprintf(&b, "CREATE TABLE %s_%s (%s);\n", p.name, part, cols)
		}
	}
	table(partRows, `event_id text PRIMARY KEY, stream_id text NOT NULL, stream_position bigint NOT NULL, v bigint`)
	table(partSeen, `stream_id text, stream_position bigint, PRIMARY KEY (stream_id, stream_position)`)
	table(partTrail, `stream_id text PRIMARY KEY, positions bigint[] NOT NULL`)
	table(partTotal, `acct text PRIMARY KEY, total bigint NOT NULL, n bigint NOT NULL`)
	table(partNote, `event_id text PRIMARY KEY, name varchar(8)`)
	table(partCheck, `event_id text PRIMARY KEY, q int CHECK (q >= 0)`)
	table(partUpd, `stream_id text PRIMARY KEY, opened bigint NOT NULL, last bigint, n bigint NOT NULL DEFAULT 0`)
	table(partDel, `stream_id text, stream_position bigint, PRIMARY KEY (stream_id, stream_position)`)
	return b.String()
}

// toml renders the projection's [[projection]] block.
func (p cProj) toml() string {
	on := strings.Join(p.types, ",")
	var rules []rule
	for _, part := range p.parts {
		table := p.name + "_" + part
		switch part {
		case partRows:
			rules = append(rules, rule{name: part, on: on, op: "insert", table: table,
				set: `event_id = "id", stream_id = "stream_id", stream_position = "stream_position", v = "data.v"`})
		case partSeen:
			rules = append(rules, rule{name: part, on: on, op: "insert", table: table,
				key: `stream_id = "stream_id", stream_position = "stream_position"`})
		case partTrail:
			rules = append(rules, rule{name: part, on: on, op: "sql", args: `["stream_id", "stream_position"]`,
				sql: "INSERT INTO " + table + " AS t (stream_id, positions) VALUES ($1, ARRAY[$2::bigint]) ON CONFLICT (stream_id) DO UPDATE SET positions = t.positions || EXCLUDED.positions"})
		case partTotal:
			rules = append(rules, rule{name: part, on: on, op: "upsert", table: table,
				key: `acct = "data.acct"`, inc: `total = "data.amount", n = "1"`})
		case partNote:
			rules = append(rules, rule{name: part, on: on, op: "insert", table: table, set: `event_id = "id", name = "data.name"`})
		case partCheck:
			rules = append(rules, rule{name: part, on: on, op: "insert", table: table, set: `event_id = "id", q = "data.q"`})
		case partFail:
			rules = append(rules, rule{name: part, on: on, when: "data.fail", op: "fail", message: "'refused by the campaign'"})
		case partUpd:
			rules = append(rules,
				rule{name: part + "_open", on: on, when: fmt.Sprintf("stream_position == %d", p.first), op: "insert", table: table,
					key: `stream_id = "stream_id"`, set: `opened = "stream_position"`},
				rule{name: part, on: on, when: "data.v % 2 == 0", op: "update", table: table, ifMissing: p.ifMissing,
					key: `stream_id = "stream_id"`, set: `last = "stream_position"`, inc: `n = "1"`})
		case partDel:
			rules = append(rules,
				rule{name: part + "_add", on: on, op: "insert", table: table, key: `stream_id = "stream_id", stream_position = "stream_position"`},
				rule{name: part, on: on, when: "data.v % 3 == 0", op: "delete", table: table, ifMissing: "ignore",
					key: `stream_id = "stream_id", stream_position = "stream_position - 2"`})
		}
	}
	var keys []string
	if p.group != "" {
		keys = append(keys, fmt.Sprintf("group = %q", p.group))
	}
	onError := p.onError
	if onError == "" {
		onError = "dead_letter"
	}
	if p.schema != "" {
		keys = append(keys, fmt.Sprintf("schema = %q", p.schema), fmt.Sprintf("serve = %q", p.serve), fmt.Sprintf("ddl = %q", p.ddlFile()))
	}
	return projectionKeysTOML(p.name, p.ver(), onError, keys, rules...)
}

// want returns, for each read model of the projection, the query of its
// rows and the query (on the events table, $1 the projection's types) of
// what they must be.
func (p cProj) want() [][3]string {
	var out [][3]string
	kept := p.kept()
	add := func(part, got, want string) {
		if p.has(part) {
			out = append(out, [3]string{p.tbl(part), got, want})
		}
	}
	add(partRows, `SELECT event_id, stream_id, stream_position, v FROM `+p.tbl(partRows),
		`SELECT id::text, stream_id, stream_position, (data->>'v')::bigint FROM events WHERE `+kept)
	add(partSeen, `SELECT stream_id, stream_position FROM `+p.tbl(partSeen),
		`SELECT stream_id, stream_position FROM events WHERE `+kept)
	add(partTrail, `SELECT stream_id, positions FROM `+p.tbl(partTrail),
		`SELECT stream_id, array_agg(stream_position ORDER BY stream_position) FROM events WHERE `+kept+` GROUP BY stream_id`)
	add(partTotal, `SELECT acct, total::numeric, n FROM `+p.tbl(partTotal),
		`SELECT data->>'acct', sum((data->>'amount')::numeric), count(*) FROM events WHERE `+kept+` GROUP BY 1`)
	add(partNote, `SELECT event_id, name::text FROM `+p.tbl(partNote),
		`SELECT id::text, data->>'name' FROM events WHERE `+kept)
	add(partCheck, `SELECT event_id, q FROM `+p.tbl(partCheck),
		`SELECT id::text, (data->>'q')::int FROM events WHERE `+kept)
	// k: the kept events, for the parts whose rows depend on several.
	k := `WITH k AS (SELECT stream_id, stream_position, (data->>'v')::bigint AS v FROM events WHERE ` + kept + `) `
	// upd: a row per stream whose first event is kept, updated by each
	// kept event with an even v (the first included: its insert comes
	// first, in rule order), last its latest position.
	add(partUpd, `SELECT stream_id, opened, last, n FROM `+p.tbl(partUpd),
		k+fmt.Sprintf(`SELECT o.stream_id, o.stream_position, max(u.stream_position), count(u.stream_position)
FROM k o LEFT JOIN k u ON u.stream_id = o.stream_id AND u.v %% 2 = 0 WHERE o.stream_position = %d GROUP BY 1, 2`, p.first))
	// del: every kept event, less those that a kept event two positions
	// later with v % 3 = 0 deleted.
	add(partDel, `SELECT stream_id, stream_position FROM `+p.tbl(partDel),
		k+`SELECT stream_id, stream_position FROM k WHERE NOT EXISTS
(SELECT 1 FROM k d WHERE d.stream_id = k.stream_id AND d.stream_position = k.stream_position + 2 AND d.v % 3 = 0)`)
	return out
}

// The kinds of step a schedule holds: faults, then operator actions.
const (
	stepKill      = "kill-9"           // SIGKILL the engine, start it again after hold
	stepPGRestart = "pg-restart"       // PostgreSQL immediate restart
	stepCut       = "connection-cut"   // the engine's TCP proxy cuts every connection for hold
	stepPubDrop   = "publication-drop" // DROP PUBLICATION, then pgscribe migrate recreates it
	stepSlotDrop  = "slot-drop"        // a slot of the deployment dropped by hand
	stepFreeze    = "sigstop"          // SIGSTOP an engine node, SIGCONT after 2 s + 4 × hold (past lease_timeout: the other node takes over)
	stepAlter     = "alter-table"      // ALTER TABLE … ADD COLUMN on a read model, DROP COLUMN after hold
	stepPause     = "pause-resume"     // pgscribe pause, resume after hold
	stepVerify    = "verify"           // pgscribe verify of a projection
	stepRetry     = "deadletter-retry" // pgscribe deadletters retry of a projection: its poison fails again
	stepSkip      = "deadletter-skip"  // pgscribe deadletters skip of a projection's dead letters
	// Drawn apart from the weights below (cPlan.more), in place of a cut
	// or a skip:
	stepBlackhole = "blackhole"          // the engine's TCP proxy forwards nothing, closes nothing, for 2 s + 4 × hold
	stepDiscard   = "deadletter-discard" // pgscribe deadletters discard -yes of a projection's dead letters
	// Drawn in place of an alter-table, or of a kill-9 (generator 7):
	stepBreak   = "alter-break" // ALTER TABLE … RENAME COLUMN a rule writes: the projection halts visibly; renamed back, pgscribe resume
	stepOverlap = "cut+kill-9"  // two faults at once: the connections cut, an engine node killed meanwhile, started while still cut, restored after
)

// campaignSteps lists every kind with its weight in a schedule.
var campaignSteps = []struct {
	kind   string
	weight int
}{
	{stepKill, 3}, {stepPGRestart, 2}, {stepCut, 3}, {stepPubDrop, 2}, {stepSlotDrop, 2}, {stepFreeze, 2}, {stepAlter, 1},
	{stepPause, 2}, {stepVerify, 1}, {stepRetry, 1}, {stepSkip, 1},
}

// cStep is one step of a schedule: at is its earliest start, from the
// start of the history (a step starts once the one before it recovered,
// so later than at when faults pile up); target picks a projection or a
// slot; hold is how long the fault or the pause lasts.
type cStep struct {
	at     time.Duration
	kind   string
	target int
	hold   time.Duration
}

func (s cStep) String() string {
	return fmt.Sprintf("at %6s %-16s target %d hold %s", s.at.Round(100*time.Millisecond), s.kind, s.target, s.hold.Round(10*time.Millisecond))
}

// cShape is the events table of a campaign: the reference columns under
// their own names, of types the source supports (docs/events-table.md),
// created before `pgscribe migrate -events-table`, which keeps it.
type cShape struct {
	id          string // "uuid" or "bigint" (from a sequence)
	data        string // type of data and metadata: "jsonb" or "json"
	occurredAt  string // "timestamptz" or "timestamp"
	partitioned bool   // PARTITION BY HASH (stream_id), 3 partitions
	first       int    // position of a stream's first event: 0 or 1
}

func (sh cShape) String() string {
	part := "plain"
	if sh.partitioned {
		part = "hash-partitioned"
	}
	return fmt.Sprintf("%s ids, %s, %s, %s, streams from %d", sh.id, sh.data, sh.occurredAt, part, sh.first)
}

// ddl creates the events table.
func (sh cShape) ddl() string {
	id := `uuid NOT NULL DEFAULT gen_random_uuid()`
	pre := ""
	if sh.id == "bigint" {
		pre = "CREATE SEQUENCE events_ids;\n"
		id = `bigint NOT NULL DEFAULT nextval('events_ids')`
	}
	key, part := "PRIMARY KEY (position)", ""
	if sh.partitioned {
		key, part = "PRIMARY KEY (position, stream_id)", " PARTITION BY HASH (stream_id)"
	}
	ddl := fmt.Sprintf(`%sCREATE TABLE events (
    position        bigserial,
    id              %s,
    stream_id       text        NOT NULL,
    stream_position bigint      NOT NULL,
    type            text        NOT NULL,
    data            %s NOT NULL,
    metadata        %s NOT NULL DEFAULT '{}',
    occurred_at     %s NOT NULL DEFAULT now(),
    %s,
    UNIQUE (stream_id, stream_position)
)%s;
`, pre, id, sh.data, sh.data, sh.occurredAt, key, part)
	if sh.partitioned {
		for r := range 3 {
			ddl += fmt.Sprintf("CREATE TABLE events_%d PARTITION OF events FOR VALUES WITH (MODULUS 3, REMAINDER %d);\n", r, r)
		}
	}
	return ddl
}

// appendSQL appends one event ($1 stream, $2 type, $3 data as text) at
// its stream's next position.
func (sh cShape) appendSQL() string {
	return fmt.Sprintf(`INSERT INTO events (stream_id, stream_position, type, data)
SELECT $1::text, coalesce(max(stream_position), %d) + 1, $2, $3::text::%s FROM events WHERE stream_id = $1::text`, sh.first-1, sh.data)
}

// cPlan is everything a seed decides.
type cPlan struct {
	seed     uint64
	duration time.Duration
	projs    []cProj
	shape    cShape  // the events table
	nodes    int     // engine nodes on the same configuration (1 or 2)
	writers  int     // concurrent writers
	streams  int     // streams they share
	accounts int     // rows of the total part every stream shares
	backlog  int     // events appended before the engine starts
	bigTx    float64 // share of transactions of 50–300 events
	idle     float64 // share of transactions followed by an idle period
	poison   float64 // share of events that fail (in a projection that cares)
	steps    []cStep
	// unparked lists the projections whose on_error park runs as
	// dead_letter (withoutPark).
	unparked []string
	// bump is the projection that gets a v2 at the end (promoted, v1
	// retired), -1 none.
	bump int
}

// withoutPark runs the projections that drew on_error = "park" under
// "dead_letter" instead, the draws otherwise unchanged
// (PGSCRIBE_CAMPAIGN_PARK=0): to tell whether a violation needs parking.
func (pl cPlan) withoutPark() cPlan {
	projs := slices.Clone(pl.projs)
	for i := range projs {
		if projs[i].onError == "park" {
			projs[i].onError = ""
			pl.unparked = append(slices.Clone(pl.unparked), projs[i].name)
		}
	}
	pl.projs = projs
	return pl
}

// newPlan draws the plan of seed for a history of duration.
func newPlan(seed uint64, duration time.Duration) cPlan {
	rng := rand.New(rand.NewPCG(seed, 0x70676a73)) // "pgjs"
	pl := cPlan{seed: seed, duration: duration}
	n := 1 + rng.IntN(4)
	for i := range n {
		pl.projs = append(pl.projs, drawProj(rng, i))
	}
	pl.nodes = 1 + rng.IntN(2)
	pl.writers = 1 + rng.IntN(4)
	pl.streams = 3 + rng.IntN(18)
	pl.accounts = 2 + rng.IntN(6)
	pl.backlog = rng.IntN(3) * rng.IntN(800)
	pl.bigTx = []float64{0, 0.02, 0.08}[rng.IntN(3)]
	pl.idle = []float64{0, 0.05, 0.2}[rng.IntN(3)]
	pl.poison = []float64{0, 0.01, 0.05}[rng.IntN(3)]

	total := 0
	for _, k := range campaignSteps {
		total += k.weight
	}
	at := 2 * time.Second
	for at < duration {
		w := rng.IntN(total)
		var kind string
		for _, k := range campaignSteps {
			if w -= k.weight; w < 0 {
				kind = k.kind
				break
			}
		}
		pl.steps = append(pl.steps, cStep{at: at, kind: kind, target: rng.IntN(64),
			hold: time.Duration(rng.Int64N(int64(3 * time.Second)))})
		at += 2*time.Second + time.Duration(rng.Int64N(int64(8*time.Second)))
	}
	// The events table is drawn from a stream of its own, so that adding
	// it left the rest of every seed's plan as it was.
	srng := rand.New(rand.NewPCG(seed, 0x73686170)) // "shap"
	pl.shape = cShape{id: []string{"uuid", "bigint"}[srng.IntN(2)], data: []string{"jsonb", "json"}[srng.IntN(2)],
		occurredAt: []string{"timestamptz", "timestamp"}[srng.IntN(2)], partitioned: srng.IntN(2) == 0, first: srng.IntN(2)}
	pl.more()
	// on_error is drawn from a stream of its own too (generator 5), so
	// that adding it changed no generator-4 draw: a sixth of the
	// projections halt, a sixth park.
	orng := rand.New(rand.NewPCG(seed, 0x6f6e6572)) // "oner"
	for i := range pl.projs {
		pl.projs[i].onError = []string{"", "", "", "", "halt", "park"}[orng.IntN(6)]
	}
	// The version bump at the end (generator 6, a stream of its own): for
	// half the seeds, a projection under on_error = "dead_letter" without
	// an sql rule (its statement is not rewritten for the new schema:
	// v2 would write v1's table) gets a v2, promoted, v1 retired.
	pl.bump = -1
	brng := rand.New(rand.NewPCG(seed, 0x62756d70)) // "bump"
	if brng.IntN(2) == 0 {
		start := brng.IntN(len(pl.projs))
		for k := range pl.projs {
			if p := pl.projs[(start+k)%len(pl.projs)]; p.onError == "" && !p.has(partTrail) {
				pl.bump = (start + k) % len(pl.projs)
				break
			}
		}
	}
	// Generator 7, a stream of its own: each alter-table step renames a
	// column a rule writes instead, with even odds, and a third of the
	// kill-9 steps after the first strike while the connections are cut
	// (the first stays: make test's fixed seeds keep their kill-9).
	krng := rand.New(rand.NewPCG(seed, 0x62726b21)) // "brk!"
	kills := 0
	for i := range pl.steps {
		switch st := &pl.steps[i]; st.kind {
		case stepAlter:
			if krng.IntN(2) == 0 {
				st.kind = stepBreak
			}
		case stepKill:
			if kills++; krng.IntN(3) == 0 && kills > 1 {
				st.kind = stepOverlap
			}
		}
	}
	return pl
}

// breakable returns a read model of the projection and a column of it
// that its rules write whatever the event (the part picked by target
// among those that have one): renamed, the next batch with an event of
// its types fails with 42703 (undefined_column), a structural failure.
// "" when it has none (only the fail part).
func (p cProj) breakable(target int) (table, column string) {
	cols := map[string]string{partRows: "v", partSeen: "stream_position", partTrail: "positions", partTotal: "n",
		partNote: "name", partCheck: "q", partUpd: "opened", partDel: "stream_position"}
	var parts []string
	for _, part := range p.parts {
		if cols[part] != "" {
			parts = append(parts, part)
		}
	}
	if len(parts) == 0 {
		return "", ""
	}
	part := parts[target%len(parts)]
	return p.tbl(part), cols[part]
}

// drawProj draws projection i (p<i+1>) from rng.
func drawProj(rng *rand.Rand, i int) cProj {
	p := cProj{name: fmt.Sprintf("p%d", i+1)}
	switch rng.IntN(3) {
	case 0: // the default group
	case 1:
		p.group = "g1"
	case 2:
		p.group = "solo" + p.name // alone in a group of its own
	}
	for _, ty := range campaignTypes {
		if rng.IntN(3) > 0 {
			p.types = append(p.types, ty)
		}
	}
	if len(p.types) == 0 {
		p.types = []string{campaignTypes[rng.IntN(len(campaignTypes))]}
	}
	for _, part := range campaignParts {
		if rng.IntN(2) == 0 {
			p.parts = append(p.parts, part)
		}
	}
	if !slices.ContainsFunc(p.parts, func(s string) bool { return s != partFail }) {
		p.parts = append(p.parts, partRows) // something to compare
	}
	return p
}

// more draws what generator 4 added, from a stream of its own (as the
// events table), so that the draws of generator 3 stay as they were: a
// third of the seeds get 1 to 8-n more projections (up to 8); every
// projection the upd part (a third, if_missing "ignore" or
// "dead_letter") and the del part (a third); each connection-cut step
// becomes a blackhole, and each deadletter-skip a deadletter-discard, with
// even odds.
func (pl *cPlan) more() {
	mrng := rand.New(rand.NewPCG(pl.seed, 0x6d6f7265)) // "more"
	for i := range pl.steps {
		st := &pl.steps[i]
		swap := mrng.IntN(2) == 0
		switch {
		case swap && st.kind == stepCut:
			st.kind = stepBlackhole
		case swap && st.kind == stepSkip:
			st.kind = stepDiscard
		}
	}
	if n := len(pl.projs); mrng.IntN(3) == 0 && n < 8 {
		for i := range 1 + mrng.IntN(8-n) {
			pl.projs = append(pl.projs, drawProj(mrng, n+i))
		}
	}
	for i := range pl.projs {
		p := &pl.projs[i]
		p.first = pl.shape.first
		if mrng.IntN(3) == 0 {
			p.parts = append(p.parts, partUpd)
			p.ifMissing = []string{"ignore", "dead_letter"}[mrng.IntN(2)]
		}
		if mrng.IntN(3) == 0 {
			p.parts = append(p.parts, partDel)
		}
	}
}

// String is the plan as a failing run prints it.
func (pl cPlan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, history %s, %d engine node(s): %d writers on %d streams (%d shared accounts), backlog %d events, big transactions %.0f%%, idle %.0f%%, poison %.0f%%\n",
		pl.seed, pl.duration, pl.nodes, pl.writers, pl.streams, pl.accounts, pl.backlog, 100*pl.bigTx, 100*pl.idle, 100*pl.poison)
	fmt.Fprintf(&b, "  events table: %s\n", pl.shape)
	for _, p := range pl.projs {
		fmt.Fprintf(&b, "  projection %s: group %s, on %v, parts %v", p.name, p.groupName(), p.types, p.parts)
		if p.has(partUpd) {
			fmt.Fprintf(&b, ", upd if_missing %s", p.ifMissing)
		}
		if p.onError != "" {
			fmt.Fprintf(&b, ", on_error %s", p.onError)
		}
		b.WriteString("\n")
	}
	if len(pl.unparked) > 0 {
		fmt.Fprintf(&b, "  on_error park drawn for %v, run as dead_letter (PGSCRIBE_CAMPAIGN_PARK=0)\n", pl.unparked)
	}
	fmt.Fprintf(&b, "  schedule, %d steps:\n", len(pl.steps))
	for i, s := range pl.steps {
		fmt.Fprintf(&b, "    %2d %s\n", i, s)
	}
	if pl.bump >= 0 {
		fmt.Fprintf(&b, "  at the end: a version bump of %s (v2 beside v1, promote v2, retire v1)\n", pl.projs[pl.bump].name)
	}
	return b.String()
}

// groupOfTwo reports whether two or more projections share a group (a
// group's stream, fanned out by its hub).
func (pl cPlan) groupOfTwo() bool {
	n := map[string]int{}
	for _, p := range pl.projs {
		if n[p.groupName()]++; n[p.groupName()] >= 2 {
			return true
		}
	}
	return false
}

// cEvent is one event a writer appends; its stream position is decided
// at the append (expected version: one more than the stream's last).
type cEvent struct {
	stream, typ string
	data        string // JSON
}

// history draws the events of a writer's transactions: rng is the
// writer's own (seeded from the plan's seed and the writer's number), so
// that a replay appends the same transactions, in the same order per
// writer (how the writers interleave is up to the machine).
type history struct {
	pl  cPlan
	rng *rand.Rand
	seq int
}

func newHistory(pl cPlan, writer int) *history {
	return &history{pl: pl, rng: rand.New(rand.NewPCG(pl.seed, uint64(writer)+1))}
}

// next returns the next transaction and the idle time after it.
func (h *history) next() ([]cEvent, time.Duration) {
	size := 1 + h.rng.IntN(5)
	if h.rng.Float64() < h.pl.bigTx {
		size = 50 + h.rng.IntN(250)
	}
	evs := make([]cEvent, size)
	for i := range evs {
		h.seq++
		name, q, fail := fmt.Sprintf("n%d", h.rng.IntN(10000)), h.rng.IntN(100), false
		if h.rng.Float64() < h.pl.poison {
			switch h.rng.IntN(3) {
			case 0:
				name = "much-too-long-" + name
			case 1:
				q = -1 - q
			case 2:
				fail = true
			}
		}
		evs[i] = cEvent{
			stream: fmt.Sprintf("s-%d", h.rng.IntN(h.pl.streams)),
			typ:    campaignTypes[h.rng.IntN(len(campaignTypes))],
			data: fmt.Sprintf(`{"v": %d, "acct": "a-%d", "amount": %d, "name": %q, "q": %d, "fail": %t}`,
				h.seq, h.rng.IntN(h.pl.accounts), 1+h.rng.IntN(100), name, q, fail),
		}
	}
	pause := time.Duration(5+h.rng.IntN(25)) * time.Millisecond
	if h.rng.Float64() < h.pl.idle {
		pause = time.Duration(200+h.rng.IntN(1300)) * time.Millisecond
	}
	return evs, pause
}
