// Package rules compiles a projection's TOML rules into a Program and
// evaluates events into write intents.
//
// The package is pure: it knows nothing of SQL, does no I/O, and reads no
// clock. A Program is a function of the event alone, so replaying an event
// always yields the same intents.
//
// # Compilation
//
// Compile compiles every expression of a Spec exactly once with
// github.com/expr-lang/expr against an environment describing the event:
//
//	id              string
//	type            string
//	stream_id       string
//	stream_position int        (Go int; pgscribe requires a 64-bit platform)
//	position        int
//	occurred_at     time.Time
//	data            map[string]any  (decoded jsonb, see event.DecodeDocument)
//	metadata        map[string]any
//
// The now() builtin is disabled (rules must not read the clock) and date()
// parses in UTC unless given a timezone. Unknown names, syntax errors and
// statically wrong result types (a `when` that is not boolean, a `message`
// that is not a string, an `inc` that is not a number) are compile errors.
// Compile reports every error of the spec at once, each a *CompileError
// naming projection, rule, field ("when", "key.id", "set.balance",
// "inc.balance", "args[1]", "message", …) and the 1-based line and column
// within the expression.
//
// Compile also checks each rule's fields against the op table
// (event.Ops) with CheckFields and CheckOverlap, the functions the config
// loader uses: insert needs table and at least one key, set or inc column;
// upsert needs table and key (set and inc optional: a key-only upsert
// inserts the row if absent); update needs table, key and set or inc;
// delete needs table and key and takes no set or inc; sql needs sql (args
// optional) and nothing else; fail needs message; if_missing ("ignore" or
// "dead_letter") is for update and delete only. A column may appear in
// only one of key, set and inc.
//
// A rule without a name is named "<type>#<index>": type is the first type
// of its `on` ("*" when `on` is absent) and index its 1-based position
// among the projection's rules, e.g. "Deposited#2". The name is the rule's
// identity in dead letters (error_kind "rule:<name>") and must be unique in
// the projection; renaming or reordering unnamed rules changes it.
//
// # Evaluation
//
// Eval runs, in rule order, every rule whose `on` lists the event's type
// (or that has no `on`) and whose `when` is true, and returns one intent per
// data rule (insert, upsert, update, delete, sql). An event that matches no
// rule yields no intents and no error: the engine counts it as skipped.
//
// An event's intents are all or none: the first error — an expression
// failing at run time, a missing field, a value of the wrong type, or a
// matching `fail` rule — is returned as an *EvalError and no intents at all.
// Strictness is deliberate, following the contract that a missing field
// dead-letters the event rather than writing a wrong row:
//
//   - accessing a missing key yields nil in expr; a nil key, set, inc or
//     args value is an error (ErrNilValue). There is no way to write SQL
//     NULL from a key/set/inc column; default explicitly instead
//     (`data.note ?? ""`), or use an op = "sql" rule with NULLIF.
//   - a `when` must yield a boolean; nil (a missing field) is an error, not
//     false. Write `data.vip ?? false` or `data.vip == true` to treat a
//     missing flag as false.
//   - an inc value must be a number (int64 or float64).
//
// # Values
//
// Intent values are int64 (every Go integer result, including expr's int,
// is converted), float64, string, bool, time.Time, time.Duration, or, for
// objects and arrays (`set = { payload = "data" }`), map[string]any and
// []any whose elements are JSON-encodable; the SQL layer encodes those as
// JSON. Integer arithmetic on jsonb integers is exact in the int64 range:
// `data.amount + 1` and `-data.amount` never pass through float64. It wraps
// on overflow as Go integers do, and expr's `/` always divides in float64;
// use `%` and subtraction, or int(), knowingly. Key, Set and Inc columns of
// an intent are sorted by column name.
//
// # Concurrency
//
// A Program is immutable after Compile and safe for concurrent use by any
// number of goroutines; each Eval borrows a virtual machine from a pool.
package rules
