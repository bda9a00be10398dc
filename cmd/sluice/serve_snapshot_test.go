package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// hit sends one request of domain snap with key=value and returns the
// code and the remaining of its limit.
func hit(t *testing.T, p *sluiceProc, key, value string) (rlspb.RateLimitResponse_Code, uint32) {
	t.Helper()
	return hitAt(t, p.grpcAddr, key, value)
}

// hitAt is hit on the server at grpcAddr.
func hitAt(t *testing.T, grpcAddr, key, value string) (rlspb.RateLimitResponse_Code, uint32) {
	t.Helper()
	rls, _ := dialRLS(t, grpcAddr)
	r, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("snap", key, value))
	if err != nil {
		t.Fatal(err)
	}
	return r.OverallCode, r.Statuses[0].LimitRemaining
}

// spend sends n requests that must be allowed.
func spend(t *testing.T, p *sluiceProc, key, value string, n int) {
	t.Helper()
	for i := range n {
		if code, _ := hit(t, p, key, value); code != rlspb.RateLimitResponse_OK {
			t.Fatalf("%s=%s request %d: %v", key, value, i, code)
		}
	}
}

// stopWith signals p and waits for its exit.
func stopWith(t *testing.T, p *sluiceProc, sig syscall.Signal) error {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err // for the cleanup
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("no exit 20 s after %v", sig)
		return nil
	}
}

// metric reads one sample of p's /metrics (name with its labels).
func metric(t *testing.T, p *sluiceProc, sample string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), sample+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("no %s in /metrics", sample)
	return 0
}

// SIGTERM writes the counters after draining and a restart (the path
// given as SLUICE_MEMORY_SNAPSHOT this time) restores them: a per-day
// count and a token bucket are exact.
func TestBinary_MemorySnapshot_SIGTERM(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counters.snap")
	p := startBinary(t, "--config", "testdata/snapshot", "--memory-snapshot", path, "--memory-snapshot-interval", "0")
	spend(t, p, "user", "alice", 3)
	spend(t, p, "uploads", "alice", 4)
	if err := stopWith(t, p, syscall.SIGTERM); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	if !strings.Contains(p.log(), "memory snapshot written") {
		t.Fatalf("no snapshot written at shutdown:\n%s", p.log())
	}

	cmd := exec.Command(sluiceBinary(t), "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--config", "testdata/snapshot")
	cmd.Env = append(os.Environ(), "SLUICE_LOG_LEVEL=info", "SLUICE_LOG_FORMAT=text", "SLUICE_MEMORY_SNAPSHOT="+path)
	q := startCmd(t, cmd)
	if !strings.Contains(q.log(), "msg=\"memory snapshot restored\"") || !strings.Contains(q.log(), "restored=2") {
		t.Fatalf("restart did not restore two counters:\n%s", q.log())
	}
	if code, rem := hit(t, q, "user", "alice"); code != rlspb.RateLimitResponse_OK || rem != 1 {
		t.Fatalf("after the restart: %v, remaining %d; want OK, 1 (3 of 5 spent before)", code, rem)
	}
	if code, _ := hit(t, q, "user", "alice"); code != rlspb.RateLimitResponse_OK {
		t.Fatalf("the fifth request of the day: %v", code)
	}
	if code, _ := hit(t, q, "user", "alice"); code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("the sixth request of the day: %v, want OVER_LIMIT", code)
	}
	// 10 per hour: a token every 6 minutes, none refilled yet.
	if code, rem := hit(t, q, "uploads", "alice"); code != rlspb.RateLimitResponse_OK || rem != 5 {
		t.Fatalf("token bucket after the restart: %v, remaining %d; want OK, 5", code, rem)
	}
	if code, rem := hit(t, q, "user", "bob"); code != rlspb.RateLimitResponse_OK || rem != 4 {
		t.Fatalf("a new client after the restart: %v, remaining %d", code, rem)
	}
}

// A SIGKILL loses at most the counts since the last background write.
func TestBinary_MemorySnapshot_SIGKILL(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counters.snap")
	args := []string{"--config", "testdata/snapshot", "--memory-snapshot", path, "--memory-snapshot-interval", "100ms"}
	p := startBinary(t, args...)
	spend(t, p, "user", "alice", 2)
	// Two more writes: the second began after the two requests.
	const ok = `sluice_memory_snapshot_writes_total{result="ok"}`
	for base, deadline := metric(t, p, ok), time.Now().Add(20*time.Second); metric(t, p, ok) < base+2; {
		if time.Now().After(deadline) {
			t.Fatalf("no background writes:\n%s", p.log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	spend(t, p, "user", "alice", 1) // may or may not be written before the kill
	if err := stopWith(t, p, syscall.SIGKILL); err == nil {
		t.Fatal("exit 0 after SIGKILL")
	}

	q := startBinary(t, args...)
	code, rem := hit(t, q, "user", "alice")
	if code != rlspb.RateLimitResponse_OK || rem != 1 && rem != 2 {
		t.Fatalf("after SIGKILL and a restart: %v, remaining %d; want 1 (3 spent before) or 2 (the last request lost)", code, rem)
	}
	t.Logf("remaining %d after the restart (2 or 3 of 5 kept)", rem)
}

// A corrupt snapshot and one of another config are moved aside with a
// WARN; the server starts empty and serves.
func TestBinary_MemorySnapshot_Refused(t *testing.T) {
	dir := t.TempDir()
	corrupt := filepath.Join(dir, "corrupt.snap")
	if err := os.WriteFile(corrupt, []byte("SLUICEMS\x01\x00\x00\x00"+strings.Repeat(" not a snapshot after all", 4)), 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := filepath.Join(dir, "foreign.snap")
	p := startBinary(t, "--config", "testdata/snapshot", "--memory-snapshot", foreign, "--memory-snapshot-interval", "0")
	spend(t, p, "user", "alice", 3)
	if err := stopWith(t, p, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		path, config, domain, reason string
	}{
		{corrupt, "testdata/snapshot", "snap", "checksum"},
		{foreign, "testdata/snapshot-other", "other", "another config"},
	} {
		q := startBinary(t, "--config", c.config, "--memory-snapshot", c.path)
		warns := 0
		for line := range strings.Lines(q.log()) {
			if strings.Contains(line, "level=WARN") {
				warns++
				if !strings.Contains(line, "moved aside") || !strings.Contains(line, c.reason) {
					t.Errorf("%s: WARN %q lacks %q", c.path, line, c.reason)
				}
			}
		}
		if warns != 1 {
			t.Errorf("%s: %d WARN lines, want 1:\n%s", c.path, warns, q.log())
		}
		if _, err := os.Stat(c.path); !os.IsNotExist(err) {
			t.Errorf("%s still there: %v", c.path, err)
		}
		if bad, _ := filepath.Glob(c.path + ".bad-*"); len(bad) != 1 {
			t.Errorf("%s moved to %v, want one %s.bad-*", c.path, bad, c.path)
		}
		rls, _ := dialRLS(t, q.grpcAddr)
		r, err := rls.ShouldRateLimit(testCtx(t), rlsRequest(c.domain, "user", "alice"))
		if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 4 {
			t.Errorf("%s: after starting empty: %v, %v", c.path, r, err)
		}
		// The next snapshot is written where the bad one was.
		if err := stopWith(t, q, syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(c.path); err != nil {
			t.Errorf("no new snapshot at %s: %v", c.path, err)
		}
	}
}

// A counter keeps its rule across a config change when its key's domain
// and suffix (the algorithm and the numbers its state depends on) are
// still a rule's: a fixed window's new limit applies to its count; a
// token bucket or sliding window with other numbers, or a removed rule,
// has none (unless another rule of the domain has the same numbers).
func TestRuleOfKey(t *testing.T) {
	parse := func(yaml string) *config.Table {
		t.Helper()
		tb, err := config.Parse("limits.yaml", []byte(yaml), config.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return tb
	}
	old := parse(`domain: d|1
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 5}
  - key: upload
    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}
  - key: search
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: gone
    rate_limit: {unit: minute, requests_per_unit: 7}
  - key: alike
    rate_limit: {unit: second, requests_per_unit: 7}
  - key: plan
    rate_limits:
      - {unit: second, requests_per_unit: 20}
      - {unit: month, requests_per_unit: 1000, calendar: true, time_zone: Europe/Berlin}
  - key: burst
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 10}
`)
	cur := parse(`domain: d|1
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: upload
    rate_limit: {unit: hour, requests_per_unit: 20, algorithm: token_bucket}
  - key: search
    rate_limit: {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
  - key: plan
    rate_limits:
      - {unit: second, requests_per_unit: 20}
      - {unit: month, requests_per_unit: 1000, calendar: true, time_zone: Europe/Berlin}
  - key: burst
    rate_limits:
      - {unit: hour, requests_per_unit: 50}
      - {unit: hour, requests_per_unit: 5}
`)
	rule := ruleOfKey(cur)
	for _, c := range []struct {
		key, value string
		want       string // the rule found, "" for none
	}{
		{"user", "a|b=c", "fixed_window 3 per 24h0m0s"},
		{"upload", "x", ""},
		{"search", "x", "sliding_window 10 per 1m0s"},
		{"gone", "x", ""},
		// Removed, but another rule of the domain has its numbers: kept,
		// read again only by a limit override of the same key.
		{"alike", "x", "fixed_window 20 per 1s"},
		{"plan", "gold", "fixed_window 20 per 1s"},
		// Two limits with one window: the second's key ends in "|2".
		{"burst", "x", "fixed_window 50 per 1h0m0s"},
	} {
		r, key := old.Match("d|1", []config.Entry{{Key: c.key, Value: c.value}}, nil)
		for _, l := range r.Limits() {
			k := strings.TrimSuffix(string(key), r.KeySuffix()) + l.KeySuffix()
			got := ""
			if lr := rule(k); lr != nil {
				got = lr.String()
			}
			want := c.want
			switch {
			case l.Calendar:
				want = "fixed_window 1000 per calendar month (Europe/Berlin)"
			case c.key == "burst" && l.Index == 1:
				want = "fixed_window 5 per 1h0m0s"
			}
			if got != want {
				t.Errorf("%s: rule %q, want %q", k, got, want)
			}
		}
	}
	for _, k := range []string{"", "no-separator", "d%7C1|", "other|user=a|fw:86400s"} {
		if r := rule(k); r != nil {
			t.Errorf("%q: rule %v, want none", k, r)
		}
	}
}

// The counters of a rate_limits list whose limits share a window (the
// second's key ends in "|2") survive a restart, the second's included.
func TestServe_MemorySnapshot_SameWindowLimits(t *testing.T) {
	dir, path := t.TempDir(), filepath.Join(t.TempDir(), "counters.snap")
	limits := `domain: snap
descriptors:
  - key: plan
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {unit: hour, requests_per_unit: 3}
`
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(limits), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", dir, "--memory-snapshot", path, "--memory-snapshot-interval", "0"}
	grpcAddr, _, stop := startServe(t, nil, args...)
	for range 2 {
		if code, _ := hitAt(t, grpcAddr, "plan", "gold"); code != rlspb.RateLimitResponse_OK {
			t.Fatalf("before the restart: %v, want OK", code)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	grpcAddr, _, _ = startServe(t, nil, args...)
	if code, _ := hitAt(t, grpcAddr, "plan", "gold"); code != rlspb.RateLimitResponse_OK {
		t.Fatalf("the 3rd of 3 after the restart: %v, want OK", code)
	}
	if code, _ := hitAt(t, grpcAddr, "plan", "gold"); code != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Errorf("the 4th of 3 after the restart: %v, want OVER_LIMIT (the second limit's count restored)", code)
	}
}

// A server that starts with no config restores its snapshot against the
// first config it loads, before it reports SERVING.
func TestServe_MemorySnapshot_FirstConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "counters.snap")
	grpcAddr, _, stop := startServe(t, nil, "--config", "testdata/snapshot", "--memory-snapshot", path, "--memory-snapshot-interval", "0")
	for range 3 {
		hitAt(t, grpcAddr, "user", "alice")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	grpcAddr, _, _ = startServe(t, nil, "--config", dir, "--allow-empty-config", "--memory-snapshot", path)
	_, hc := dialRLS(t, grpcAddr)
	w, err := hc.Watch(testCtx(t), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health with no config: %v, %v", r, err)
	}
	limits, err := os.ReadFile("testdata/snapshot/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), limits, 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := w.Recv(); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health with a config: %v, %v", r, err)
	}
	if code, rem := hitAt(t, grpcAddr, "user", "alice"); code != rlspb.RateLimitResponse_OK || rem != 1 {
		t.Fatalf("after the restart: %v, remaining %d; want OK, 1 (3 of 5 spent before)", code, rem)
	}
}

// A snapshot taken on a clock half an hour ahead of the wall clock (it
// held still through a backward step) continues that clock: the restored
// process's store clock does not go back, so a token bucket emptied just
// before the snapshot is still empty, not half an hour refilled. A clock
// more than an hour ahead is not followed, and the bucket, from the
// future, stays empty too.
func TestSnapshotter_ClockContinues(t *testing.T) {
	for _, c := range []struct {
		ahead  time.Duration
		follow bool
	}{{30 * time.Minute, true}, {3 * time.Hour, false}} {
		t.Run(c.ahead.String(), func(t *testing.T) { testClockContinues(t, c.ahead, c.follow) })
	}
}

func testClockContinues(t *testing.T, by time.Duration, follow bool) {
	tb, err := config.Parse("limits.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10, algorithm: token_bucket}\n"), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, key := tb.Match("d", []config.Entry{{Key: "k", Value: "v"}}, nil)
	wall := time.Now().UnixNano()
	ahead := wall + int64(by)
	old := memory.New(memory.Options{})
	out := make([]store.Decision, 1)
	if err := old.Take(context.Background(), ahead, []store.Hit{{Key: string(key), Rule: r.Limit, Cost: 10, Veto: true}}, out); err != nil || !out[0].Allowed {
		t.Fatalf("take: %v %+v", err, out[0])
	}
	path := filepath.Join(t.TempDir(), "snap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.WriteSnapshot(f, ahead, wall); err != nil {
		t.Fatal(err)
	}
	f.Close()

	clock := store.NewWallClock()
	st := memory.New(memory.Options{})
	sn := newSnapshotter(path, 0, st, clock, slog.New(slog.DiscardHandler))
	if err := sn.restore(tb); err != nil {
		t.Fatal(err)
	}
	now := clock.Now()
	if follow && now < ahead {
		t.Fatalf("store clock %v after the restore, behind the snapshot's %v", time.Unix(0, now), time.Unix(0, ahead))
	}
	if !follow && now-wall > int64(time.Minute) {
		t.Fatalf("store clock %v after the restore, moved to the snapshot's %v", time.Unix(0, now), time.Unix(0, ahead))
	}
	if err := st.Take(context.Background(), now, []store.Hit{{Key: string(key), Rule: r.Limit, Cost: 0, Veto: true, Peek: store.PeekStrict}}, out); err != nil || out[0].Allowed != !follow {
		t.Fatalf("check after the restore: %v %+v; want allowed %v (only a snapshot within the hour is restored)", err, out[0], !follow)
	}
	var m dto.Metric
	if err := sn.ahead.Write(&m); err != nil || (m.GetCounter().GetValue() == 1) == follow {
		t.Errorf("ahead_counters_total = %v (%v), want 1 only for the snapshot too far ahead", m.GetCounter().GetValue(), err)
	}
}

// A snapshot file that cannot be read is an error and left in place (a
// FIFO neither blocks the start nor is read; a file without read
// permission is not moved aside), and no write replaces it; one larger
// than the bound is moved aside without being read.
func TestSnapshotter_ReadFaults(t *testing.T) {
	tb, err := config.Parse("limits.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	unreadable := filepath.Join(dir, "unreadable")
	if err := os.WriteFile(unreadable, []byte("SLUICEMS"), 0); err != nil {
		t.Fatal(err)
	}
	large := filepath.Join(dir, "large")
	if err := os.WriteFile(large, make([]byte, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path string
		want string // "" for moved aside
	}{
		{fifo, "not a regular file"},
		{large, ""},
	}
	if os.Geteuid() != 0 { // root reads anything
		cases = append(cases, struct{ path, want string }{unreadable, "permission denied"})
	}
	for _, c := range cases {
		sn := newSnapshotter(c.path, 0, memory.New(memory.Options{}), store.NewWallClock(), slog.New(slog.DiscardHandler))
		sn.maxBytes = 1024
		done := make(chan error, 1)
		go func() { done <- sn.restore(tb) }()
		var err error
		select {
		case err = <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: restore still blocked after 30 s", c.path)
		}
		bad, _ := filepath.Glob(c.path + ".bad-*")
		if c.want == "" {
			if err != nil || len(bad) != 1 {
				t.Errorf("%s: %v, moved to %v; want moved aside", c.path, err, bad)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "left in place") {
			t.Errorf("%s: %v, want an error with %q", c.path, err, c.want)
		}
		if _, serr := os.Lstat(c.path); serr != nil || len(bad) != 0 {
			t.Errorf("%s: %v, moved to %v; want it left in place", c.path, serr, bad)
		}
		if _, took, werr := sn.write(); werr != nil || took != -1 {
			t.Errorf("%s: a write after the failed read: %v, %v; want none", c.path, took, werr)
		}
	}
}

// removeTemps removes this machine's temporary files and stale ones of
// any machine, matching names exactly: glob characters in the path match
// nothing else, and another machine's fresh temporary file is kept.
func TestSnapshotter_RemoveTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "snap[1]")
	sn := newSnapshotter(path, 0, memory.New(memory.Options{}), store.NewWallClock(), slog.New(slog.DiscardHandler))
	files := map[string]bool{ // name: removed
		"snap[1].tmp-" + tempHost() + "-123": true,
		"snap[1].tmp-otherhost-456":          false,
		"snap[1].tmp-stalehost-789":          true,
		"snap1.tmp-" + tempHost() + "-123":   false,
		"snap[1].tmpx":                       false,
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-2 * staleTemp)
	if err := os.Chtimes(filepath.Join(dir, "snap[1].tmp-stalehost-789"), old, old); err != nil {
		t.Fatal(err)
	}
	sn.removeTemps()
	for name, removed := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); os.IsNotExist(err) != removed {
			t.Errorf("%s: %v, want removed %v", name, err, removed)
		}
	}
}

// A snapshot's directory that is missing or not writable fails at start,
// as does a negative interval.
func TestServe_MemorySnapshotBadFlags(t *testing.T) {
	dir := t.TempDir()
	readOnly := filepath.Join(dir, "ro")
	if err := os.Mkdir(readOnly, 0o500); err != nil {
		t.Fatal(err)
	}
	cases := map[string][]string{
		"no such file or directory": {"--memory-snapshot", filepath.Join(dir, "missing", "snap")},
		"must not be negative":      {"--memory-snapshot", filepath.Join(dir, "snap"), "--memory-snapshot-interval", "-1s"},
	}
	if os.Geteuid() != 0 { // root writes anywhere
		cases["permission denied"] = []string{"--memory-snapshot", filepath.Join(readOnly, "snap")}
	}
	for want, args := range cases {
		err := serve(testCtx(t), append([]string{"--config", "testdata/snapshot", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...),
			serveEnv{}.get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), "--memory-snapshot") || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want an error with %q", args, err, want)
		}
	}
}

// A write that fails (here the rename: the path is a directory) leaves no
// temporary file and is counted.
func TestSnapshotter_WriteFails(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "snap")
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	sn := newSnapshotter(path, 0, memory.New(memory.Options{}), store.NewWallClock(), slog.New(slog.DiscardHandler))
	if _, took, err := sn.write(); err != nil || took != -1 {
		t.Fatalf("write before the restore: %v, %v; want nothing written", took, err)
	}
	sn.ready.Store(true)
	if err := sn.stop(); err == nil {
		t.Fatal("stop wrote over a directory")
	}
	if left, _ := filepath.Glob(path + ".tmp-*"); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	var m dto.Metric
	if err := sn.writes.WithLabelValues("error").Write(&m); err != nil || m.GetCounter().GetValue() != 1 {
		t.Errorf("writes_total{result=error} = %v (%v), want 1", m.GetCounter().GetValue(), err)
	}
}
