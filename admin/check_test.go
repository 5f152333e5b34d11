package admin

import (
	"testing"
)

func TestProblemString(t *testing.T) {
	tests := []struct {
		p    Problem
		want string
	}{
		{Problem{Scope: `balances v1 rule "move"`, Object: `table "balances" column "balance"`, Msg: "type text cannot take inc"},
			`balances v1 rule "move": table "balances" column "balance": type text cannot take inc`},
		{Problem{Scope: "source", Msg: `wal_level is "replica"`}, `source: wal_level is "replica"`},
	}
	for _, tt := range tests {
		if got := tt.p.String(); got != tt.want {
			t.Errorf("got  %s\nwant %s", got, tt.want)
		}
	}
}
