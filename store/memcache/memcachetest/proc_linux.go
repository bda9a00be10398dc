package memcachetest

import "syscall"

// procAttr makes memcached die with the test process, even one killed by
// a panic that skipped the cleanups.
func procAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} }
