package event

import (
	"testing"
)

func TestDecodeDocument(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		key     string
		want    any
		wantErr bool
	}{
		{name: "big int exact", in: `{"n": 9007199254740993}`, key: "n", want: int64(9007199254740993)},
		{name: "negative int", in: `{"n": -42}`, key: "n", want: int64(-42)},
		{name: "float", in: `{"n": 1.5}`, key: "n", want: 1.5},
		{name: "exponent is float", in: `{"n": 1e3}`, key: "n", want: 1000.0},
		{name: "string", in: `{"s": "x"}`, key: "s", want: "x"},
		{name: "scalar document", in: `7`, key: "value", want: int64(7)},
		{name: "bad json", in: `{`, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeDocument([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
			if tt.wantErr {
				return
			}
			if got[tt.key] != tt.want {
				t.Fatalf("got %#v (%T), want %#v (%T)", got[tt.key], got[tt.key], tt.want, tt.want)
			}
		})
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
