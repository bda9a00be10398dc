package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
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
		return fmt.Errorf("%q: want octal permission bits, 0600 to 0777", s)
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
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if mode != 0 {
		if err := os.Chmod(path, fs.FileMode(mode)); err != nil {
			lis.Close()
			return nil, err
		}
	}
	return lis, nil
}
