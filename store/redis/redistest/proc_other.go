//go:build !linux

package redistest

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }

// stopped cannot tell without /proc: Pause returns once the signal is sent.
func stopped(int) bool { return true }
