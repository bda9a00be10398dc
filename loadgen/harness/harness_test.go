package harness

import (
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestParseMetrics(t *testing.T) {
	const text = `# HELP go_goroutines Number of goroutines.
# TYPE go_goroutines gauge
go_goroutines 42

sluice_rule_hits_total{domain="d",rule="a b",value=""} 3
sluice_rule_hits_total{domain="d",rule="x}{y",value="q\"} 9"} 4
lat_bucket{le="+Inf"} 7
lat_sum 1.5 1700000000000
odd NaN
broken{unterminated="x 5
`
	m, err := ParseMetrics(strings.NewReader(text), "go_goroutines", "sluice_rule_hits_total", "lat_bucket", "lat_sum", "odd", "broken", "absent")
	if err != nil {
		t.Fatal(err)
	}
	if m.Series != 7 || m.Bytes != len(text) {
		t.Errorf("series %d, bytes %d; want 7, %d", m.Series, m.Bytes, len(text))
	}
	for name, want := range map[string]float64{"go_goroutines": 42, "sluice_rule_hits_total": 7, "lat_bucket": 7, "lat_sum": 1.5} {
		if got := m.Sum[name]; got != want {
			t.Errorf("Sum[%s] = %v, want %v", name, got, want)
		}
	}
	if !math.IsNaN(m.Sum["odd"]) {
		t.Errorf("Sum[odd] = %v, want NaN", m.Sum["odd"])
	}
	if _, ok := m.Sum["broken"]; ok {
		t.Error("a sample with unterminated labels was summed")
	}
	if _, ok := m.Sum["absent"]; ok {
		t.Error("a metric without samples has a sum")
	}
	if m, err := ParseMetrics(strings.NewReader(text)); err != nil || m.Series != 7 || len(m.Sum) != 0 {
		t.Errorf("no names: %+v, %v; want 7 series and no sums", m, err)
	}
	long := "big{v=\"" + strings.Repeat("x", 100<<10) + "\"} 1\nlat_sum 2\n"
	if m, err := ParseMetrics(strings.NewReader(long), "lat_sum"); err != nil || m.Series != 2 || m.Sum["lat_sum"] != 2 || m.Bytes != len(long) {
		t.Errorf("a line longer than the buffer: %+v, %v", m, err)
	}
}

func TestOutages(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	var o Outages
	o.Begin(at(10))
	o.End(at(14))
	o.Begin(at(30)) // under way
	for _, c := range []struct {
		a, b float64
		want bool
	}{{0, 9.9, false}, {0, 10, true}, {11, 12, true}, {14, 20, true}, {14.1, 29.9, false}, {29, 31, true}, {100, 101, true}} {
		if got := o.Overlaps(at(c.a), at(c.b)); got != c.want {
			t.Errorf("Overlaps(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
	if got := o.Total(); got != 4*time.Second {
		t.Errorf("Total = %v, want 4s (the outage under way is not counted)", got)
	}
}

func TestReadAddrs(t *testing.T) {
	const log = `time=2026-01-01T00:00:00Z level=INFO msg="debug endpoints" addr=127.0.0.1:3
time=2026-01-01T00:00:00Z level=INFO msg="envoyproxy/ratelimit metrics" addr=127.0.0.1:4 path=/metrics
time=2026-01-01T00:00:00Z level=INFO msg=serving grpc=127.0.0.1:1 http=127.0.0.1:2 config="xds x"
`
	var s Sluice
	if s.readAddrs(log[:strings.Index(log, "time=2026-01-01T00:00:00Z level=INFO msg=serving")]) {
		t.Error("serving before the serving line")
	}
	if !s.readAddrs(log) || s.GRPC != "127.0.0.1:1" || s.HTTP != "127.0.0.1:2" || s.Debug != "127.0.0.1:3" || s.RefMetrics != "127.0.0.1:4" {
		t.Errorf("readAddrs: %+v", s)
	}
	var noop Sluice
	if !noop.readAddrs("no-op RLS server listening on 127.0.0.1:5\n") || noop.GRPC != "127.0.0.1:5" || noop.HTTP != "" {
		t.Errorf("readAddrs of a no-op server: %+v", noop)
	}
}

// fakeSluice writes a script that logs script's lines as sluice would.
func fakeSluice(t *testing.T, script string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sluice")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestStartSluice(t *testing.T) {
	bin := fakeSluice(t, `echo "level=INFO msg=serving grpc=127.0.0.1:1 http=127.0.0.1:2 from=$FROM"
exec sleep 60
`)
	s, err := StartSluice(bin, "one", t.TempDir(), nil, []string{"FROM=env"})
	if err != nil {
		t.Fatal(err)
	}
	if s.GRPC != "127.0.0.1:1" || s.HTTP != "127.0.0.1:2" || !strings.Contains(s.Log(), "from=env") {
		t.Errorf("%+v, log %q", s, s.Log())
	}
	if done, _ := s.Exited(); done {
		t.Error("exited while running")
	}
	s.Stop()
	if done, err := s.Exited(); !done || err == nil {
		t.Errorf("after Stop: exited %v, %v; want the SIGTERM's exit status", done, err)
	}
	s.Stop() // a second Stop does nothing
}

func TestStartSluice_ExitsBeforeServing(t *testing.T) {
	bin := fakeSluice(t, "echo 'level=ERROR msg=\"bad flag\"'; exit 3\n")
	_, err := StartSluice(bin, "bad", t.TempDir(), nil, nil)
	if err == nil || !strings.Contains(err.Error(), "exited before serving") || !strings.Contains(err.Error(), "bad flag") {
		t.Errorf("err = %v, want the exit and the log", err)
	}
}

func TestProcStats(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc")
	}
	rss, fds := ProcStats(os.Getpid())
	if rss <= 0 || fds <= 0 {
		t.Errorf("ProcStats(self) = %v KiB, %d descriptors; want both positive", rss, fds)
	}
}

func TestEnded(t *testing.T) {
	t0 := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), t0.Add(time.Hour))
	defer cancel()
	if Ended(ctx, t0) || !Ended(ctx, t0.Add(time.Hour)) {
		t.Error("before the deadline ended, or at it not")
	}
	if Ended(context.Background(), t0) {
		t.Error("a context without a deadline ended")
	}
	cancel()
	if !Ended(ctx, t0) {
		t.Error("a cancelled context did not end")
	}
}

// TestProcCPU: the process's CPU time grows as it works, and a process
// that is not there has none.
func TestProcCPU(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	c0 := ProcCPU(os.Getpid())
	x := uint64(1)
	for i := 0; ProcCPU(os.Getpid()) <= c0; i++ {
		for range 1 << 20 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		if i == 10000 {
			t.Fatalf("CPU time stayed at %v (x %d)", c0, x)
		}
	}
	if c := ProcCPU(1 << 30); c != 0 {
		t.Errorf("ProcCPU of no process = %v, want 0", c)
	}
}

// TestRedis_RestartEvery: every restart kills Redis (its data goes) and
// starts it on the same port; each outage is recorded, Before and After
// run around it, and the loop ends with its context.
func TestRedis_RestartEvery(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not installed (make deps)")
	}
	r, err := StartRedis(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Kill()
	var down Outages
	ctx, cancel := context.WithCancel(context.Background())
	before, after := make(chan struct{}, 10), make(chan struct{}, 10)
	plan := RestartPlan{Every: 10 * time.Millisecond, Before: func() { before <- struct{}{} },
		After: func() {
			if err := r.ping(); err != nil {
				t.Errorf("After: %v, want Redis answering", err)
			}
			after <- struct{}{}
		}}
	done := make(chan error)
	go func() { done <- r.RestartEvery(ctx, plan, &down) }()
	for range 2 {
		<-before
		<-after
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := r.Restarts(); n < 2 {
		t.Errorf("Restarts = %d, want at least 2", n)
	}
	if err := r.ping(); err != nil {
		t.Errorf("after the loop: %v, want Redis answering on %s", err, r.Addr)
	}
	if !down.Overlaps(time.Time{}, time.Now()) {
		t.Error("no outage recorded")
	}
	r.Kill()
	if err := r.ping(); err == nil {
		t.Error("Redis answers after Kill")
	}
}

// TestStartReference: the reference gets its limits under its runtime
// directory, loopback ports and Redis in its environment, and is ready
// once /healthcheck answers 200. The stand-in serves its runtime root's
// files over HTTP (python3's http.server), so /healthcheck is a file.
func TestStartReference(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 for the stand-in's HTTP server")
	}
	bin := fakeSluice(t, `cd "$RUNTIME_ROOT" || exit 1
echo "$REDIS_URL $REDIS_SOCKET_TYPE $USE_STATSD $GRPC_HOST:$GRPC_PORT" > healthcheck
exec `+py+` -m http.server "$PORT" --bind "$HOST"
`)
	dir := t.TempDir()
	config := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(config, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := StartReference(bin, "ref", dir, config, "127.0.0.1:6390")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	got, err := os.ReadFile(filepath.Join(dir, "ref-runtime", "ratelimit", "config", "limits.yaml"))
	if err != nil || string(got) != "domain: d\n" {
		t.Errorf("limits in the runtime directory: %q, %v", got, err)
	}
	health, err := os.ReadFile(filepath.Join(dir, "ref-runtime", "healthcheck"))
	if want := "127.0.0.1:6390 tcp false " + s.GRPC + "\n"; err != nil || string(health) != want {
		t.Errorf("environment seen: %q, %v; want %q", health, err, want)
	}
	if !strings.HasPrefix(s.GRPC, "127.0.0.1:") || !strings.HasPrefix(s.HTTP, "127.0.0.1:") || s.GRPC == s.HTTP {
		t.Errorf("addresses %q, %q: want two loopback ports", s.GRPC, s.HTTP)
	}
}

func TestStartReference_ExitsBeforeServing(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(config, []byte("domain: d\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := fakeSluice(t, "echo 'redis: connection refused'; exit 1\n")
	_, err := StartReference(bin, "ref", dir, config, "127.0.0.1:1")
	if err == nil || !strings.Contains(err.Error(), "exited before serving") || !strings.Contains(err.Error(), "connection refused") {
		t.Errorf("err = %v, want the exit and the log", err)
	}
}
