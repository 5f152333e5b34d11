package main

import (
	"bytes"
	"slices"
	"testing"
)

func TestParseSkip(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []int
		wantErr bool
	}{
		{name: "empty", in: "", want: nil},
		{name: "commas", in: "2,5", want: []int{2, 5}},
		{name: "spaces", in: " 1 3 ", want: []int{1, 3}},
		{name: "not a number", in: "1,x", wantErr: true},
		{name: "negative", in: "-1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSkip(tt.in)
			if (err != nil) != tt.wantErr {
				t.Fatalf("parseSkip(%q) error %v, wantErr %v", tt.in, err, tt.wantErr)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("parseSkip(%q) = %v, want %v", tt.in, got, tt.want)
			}
			if err == nil && join(got) != join(tt.want) {
				t.Errorf("join(%v) = %q", got, join(got))
			}
		})
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{{"-nope"}, {"stray"}, {"-skip", "x"}} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 {
			t.Errorf("run(%q) = %d, want 2 (stderr %q)", args, code, errOut.String())
		}
	}
}
