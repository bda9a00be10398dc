//go:build !unix

package main

import "os"

// lockSocket opens path without locking it: flock is Unix's. On other
// systems two processes are kept apart only by the check that the
// socket accepts connections.
func lockSocket(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
}
