package harness

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// StartReference runs envoyproxy/ratelimit's binary bin (built by hand
// from its source: docs/BENCHMARKS.md) with the limits file config, on
// the Redis at redisAddr, with its documented defaults otherwise (no
// pipeline window, a pool of 10, no local cache, statsd off). Its gRPC,
// HTTP and debug ports are free loopback ports, its runtime directory and
// log are in dir, and StartReference waits until its /healthcheck answers
// 200. The returned Sluice is the reference's process; Stop stops it.
func StartReference(bin, name, dir, config, redisAddr string, env ...string) (*Sluice, error) {
	root := filepath.Join(dir, name+"-runtime")
	limits := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(limits, 0o755); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(config)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(limits, "limits.yaml"), b, 0o644); err != nil {
		return nil, err
	}
	var ports [3]string
	for i := range ports {
		addr, err := FreePort()
		if err != nil {
			return nil, err
		}
		_, ports[i], _ = net.SplitHostPort(addr)
	}
	s := &Sluice{Name: name, LogPath: filepath.Join(dir, name+".log"), done: make(chan error, 1),
		GRPC: "127.0.0.1:" + ports[0], HTTP: "127.0.0.1:" + ports[1], Debug: "127.0.0.1:" + ports[2]}
	logf, err := os.Create(s.LogPath)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	s.cmd = exec.Command(bin)
	s.cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"),
		"HOST=127.0.0.1", "PORT=" + ports[1], "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + ports[0],
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + ports[2],
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "LOG_LEVEL=warn", "BACKEND_TYPE=redis",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr}, env...)
	s.cmd.Stdout, s.cmd.Stderr, s.cmd.SysProcAttr = logf, logf, procAttr()
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("harness: %s: %w", name, err)
	}
	go func() { s.done <- s.cmd.Wait() }()
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(startWait); ; {
		if resp, err := client.Get("http://" + s.HTTP + "/healthcheck"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case err := <-s.done:
			s.done <- err
			return nil, fmt.Errorf("harness: %s exited before serving: %v\n%s", name, err, s.Log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("harness: %s did not serve within %v:\n%s", name, startWait, s.Log())
		}
	}
}
