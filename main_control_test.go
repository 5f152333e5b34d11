package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
)

// The operator controls' flags are checked before any database is read.
func TestControlUsage(t *testing.T) {
	for _, args := range [][]string{
		{"pause"},
		{"pause", "-projection", "p"},
		{"resume", "-version", "1"},
		{"pause", "-projection", "p", "-version", "1", "extra"},
		{"deadletters", "retry", "-id", "x"},
		{"deadletters", "retry", "-id", "0"},
		{"deadletters", "retry", "-projection", "p"},
		{"deadletters", "skip", "-dry-run"},
		{"deadletters", "discard", "-version", "2"},
		{"deadletters", "replay"},
	} {
		var o, e bytes.Buffer
		if err := run(args, &o, &e); exitCode(err) != 2 {
			t.Errorf("pgscribe %s: exit %d (%v), want 2", strings.Join(args, " "), exitCode(err), err)
		}
	}
}

func TestIDList(t *testing.T) {
	var l idList
	for _, s := range []string{"3", "5,7", " 9 "} {
		if err := l.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	if !slices.Equal([]int64(l), []int64{3, 5, 7, 9}) {
		t.Errorf("ids = %v", l)
	}
	for _, bad := range []string{"", "a", "-1", "0", "1,,2"} {
		var l idList
		if l.Set(bad) == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}
