package apply

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgscribe/pgscribe/event"
)

func col(name string, v any) event.Column { return event.Column{Name: name, Value: v} }

func TestBuildGroupSQL(t *testing.T) {
	types := columnTypes{"account_id": "text", "owner": "text", "balance": "bigint", "k": "integer"}
	tests := []struct {
		name      string
		in        event.Intent
		returning bool
		want      string
		wantErr   bool
	}{
		{
			name: "insert key only",
			in:   event.Intent{Op: event.OpInsert, Table: "open_accounts", Key: []event.Column{col("account_id", "a")}},
			want: `INSERT INTO "open_accounts" AS pgscribe_t ("account_id") SELECT u.c1::text FROM unnest($1::text[]) AS u(c1)`,
		},
		{
			name: "update returning the rows that matched", returning: true,
			in:   event.Intent{Op: event.OpUpdate, Table: "b", Key: []event.Column{col("k", 1)}, Inc: []event.Column{col("balance", 3)}},
			want: `UPDATE "b" AS pgscribe_t SET "balance" = pgscribe_t."balance" + u.c2::bigint FROM unnest($1::text[], $2::text[], $3::int4[]) AS u(c1, c2, ord) WHERE pgscribe_t."k" = u.c1::integer RETURNING u.ord`,
		},
		{
			name: "delete returning the rows that matched", returning: true,
			in:   event.Intent{Op: event.OpDelete, Table: "b", Key: []event.Column{col("k", 1)}},
			want: `DELETE FROM "b" AS pgscribe_t USING unnest($1::text[], $2::int4[]) AS u(c1, ord) WHERE pgscribe_t."k" = u.c1::integer RETURNING u.ord`,
		},
		{
			name: "insert",
			in:   event.Intent{Op: event.OpInsert, Table: "activity", Set: []event.Column{col("id", "e1"), col("owner", "o")}},
			want: `INSERT INTO "activity" AS pgscribe_t ("id", "owner") SELECT u.c1, u.c2::text FROM unnest($1::text[], $2::text[]) AS u(c1, c2)`,
		},
		{
			name: "upsert with inc and schema",
			in:   event.Intent{Op: event.OpUpsert, Table: "rm.balances", Key: []event.Column{col("account_id", "a")}, Set: []event.Column{col("owner", "o")}, Inc: []event.Column{col("balance", int64(5))}},
			want: `INSERT INTO "rm"."balances" AS pgscribe_t ("account_id", "owner", "balance") SELECT u.c1::text, u.c2::text, u.c3::bigint FROM unnest($1::text[], $2::text[], $3::text[]) AS u(c1, c2, c3) ON CONFLICT ("account_id") DO UPDATE SET "owner" = EXCLUDED."owner", "balance" = pgscribe_t."balance" + EXCLUDED."balance"`,
		},
		{
			name: "upsert key only",
			in:   event.Intent{Op: event.OpUpsert, Table: "seen", Key: []event.Column{col("k", 1)}},
			want: `INSERT INTO "seen" AS pgscribe_t ("k") SELECT u.c1::integer FROM unnest($1::text[]) AS u(c1) ON CONFLICT ("k") DO NOTHING`,
		},
		{
			name: "update",
			in:   event.Intent{Op: event.OpUpdate, Table: "b", Key: []event.Column{col("k", 1)}, Set: []event.Column{col("owner", "x")}, Inc: []event.Column{col("balance", 3)}},
			want: `UPDATE "b" AS pgscribe_t SET "owner" = u.c2::text, "balance" = pgscribe_t."balance" + u.c3::bigint FROM unnest($1::text[], $2::text[], $3::text[]) AS u(c1, c2, c3) WHERE pgscribe_t."k" = u.c1::integer`,
		},
		{
			name: "delete",
			in:   event.Intent{Op: event.OpDelete, Table: "b", Key: []event.Column{col("k", 1), col("account_id", "a")}},
			want: `DELETE FROM "b" AS pgscribe_t USING unnest($1::text[], $2::text[]) AS u(c1, c2) WHERE pgscribe_t."k" = u.c1::integer AND pgscribe_t."account_id" = u.c2::text`,
		},
		{
			name: "hostile identifiers are quoted",
			in:   event.Intent{Op: event.OpDelete, Table: `x"; drop table y; --`, Key: []event.Column{col(`a"b`, 1)}},
			want: `DELETE FROM "x""; drop table y; --" AS pgscribe_t USING unnest($1::text[]) AS u(c1) WHERE pgscribe_t."a""b" = u.c1`,
		},
		{name: "update without set", in: event.Intent{Op: event.OpUpdate, Table: "b", Key: []event.Column{col("k", 1)}}, wantErr: true},
		{name: "fail is not rendered", in: event.Intent{Op: event.OpFail}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := buildGroupSQL(&tt.in, types, tt.returning)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("sql =\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestEveryOpHasSQL: every op of the op table has its SQL part here, and
// every row op can be rendered and names its privileges.
func TestEveryOpHasSQL(t *testing.T) {
	for _, op := range event.Ops {
		o, ok := opSQLs[op.Op]
		if !ok {
			t.Errorf("op %q has no entry in opSQLs", op.Op)
			continue
		}
		row := op.Kind == event.KindRow
		if (o.build != nil) != row || (o.privileges != nil) != row {
			t.Errorf("op %q (kind %d): build and privileges must be set exactly for row ops", op.Op, op.Kind)
		}
		if o.onConflict && op.Key != event.Required {
			t.Errorf("op %q uses ON CONFLICT on a key it does not require", op.Op)
		}
		if row && len(Privileges(op.Op, []string{"k"}, []string{"s"}, nil)) == 0 {
			t.Errorf("op %q needs no privilege", op.Op)
		}
		if o.stores == 0 {
			t.Errorf("op %q does not say which columns its statement stores", op.Op)
		}
		if !row && o.stores != storesNone {
			t.Errorf("op %q (kind %d) stores columns but writes no rows of its own", op.Op, op.Kind)
		}
		// IncAdds must say what the statement does with inc: add it to
		// the stored value (verify then reads inc-only writes as commuting).
		if row && op.Write != event.Forbidden {
			in := event.Intent{Op: op.Op, Table: "t", Key: []event.Column{col("k", 1)}, Inc: []event.Column{col("n", 1)}}
			q, err := buildGroupSQL(&in, columnTypes{}, false)
			if err != nil {
				t.Errorf("op %q: render an inc write: %v", op.Op, err)
			} else if adds := strings.Contains(q, alias+`."n" +`); adds != op.IncAdds {
				t.Errorf("op %q: IncAdds is %v, but its statement adds inc to the stored value: %v\n%s", op.Op, op.IncAdds, adds, q)
			}
		} else if op.IncAdds {
			t.Errorf("op %q has IncAdds but no inc", op.Op)
		}
	}
	if len(opSQLs) != len(event.Ops) {
		t.Errorf("opSQLs has %d entries, event.Ops %d", len(opSQLs), len(event.Ops))
	}
}

func TestGroupArgs(t *testing.T) {
	a := &event.Intent{Op: event.OpUpsert, Table: "b", Key: []event.Column{col("k", "a")}, Inc: []event.Column{col("n", int64(1))}}
	b := &event.Intent{Op: event.OpUpsert, Table: "b", Key: []event.Column{col("k", "b")}, Inc: []event.Column{col("n", 2.5)}}
	s := newStatements()
	_, args, err := s.groupSQL(&group{shape: shapeOf(a), first: a, rows: []*event.Intent{a, b}}, columnTypes{})
	if err != nil {
		t.Fatal(err)
	}
	str := func(v string) *string { return &v }
	want := []any{pgtype.FlatArray[*string]{str("a"), str("b")}, pgtype.FlatArray[*string]{str("1"), str("2.5")}}
	if !reflect.DeepEqual(args, want) {
		t.Fatalf("args = %v", args)
	}
}

func TestTextValue(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	tests := []struct {
		name string
		in   any
		want string
		null bool
	}{
		{name: "nil", in: nil, null: true},
		{name: "int64 exact", in: int64(9007199254740993), want: "9007199254740993"},
		{name: "float", in: 0.1, want: "0.1"},
		{name: "float infinity", in: posInf(), want: "Infinity"},
		{name: "bool", in: true, want: "true"},
		{name: "time keeps zone and micros", in: ts, want: "2026-01-02 03:04:05.123456Z"},
		{name: "duration", in: 1500 * time.Millisecond, want: "1500000 microseconds"},
		{name: "map as json", in: map[string]any{"a": int64(1)}, want: `{"a":1}`},
		{name: "slice as json", in: []any{"x", int64(2)}, want: `["x",2]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := textValue(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if tt.null {
				if got != nil {
					t.Fatalf("got %q, want NULL", *got)
				}
				return
			}
			if got == nil || *got != tt.want {
				t.Fatalf("got %v, want %q", got, tt.want)
			}
		})
	}
}

func posInf() float64 { var z float64; return 1 / z }
