package main

import (
	"io"
	"strings"
	"testing"
)

// pgscribe wait takes exactly one target, and a stream wait its position
// (which may be 0: streams can start there); anything else is a usage
// error, before any configuration is read.
func TestWaitUsage(t *testing.T) {
	t.Setenv("PGSCRIBE_CONFIG", "")
	t.Chdir(t.TempDir()) // no ./pgscribe.toml: a valid command fails later, on the config
	base := []string{"wait", "-projection", "p", "-version", "1"}
	tests := []struct {
		name  string
		args  []string
		usage bool
	}{
		{"no target", nil, true},
		{"two targets", []string{"-caught-up", "-lsn", "0/1"}, true},
		{"stream without position", []string{"-stream", "s"}, true},
		{"position without stream", []string{"-position", "3"}, true},
		{"zero timeout", []string{"-caught-up", "-timeout", "0s"}, true},
		{"caught up", []string{"-caught-up"}, false},
		{"lsn", []string{"-lsn", "0/16B3F28"}, false},
		{"stream at 0", []string{"-stream", "s", "-position", "0"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := run(append(append([]string{}, base...), tt.args...), io.Discard, io.Discard)
			if err == nil {
				t.Fatal("no error")
			}
			// A valid command gets as far as the missing config file
			// (also exit 2): tell the two apart by the message.
			isUsage := exitCode(err) == 2 && strings.HasPrefix(err.Error(), "wait needs")
			if isUsage != tt.usage {
				t.Errorf("err = %v, usage error %v, want %v", err, isUsage, tt.usage)
			}
		})
	}
}
