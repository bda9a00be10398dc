// Package memcachetest starts real memcached processes for tests, on free
// loopback ports, and kills them when the test ends. It needs Debian's
// memcached on PATH (`make deps` installs it).
package memcachetest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// startTimeout bounds how long memcached may take to answer.
const startTimeout = 10 * time.Second

// Server is one memcached process.
type Server struct {
	// Addr is host:port of its port (TLS only when started with StartTLS).
	Addr string
	// Port is the port in Addr.
	Port int

	t    testing.TB
	args []string
	tls  *tls.Config // to probe a TLS server; nil for plain TCP

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan error
	stderr bytes.Buffer
}

// Start starts a memcached with 64 MB of memory on a free loopback port,
// UDP off. Extra arguments are passed through.
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	port := redistest.FreePort(t)
	s := &Server{t: t, Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	s.args = append([]string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64", "-t", "2"}, extra...)
	s.start()
	t.Cleanup(s.Kill)
	return s
}

// StartTLS starts a memcached that serves only TLS with the given PEM
// files; it requires a client certificate signed by caFile. probe is the
// client configuration that tells when it is ready.
func StartTLS(t testing.TB, certFile, keyFile, caFile string, probe *tls.Config) *Server {
	t.Helper()
	port := redistest.FreePort(t)
	s := &Server{t: t, Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), tls: probe}
	s.args = []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64", "-t", "2", "-Z",
		"-o", fmt.Sprintf("ssl_chain_cert=%s,ssl_key=%s,ssl_ca_cert=%s,ssl_verify_mode=2", certFile, keyFile, caFile)}
	s.start()
	t.Cleanup(s.Kill)
	return s
}

func (s *Server) start() {
	s.t.Helper()
	args := s.args
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "root"}, args...) // memcached refuses root without it
	}
	cmd := exec.Command("memcached", args...)
	cmd.SysProcAttr = procAttr()
	s.stderr.Reset()
	cmd.Stdout, cmd.Stderr = &s.stderr, &s.stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("memcachetest: start memcached (make deps installs it): %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for deadline := time.Now().Add(startTimeout); ; {
		if s.ready() {
			break
		}
		select {
		case err := <-exited:
			s.t.Fatalf("memcachetest: memcached exited: %v\n%s", err, s.stderr.String())
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			s.t.Fatalf("memcachetest: memcached not ready after %v", startTimeout)
		}
	}
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
}

func (s *Server) dial() (net.Conn, error) {
	d := net.Dialer{Timeout: time.Second}
	if s.tls != nil {
		return tls.DialWithDialer(&d, "tcp", s.Addr, s.tls)
	}
	return d.Dial("tcp", s.Addr)
}

// ready reports whether the server answers "version".
func (s *Server) ready() bool {
	c, err := s.dial()
	if err != nil {
		return false
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("version\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && len(line) > 8 && line[:8] == "VERSION "
}

// Keys lists the keys the server holds (lru_crawler metadump), for tests
// that check where counts went. It fails the test if the server does not
// answer.
func (s *Server) Keys() []string {
	s.t.Helper()
	var keys []string
	for _, line := range s.ask("keys", "lru_crawler metadump all") {
		if k, ok := strings.CutPrefix(line, "key="); ok {
			k, _, _ = strings.Cut(k, " ")
			if u, err := url.QueryUnescape(k); err == nil {
				k = u
			}
			keys = append(keys, k)
		}
	}
	return keys
}

// Conns is the number of client connections the server has open, the
// one that asks not counted (its stats' curr_connections less one). The
// server counts a connection the client closed until it reads the close,
// a moment later: wait for a count, do not expect it at once. It fails
// the test if the server does not answer.
func (s *Server) Conns() int {
	s.t.Helper()
	for _, line := range s.ask("conns", "stats") {
		if v, ok := strings.CutPrefix(line, "STAT curr_connections "); ok {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				s.t.Fatalf("memcachetest: conns: %q", line)
			}
			return n - 1
		}
	}
	s.t.Fatal("memcachetest: conns: no curr_connections in the stats")
	return 0
}

// ask sends the command cmd on a connection of its own and returns the
// lines of the answer before its END. It fails the test, naming what,
// if the server does not answer.
func (s *Server) ask(what, cmd string) []string {
	s.t.Helper()
	c, err := s.dial()
	if err != nil {
		s.t.Fatalf("memcachetest: %s: %v", what, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(cmd + "\r\n")); err != nil {
		s.t.Fatalf("memcachetest: %s: %v", what, err)
	}
	var lines []string
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if sc.Text() == "END" {
			return lines
		}
		lines = append(lines, sc.Text())
	}
	s.t.Fatalf("memcachetest: %s: %v", what, sc.Err())
	return nil
}

// Kill stops the process with SIGKILL and waits for it. It does nothing
// if the process is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.exited
	s.cmd = nil
}

// Restart starts the server again on the same port, empty (memcached
// keeps nothing across restarts).
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}

// Pause stops the process with SIGSTOP: connections stay open and nothing
// is answered until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a process Pause stopped.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		_ = s.cmd.Process.Signal(sig)
	}
}
