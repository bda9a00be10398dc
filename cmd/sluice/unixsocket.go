package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// socketMode is --grpc-socket-mode: the permission bits given to the
// gRPC unix socket, in octal; zero leaves what the umask made.
type socketMode fs.FileMode

func (m *socketMode) String() string {
	if *m == 0 {
		return ""
	}
	return fmt.Sprintf("%#o", uint32(*m))
}

func (m *socketMode) Set(s string) error {
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || v == 0 || v > 0o777 {
		return fmt.Errorf("%q: want octal permission bits, 1 to 0777 (e.g. 0660)", s)
	}
	*m = socketMode(v)
	return nil
}

// listenUnix listens on a unix socket at path. The process first takes
// an exclusive lock on PATH.lock (created if missing, left in place at
// exit), held until the listener is closed: while another sluice holds
// it, listenUnix fails. Holding the lock, a socket file already at path
// is replaced only when connecting to it is refused (no process listens:
// left by a process that was killed); one that accepts, or that does not
// answer (a busy server), or a file that is not a socket, is an error.
// The socket gets mode when it is not zero, else the process's umask
// decides (connecting needs write permission). Close removes the socket
// file only while it is still the one this listener made, so a process
// that replaced it keeps its path.
func listenUnix(path string, mode socketMode) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("unix://: no socket path")
	}
	lock, err := lockSocket(path + ".lock")
	if err != nil {
		return nil, err
	}
	lis, err := listenUnixLocked(path, fs.FileMode(mode))
	if err != nil {
		lock.Close()
		return nil, err
	}
	fi, err := os.Lstat(path)
	if err != nil {
		lis.Close()
		lock.Close()
		return nil, err
	}
	return &unlinkListener{UnixListener: lis, path: path, made: fi, lock: lock}, nil
}

// errSocketInUse is listenUnix's error when a live process serves on the
// path.
var errSocketInUse = errors.New("another process serves on this socket")

// listenUnixLocked listens on path, holding its lock: see listenUnix.
func listenUnixLocked(path string, mode fs.FileMode) (*net.UnixListener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a unix socket", path)
		}
		c, err := net.DialTimeout("unix", path, time.Second)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: %w (it accepts connections)", path, errSocketInUse)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("%s: connecting to it failed other than by refusal (a busy server?), so it is not replaced: %w", path, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("stale socket: %w", err)
		}
	}
	var lis *net.UnixListener
	var err error
	if mode == 0 {
		lis, err = listenUnixPlain(path)
	} else {
		lis, err = listenUnixMode(path, mode)
	}
	if err != nil {
		return nil, err
	}
	lis.SetUnlinkOnClose(false)
	return lis, nil
}

func listenUnixPlain(path string) (*net.UnixListener, error) {
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	return lis.(*net.UnixListener), nil
}

// listenUnixMode listens on a unix socket at path with mode. The socket
// is made in a new directory beside path that only this user may enter,
// given its mode there, then linked to path, which fails if anything
// appeared there meanwhile (a rename would replace it): no client can
// connect to it between the listen and the chmod.
func listenUnixMode(path string, mode fs.FileMode) (*net.UnixListener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".sluice-socket-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tmp := filepath.Join(dir, "s")
	lis, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ul := lis.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		ul.Close()
		return nil, err
	}
	if err := os.Link(tmp, path); err != nil {
		ul.Close()
		return nil, err
	}
	return ul, nil
}

// unlinkListener removes its socket file when closed, if the file at
// its path is still the one it made, then releases the path's lock.
type unlinkListener struct {
	*net.UnixListener
	path string
	made fs.FileInfo
	lock interface{ Close() error }
}

func (l *unlinkListener) Close() error {
	err := l.UnixListener.Close()
	if fi, serr := os.Lstat(l.path); serr == nil && os.SameFile(fi, l.made) {
		if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
			err = rerr
		}
	}
	if lerr := l.lock.Close(); lerr != nil && err == nil {
		err = lerr
	}
	return err
}
