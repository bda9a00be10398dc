package main

import (
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
)

// TestListenUnix_ModeBeforeAnyConnect: with a mode, the socket appears at
// its path already with that mode (made in a private directory, then
// linked: no moment with the umask's permissions), nothing but its lock
// is left beside it, it accepts connections, and Close removes it.
func TestListenUnix_ModeBeforeAnyConnect(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rls.sock")
	lis, err := listenUnix(path, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode().Type() != fs.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket %v %v, want a socket with mode 0600", fi, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 2 || entries[0].Name() != "rls.sock" || entries[1].Name() != "rls.sock.lock" {
		t.Errorf("%v in the directory, want the socket and its lock only", entries)
	}
	go func() {
		if c, err := lis.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c.Close()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("after Close: %v, want the socket removed", err)
	}
}
