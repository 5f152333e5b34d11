package apply

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/pgscribe/pgscribe/event"
)

// keyValues' fast paths render what fmt's "%T:%v" does.
func TestKeyValuesAsFmt(t *testing.T) {
	type named string
	vals := []any{"", "a\x00b", "ü", int64(0), int64(-1), int64(math.MaxInt64), int64(math.MinInt64), true, false,
		nil, 1.5, float64(1e21), int(3), int32(-4), named("x"), []byte("b"), time.Unix(0, 0).UTC(), []any{"a", int64(1)}}
	for _, v := range vals {
		for _, cs := range [][]event.Column{{{Name: "k", Value: v}}, {{Name: "a", Value: "s"}, {Name: "b", Value: v}}} {
			var want string
			for _, c := range cs {
				want += fmt.Sprintf("%T:%v\x00", c.Value, c.Value)
			}
			if got := keyValues(cs); got != want {
				t.Errorf("keyValues(%#v) = %q, want %q", cs, got, want)
			}
		}
	}
}

func BenchmarkKeyValues(b *testing.B) {
	cs := []event.Column{{Name: "account_id", Value: "acct-000123"}, {Name: "n", Value: int64(42)}}
	for b.Loop() {
		_ = keyValues(cs)
	}
}

func BenchmarkKeyValuesFmt(b *testing.B) {
	cs := []event.Column{{Name: "account_id", Value: "acct-000123"}, {Name: "n", Value: int64(42)}}
	for b.Loop() {
		var sb strings.Builder
		for _, c := range cs {
			fmt.Fprintf(&sb, "%T:%v\x00", c.Value, c.Value)
		}
		_ = sb.String()
	}
}
