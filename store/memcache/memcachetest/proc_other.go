//go:build !linux

package memcachetest

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
