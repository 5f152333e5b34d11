package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// build describes this binary for `pgscribe version`.
type build struct {
	version, commit, date, goVersion string
	modified                         bool
}

// buildInfo merges what -ldflags set with the VCS information the go
// command embeds when it builds inside a git clone (-buildvcs, the default
// there): the flags win, the embedded values fill in what they leave empty.
// Neither is present in a `go build -buildvcs=false` of a bare source tree;
// the commit then reads "unknown".
func buildInfo() build {
	b := build{version: version, commit: commit, date: commitDate,
		goVersion: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return b
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			if b.commit == "" {
				b.commit = s.Value
			}
		case "vcs.time":
			if b.date == "" {
				b.date = s.Value
			}
		case "vcs.modified":
			b.modified = b.modified || s.Value == "true"
		}
	}
	return b
}

// writeVersion prints the version, the commit and its date, and the Go
// toolchain: what a bug report needs.
func writeVersion(w io.Writer) {
	b := buildInfo()
	c, d := b.commit, b.date
	if c == "" {
		c = "unknown"
	}
	if b.modified {
		c += " (with uncommitted changes)"
	}
	if d == "" {
		d = "unknown"
	}
	fmt.Fprintf(w, "pgscribe %s\ncommit   %s\ndate     %s\ngo       %s\n", b.version, c, d, b.goVersion)
}
