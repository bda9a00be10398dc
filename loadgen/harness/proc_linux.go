package harness

import "syscall"

// procAttr makes a child die with the load program, even one killed by a
// signal that skipped its deferred clean-ups.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
