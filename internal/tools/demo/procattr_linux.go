package main

import "syscall"

// engineProcAttr puts the engine in a process group of its own, so that
// only the demo signals it (see run), and has the kernel send it SIGTERM
// should the demo die without stopping it.
func engineProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
