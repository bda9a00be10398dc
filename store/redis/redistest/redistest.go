// Package redistest starts real redis-server, Redis Cluster and Sentinel
// processes for tests, on free loopback ports in temporary directories, and
// kills them when the test ends. It needs Debian's redis-server,
// redis-sentinel and redis-cli on PATH (`make deps` installs them).
package redistest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a process may take to become ready.
const startTimeout = 10 * time.Second

// Server is one redis-server (or redis-sentinel) process.
type Server struct {
	// Addr is host:port of its plain TCP port (its TLS port when started
	// with TLS).
	Addr string
	// Port is the port in Addr.
	Port int

	t     testing.TB
	dir   string
	bin   string
	args  []string
	ready string

	mu     sync.Mutex
	proc   *os.Process
	exited chan error // receives the process's exit
}

// Start starts a redis-server on a free loopback port with persistence off.
// Extra arguments are passed through (e.g. "--requirepass", "secret").
func Start(t testing.TB, extra ...string) *Server {
	t.Helper()
	dir := t.TempDir()
	port := FreePort(t)
	args := []string{"--bind", "127.0.0.1", "--port", strconv.Itoa(port),
		"--dir", dir, "--save", "", "--appendonly", "no",
		"--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no"}
	s := &Server{t: t, dir: dir, bin: "redis-server", args: append(args, extra...),
		ready: "ready to accept connections", Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	s.Restart()
	t.Cleanup(s.Kill)
	return s
}

// StartTLS starts a redis-server that serves only TLS on a free port, with
// the given PEM files; clients must present a certificate signed by ca.
func StartTLS(t testing.TB, certFile, keyFile, caFile string, extra ...string) *Server {
	t.Helper()
	port := FreePort(t)
	args := append([]string{"--port", "0", "--tls-port", strconv.Itoa(port),
		"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile}, extra...)
	s := Start(t, args...)
	s.Port = port
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return s
}

// Dir is the server's working directory.
func (s *Server) Dir() string { return s.dir }

// Kill stops the process with SIGKILL and waits for it. It does nothing
// if the process is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Kill()
	<-s.exited
	s.proc = nil
}

// Pause stops the process with SIGSTOP: its connections stay open and
// answer nothing, as a frozen host, a busy Redis (a slow script, DEBUG
// SLEEP) or a long stall would, until Resume, however long a busy
// machine takes to get there. It returns once the process has stopped
// (on Linux), so that nothing sent after it is answered before Resume.
// Kill resumes a paused process first.
func (s *Server) Pause() {
	s.t.Helper()
	s.signal(syscall.SIGSTOP)
	s.mu.Lock()
	pid := s.proc.Pid
	s.mu.Unlock()
	for deadline := time.Now().Add(startTimeout); !stopped(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			s.t.Fatalf("redistest: %s did not stop after SIGSTOP", s.bin)
		}
	}
}

// Resume continues a process Pause stopped.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig os.Signal) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		s.t.Fatalf("redistest: %s is not running", s.bin)
	}
	if err := s.proc.Signal(sig); err != nil {
		s.t.Fatalf("redistest: signal %v: %v", sig, err)
	}
}

// Restart starts the process again on the same port, after Kill, and
// waits until it accepts connections.
func (s *Server) Restart() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	log := filepath.Join(s.dir, "redis.log")
	if s.bin == "redis-sentinel" {
		log = filepath.Join(s.dir, "sentinel.log")
	}
	before, _ := os.ReadFile(log)
	cmd := Command(s.bin, s.args...)
	cmd.Dir = s.dir
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: %s: %v", s.bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(startTimeout)
	for {
		b, _ := os.ReadFile(log)
		if len(b) >= len(before) && bytes.Contains(bytes.ToLower(b[len(before):]), []byte(s.ready)) {
			break
		}
		select {
		case err := <-exited:
			s.t.Fatalf("redistest: %s exited: %v\n%s\n%s", s.bin, err, stderr.String(), tail(b))
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			s.t.Fatalf("redistest: %s not ready after %v\n%s", s.bin, startTimeout, tail(b))
		}
	}
	s.proc, s.exited = cmd.Process, exited
}

func tail(b []byte) string {
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// CLI runs redis-cli against the server and returns its trimmed output.
// It fails the test if redis-cli fails; call it from the test's goroutine.
func (s *Server) CLI(args ...string) string {
	s.t.Helper()
	out, err := s.Run(args...)
	if err != nil {
		s.t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// Run runs redis-cli against the server and returns its trimmed output.
func (s *Server) Run(args ...string) (string, error) {
	host, port, _ := net.SplitHostPort(s.Addr)
	out, err := exec.Command("redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, as
// was the port 10000 above it (a cluster node's bus port). Ports come from
// 10000-22767, below Linux's ephemeral range (32768 on), so the bus port
// too stays outside it: no outgoing connection or bind to port 0 of a test
// running in parallel can take them between this check and the server's
// bind, which a port the kernel hands out for port 0 does not ensure.
func FreePort(t testing.TB) int {
	t.Helper()
	for range 1000 {
		p := 10000 + rand.IntN(12768)
		if free(p) && free(p+10000) {
			return p
		}
	}
	t.Fatal("redistest: no free port pair in 10000-32767")
	return 0
}

func free(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
}

// Seeds lists the nodes' addresses.
func (c *Cluster) Seeds() []string {
	a := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		a[i] = n.Addr
	}
	return a
}

// StartCluster starts n (at least 3) cluster-enabled servers, joins them
// with `redis-cli --cluster create` and waits until the cluster is ok.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	c := &Cluster{}
	for range n {
		c.Nodes = append(c.Nodes, Start(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "15000"))
	}
	args := append([]string{"--cluster", "create"}, c.Seeds()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(startTimeout)
	for _, s := range c.Nodes {
		for !strings.Contains(s.CLI("cluster", "info"), "cluster_state:ok") {
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster not ok after %v", startTimeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c
}

// Sentinel is a master, a replica and one sentinel watching them.
type Sentinel struct {
	Master, Replica, Sentinel *Server
	// MasterSet is the name the sentinel knows the master by.
	MasterSet string
}

// StartSentinel starts a master, a replica of it and a sentinel with a
// quorum of 1 that declares the master down after 500 ms.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	// The master starts the replica's full sync at once: Redis 7 waits 5 s
	// by default (repl-diskless-sync-delay) for more replicas, half the
	// startTimeout the wait for the sync below has.
	m := Start(t, "--repl-diskless-sync-delay", "0")
	r := Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(m.Port))
	dir := t.TempDir()
	port := FreePort(t)
	const set = "sluice"
	conf := fmt.Sprintf("bind 127.0.0.1\nport %d\ndir %s\nlogfile %s\n"+
		"sentinel monitor %s 127.0.0.1 %d 1\nsentinel down-after-milliseconds %s 500\n"+
		"sentinel failover-timeout %s 2000\n",
		port, dir, filepath.Join(dir, "sentinel.log"), set, m.Port, set, set)
	file := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &Server{t: t, dir: dir, bin: "redis-sentinel", args: []string{file},
		ready: "+monitor master", Port: port, Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	s.Restart()
	t.Cleanup(s.Kill)
	// Wait until the replica is in sync, so a failover has a candidate.
	deadline := time.Now().Add(startTimeout)
	for !strings.Contains(r.CLI("info", "replication"), "master_link_status:up") {
		if time.Now().After(deadline) {
			t.Fatalf("redistest: replica not in sync after %v", startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &Sentinel{Master: m, Replica: r, Sentinel: s, MasterSet: set}
}

// Command is exec.Command for a child the test starts (a server under
// test): on Linux it dies with the test process.
func Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = procAttr()
	return cmd
}
