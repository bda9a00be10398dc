//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"syscall"
)

// lockSocket takes an exclusive, non-blocking flock on path, creating the
// file if needed. The kernel releases it when the process ends, however
// it ends; the file itself is left in place (removing it would let two
// processes lock two different files of the same name).
func lockSocket(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("socket lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: another sluice holds %s; stop it first, or give this one another socket path", errSocketInUse, path)
		}
		return nil, fmt.Errorf("socket lock %s: %w", path, err)
	}
	return f, nil
}
