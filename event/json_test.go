package event

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestDecodeDocument(t *testing.T) {
	decodes := func(doc, key string, want any) {
		t.Helper()
		got, err := DecodeDocument([]byte(doc))
		if err != nil {
			t.Fatalf("DecodeDocument(%s): %v", doc, err)
		}
		if got[key] != want {
			t.Errorf("DecodeDocument(%s)[%q] = %#v (%T), want %#v (%T)", doc, key, got[key], got[key], want, want)
		}
	}
	decodes(`{"n": 9007199254740993}`, "n", int64(9007199254740993)) // big int stays exact
	decodes(`{"n": -42}`, "n", int64(-42))
	decodes(`{"n": 1.5}`, "n", 1.5)
	decodes(`{"n": 1e3}`, "n", 1000.0) // an exponent makes a float
	decodes(`{"s": "x"}`, "s", "x")
	decodes(`7`, "value", int64(7)) // a scalar document
	if _, err := DecodeDocument([]byte(`{`)); err == nil {
		t.Error("DecodeDocument({) = nil error, want one")
	}
}

func TestDecodeNested(t *testing.T) {
	got, err := DecodeDocument([]byte(`{"a": {"b": [1, 2.5]}}`))
	if err != nil {
		t.Fatal(err)
	}
	arr := got["a"].(map[string]any)["b"].([]any)
	if arr[0] != int64(1) || arr[1] != 2.5 {
		t.Fatalf("nested = %#v", arr)
	}
}

func TestLSN(t *testing.T) {
	l, err := ParseLSN("16/B374D848")
	if err != nil {
		t.Fatal(err)
	}
	if l.String() != "16/B374D848" {
		t.Fatalf("round trip = %s", l)
	}
}

// checkDecodeKeys: DecodeKeys(raw, keys) must hold exactly what
// DecodeDocument(raw) holds under those keys (for an object; a document
// that is not an object decodes whole), and fail exactly when it fails.
func checkDecodeKeys(t *testing.T, raw []byte, keys []string) {
	t.Helper()
	full, ferr := DecodeDocument(raw)
	part, perr := DecodeKeys(raw, keys)
	if (ferr != nil) != (perr != nil) {
		t.Fatalf("%q: DecodeDocument err %v, DecodeKeys err %v", raw, ferr, perr)
	}
	if ferr != nil {
		return
	}
	var whole any
	_ = json.Unmarshal(raw, &whole)
	if _, isObject := whole.(map[string]any); !isObject {
		if !reflect.DeepEqual(part, full) {
			t.Fatalf("%q is not an object: DecodeKeys = %#v, want it whole: %#v", raw, part, full)
		}
		return
	}
	want := map[string]any{}
	for _, k := range keys {
		if v, ok := full[k]; ok {
			want[k] = v
		}
	}
	if !reflect.DeepEqual(part, want) {
		t.Fatalf("%q keys %v: DecodeKeys = %#v, want %#v", raw, keys, part, want)
	}
}

func TestDecodeKeys(t *testing.T) {
	docs := []string{
		`{"account_id": "a1", "amount": 9007199254740993, "note": {"deep": [1, 2.5, null, "x"]}, "ok": true}`,
		`{"amount": -42, "amount": 7}`, // a repeated key (json, never jsonb): the last wins
		`{"a\u0062": "esc \"q\" \u00e9", "amount": 1e3, "neg": -0.5, "n": null, "f": false}`,
		`{"amount": 123456789012345678901234567890}`, // beyond int64: float64
		`{"amount": [{"x": 1}], "account_id": {}}`,
		`{}`, ``, `7`, `"s"`, `[1, {"amount": 2}]`, `null`,
		`{"value": 3}`,
		`{"amount": 1,}`, `{"amount": 1`, `{"amount": tru}`, `not json`, `{"a": "\x"}`,
	}
	keys := [][]string{{"amount"}, {"account_id", "amount"}, {"ab", "n", "f", "neg"}, {"missing"}, {"note", "ok"}, {"value"}}
	for _, d := range docs {
		for _, k := range keys {
			checkDecodeKeys(t, []byte(d), k)
		}
	}
}

func FuzzDecodeKeys(f *testing.F) {
	for _, s := range []string{`{"amount": 5, "account_id": "a"}`, `{"amount": {"x": [1, 2]}}`, `[1]`, `{"amount": 1e400}`, `{`} {
		f.Add([]byte(s), "amount")
	}
	f.Fuzz(func(t *testing.T, raw []byte, key string) {
		checkDecodeKeys(t, raw, []string{key, "account_id"})
	})
}

// TestWantUnion: a document wanted whole by one side is wanted whole; else
// both sides' keys, each once, in first-seen order.
func TestWantUnion(t *testing.T) {
	ab, bc := Want{Keys: []string{"a", "b"}}, Want{Keys: []string{"b", "c"}}
	if got := ab.Union(bc); got.All || !reflect.DeepEqual(got.Keys, []string{"a", "b", "c"}) {
		t.Errorf("union of a,b and b,c = %+v, want keys a,b,c", got)
	}
	if got := ab.Union(All); !got.All {
		t.Errorf("union with All = %+v, want All", got)
	}
	if got := (Want{}).Union(Want{}); !got.none() {
		t.Errorf("union of nothing = %+v, want nothing", got)
	}
	if len(ab.Keys) != 2 {
		t.Errorf("Union modified its receiver: %v", ab.Keys)
	}
}
