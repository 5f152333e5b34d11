package event

// The op table: what each rule operation is, read by config/ (which fields
// a rule may give), rules/ (what evaluation produces), apply/ (whether
// intents fold) and admin/ (which ops a fixture's intent may have, which
// writes commute between streams). How an op's SQL is built, which
// privileges it needs and which columns it stores is the SQL layer's part,
// apply's opSQLs table, keyed by the same Op; a test there fails if an op
// of this table has no SQL part. Adding an op touches this table, its SQL
// and their tests, and the docs that tests hold to the table: a row of
// docs/config.md's op table (TestDocsOps) and a rule of
// config.toml.example (TestExampleConfigEveryOp).

// Op is a write operation a rule asks for.
type Op string

// The operations a rule can produce.
const (
	OpInsert Op = "insert"
	OpUpsert Op = "upsert"
	OpUpdate Op = "update"
	OpDelete Op = "delete"
	OpSQL    Op = "sql"
	OpFail   Op = "fail"
)

// Use says whether a rule field may, must or must not be given for an op.
type Use int8

// Field uses.
const (
	Forbidden Use = iota
	Optional
	Required
)

// Kind is what evaluating a matching rule produces.
type Kind int8

// Rule kinds.
const (
	// KindRow: an intent that writes one read-model row, identified by its
	// key columns, with set and inc columns.
	KindRow Kind = iota
	// KindStatement: an intent that runs the rule's own SQL with its args.
	KindStatement
	// KindReject: no intent; the event is dead-lettered with the rule's
	// message.
	KindReject
)

// OpSpec describes one op.
type OpSpec struct {
	Op   Op
	Kind Kind
	// Fields of the rule. Write stands for set and inc together: when
	// required, at least one of them must name a column. Args follow SQL.
	Table, Key, Write, SQL, Message Use
	// AnyColumn: key, set and inc are each optional, but together they must
	// name at least one column (a keyless insert needs a set, a key-only
	// insert needs no set).
	AnyColumn bool
	// Folds: consecutive intents on one row with the same columns fold into
	// one write (inc values add, set takes the later value) with the same
	// result as applying them in order.
	Folds bool
	// MayMiss: the write can match no row, which is counted and which the
	// rule's if_missing may turn into a dead letter.
	MayMiss bool
	// IncAdds: inc adds to the row's stored value, so writes that give inc
	// and no set have the same effect on a row in any order (verify reads
	// such rows as commuting between streams).
	IncAdds bool
}

// Intent says whether evaluating a rule of the op produces an intent (a
// row write or a statement), which fixtures and dead letters may name.
func (s OpSpec) Intent() bool { return s.Kind == KindRow || s.Kind == KindStatement }

// Ops is every op, in the order the docs present them.
var Ops = []OpSpec{
	{Op: OpInsert, Kind: KindRow, Table: Required, Key: Optional, Write: Optional, AnyColumn: true},
	{Op: OpUpsert, Kind: KindRow, Table: Required, Key: Required, Write: Optional, Folds: true, IncAdds: true},
	{Op: OpUpdate, Kind: KindRow, Table: Required, Key: Required, Write: Required, Folds: true, MayMiss: true, IncAdds: true},
	{Op: OpDelete, Kind: KindRow, Table: Required, Key: Required, MayMiss: true},
	{Op: OpSQL, Kind: KindStatement, SQL: Required},
	{Op: OpFail, Kind: KindReject, Message: Required},
}

// opIndex finds an op's entry in Ops.
var opIndex = func() map[Op]int {
	m := make(map[Op]int, len(Ops))
	for i, s := range Ops {
		m[s.Op] = i
	}
	return m
}()

// Spec returns the op's description; false for an unknown op.
func (o Op) Spec() (OpSpec, bool) {
	i, ok := opIndex[o]
	if !ok {
		return OpSpec{}, false
	}
	return Ops[i], true
}

// OpNames lists the ops' names in table order.
func OpNames() []string {
	names := make([]string, len(Ops))
	for i, s := range Ops {
		names[i] = string(s.Op)
	}
	return names
}
