package apply

import (
	"reflect"
	"testing"

	"github.com/pgscribe/pgscribe/event"
)

func TestRender(t *testing.T) {
	tests := []struct {
		name     string
		in       event.Intent
		wantSQL  string
		wantArgs []any
		wantErr  bool
	}{
		{
			name:     "insert",
			in:       event.Intent{Op: event.OpInsert, Table: "activity", Key: []event.Column{{Name: "id", Value: "e1"}}, Set: []event.Column{{Name: "type", Value: "T"}}},
			wantSQL:  `INSERT INTO "activity" ("id", "type") VALUES ($1, $2)`,
			wantArgs: []any{"e1", "T"},
		},
		{
			name:     "upsert with inc and schema",
			in:       event.Intent{Op: event.OpUpsert, Table: "rm.balances", Key: []event.Column{{Name: "account_id", Value: "a"}}, Set: []event.Column{{Name: "owner", Value: "o"}}, Inc: []event.Column{{Name: "balance", Value: int64(5)}}},
			wantSQL:  `INSERT INTO "rm"."balances" ("account_id", "owner", "balance") VALUES ($1, $2, $3) ON CONFLICT ("account_id") DO UPDATE SET "owner" = EXCLUDED."owner", "balance" = "rm"."balances"."balance" + EXCLUDED."balance"`,
			wantArgs: []any{"a", "o", int64(5)},
		},
		{
			name:     "upsert key only",
			in:       event.Intent{Op: event.OpUpsert, Table: "seen", Key: []event.Column{{Name: "id", Value: "x"}}},
			wantSQL:  `INSERT INTO "seen" ("id") VALUES ($1) ON CONFLICT ("id") DO NOTHING`,
			wantArgs: []any{"x"},
		},
		{
			name:     "update",
			in:       event.Intent{Op: event.OpUpdate, Table: "b", Key: []event.Column{{Name: "k", Value: 1}}, Set: []event.Column{{Name: "s", Value: 2}}, Inc: []event.Column{{Name: "n", Value: 3}}},
			wantSQL:  `UPDATE "b" SET "s" = $1, "n" = "n" + $2 WHERE "k" = $3`,
			wantArgs: []any{2, 3, 1},
		},
		{
			name:     "delete",
			in:       event.Intent{Op: event.OpDelete, Table: "b", Key: []event.Column{{Name: "k", Value: 1}, {Name: "j", Value: 2}}},
			wantSQL:  `DELETE FROM "b" WHERE "k" = $1 AND "j" = $2`,
			wantArgs: []any{1, 2},
		},
		{
			name:     "hostile identifier is quoted",
			in:       event.Intent{Op: event.OpDelete, Table: `x"; drop table y; --`, Key: []event.Column{{Name: `a"b`, Value: 1}}},
			wantSQL:  `DELETE FROM "x""; drop table y; --" WHERE "a""b" = $1`,
			wantArgs: []any{1},
		},
		{name: "update without set", in: event.Intent{Op: event.OpUpdate, Table: "b", Key: []event.Column{{Name: "k", Value: 1}}}, wantErr: true},
		{name: "fail is not rendered", in: event.Intent{Op: event.OpFail}, wantErr: true},
	}
	r := newRenderer()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := 0; i < 2; i++ { // second pass hits the cache
				sql, args, err := r.render(&tt.in)
				if (err != nil) != tt.wantErr {
					t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
				}
				if tt.wantErr {
					return
				}
				if sql != tt.wantSQL {
					t.Fatalf("sql =\n%s\nwant\n%s", sql, tt.wantSQL)
				}
				if !reflect.DeepEqual(args, tt.wantArgs) {
					t.Fatalf("args = %#v, want %#v", args, tt.wantArgs)
				}
			}
		})
	}
}
