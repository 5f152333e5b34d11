//go:build unix && !linux

package main

import "syscall"

// engineProcAttr puts the engine in a process group of its own, so that
// only the demo signals it (see run).
func engineProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
