package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Sluice is a running `sluice serve` (or `sluice bench --noop-listen`).
type Sluice struct {
	Name string
	// GRPC and HTTP are the addresses of its "serving" log line (a
	// no-op server has GRPC only); Debug
	// (--debug-addr, DEBUG_PORT) and RefMetrics (the reference's
	// Prometheus endpoint, PROMETHEUS_ADDR) are empty when it serves none.
	GRPC, HTTP, Debug, RefMetrics string
	// LogPath is the file its stdout and stderr go to.
	LogPath string

	cmd  *exec.Cmd
	done chan error
}

// startWait bounds how long a sluice may take to log its addresses (a
// loaded 2-core machine can take seconds).
const startWait = 30 * time.Second

// StartSluice runs bin with args and, when env is not nil, that
// environment only, its log in dir/name.log, and waits until the log
// names the addresses it serves on. Start it on port 0 (the addresses are
// read from the log, so that no other process can take a port between a
// probe and the bind) with the text log format (the default).
func StartSluice(bin, name, dir string, args, env []string) (*Sluice, error) {
	s := &Sluice{Name: name, LogPath: filepath.Join(dir, name+".log"), done: make(chan error, 1)}
	logf, err := os.Create(s.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(bin, args...)
	s.cmd.Env, s.cmd.Stdout, s.cmd.Stderr, s.cmd.SysProcAttr = env, logf, logf, procAttr()
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness: %s: %w", name, err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	for deadline := time.Now().Add(startWait); ; {
		if s.readAddrs(s.Log()) {
			return s, nil
		}
		select {
		case err := <-s.done:
			s.done <- err
			return nil, fmt.Errorf("harness: %s exited before serving: %v\n%s", name, err, s.Log())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("harness: %s did not serve within %v:\n%s", name, startWait, s.Log())
		}
	}
}

// readAddrs takes the addresses from a text log; it reports whether the
// "serving" line (logged after the others) was there, or the line of a
// no-op server (`sluice bench --noop-listen`, gRPC only).
func (s *Sluice) readAddrs(log string) bool {
	serving := false
	for line := range strings.Lines(log) {
		switch {
		case strings.Contains(line, " msg=serving "):
			s.GRPC, s.HTTP = field(line, "grpc"), field(line, "http")
			serving = s.GRPC != "" && s.HTTP != ""
		case strings.HasPrefix(line, noopListening):
			s.GRPC = strings.TrimSpace(line[len(noopListening):])
			serving = s.GRPC != ""
		case strings.Contains(line, ` msg="debug endpoints" `):
			s.Debug = field(line, "addr")
		case strings.Contains(line, ` msg="envoyproxy/ratelimit metrics" `):
			s.RefMetrics = field(line, "addr")
		}
	}
	return serving
}

// noopListening starts the line that names a no-op server's address.
const noopListening = "no-op RLS server listening on "

// field is the value of key=value in a log line (values without spaces).
func field(line, key string) string {
	for f := range strings.FieldsSeq(line) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// Pid is the process id.
func (s *Sluice) Pid() int { return s.cmd.Process.Pid }

// Log is what the process has logged so far.
func (s *Sluice) Log() string {
	b, _ := os.ReadFile(s.LogPath)
	return string(b)
}

// Exited reports whether the process has ended, and how.
func (s *Sluice) Exited() (bool, error) {
	select {
	case err := <-s.done:
		s.done <- err
		return true, err
	default:
		return false, nil
	}
}

// Stop sends SIGTERM and waits for the process to drain and exit, killing
// it after 15 s. Stopping a stopped process does nothing.
func (s *Sluice) Stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		s.done <- errors.Join(<-s.done, errors.New("harness: killed after 15s"))
	}
}
