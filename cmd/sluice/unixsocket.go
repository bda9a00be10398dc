package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
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

// listenUnix listens on a unix socket at path. A socket file already
// there that no process accepts on (left by a process that was killed)
// is replaced; one that a process serves, or a file that is not a
// socket, is an error. The socket gets mode when it is not zero, else
// the process's umask decides (connecting needs write permission). The
// listener removes the file when closed, as the drain on SIGTERM does.
func listenUnix(path string, mode socketMode) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("unix://: no socket path")
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a unix socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another process serves on this socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("stale socket: %w", err)
		}
	}
	if mode == 0 {
		return net.Listen("unix", path)
	}
	return listenUnixMode(path, fs.FileMode(mode))
}

// listenUnixMode listens on a unix socket at path with mode. The socket
// is made in a new directory beside path that only this user may enter,
// given its mode there, then renamed to path: no client can connect to
// it between the listen and the chmod.
func listenUnixMode(path string, mode fs.FileMode) (net.Listener, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), ".sluice-socket-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(dir)
	tmp := filepath.Join(dir, "s")
	lis, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	ul := lis.(*net.UnixListener)
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		ul.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		ul.Close()
		os.Remove(tmp)
		return nil, err
	}
	return &unlinkListener{UnixListener: ul, path: path}, nil
}

// unlinkListener removes its socket file, renamed after the listen, when
// closed.
type unlinkListener struct {
	*net.UnixListener
	path string
}

func (l *unlinkListener) Close() error {
	err := l.UnixListener.Close()
	if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
		err = rerr
	}
	return err
}
