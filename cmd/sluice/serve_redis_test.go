package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

func TestServeRedis_RefEnv(t *testing.T) {
	cases := []struct {
		env  serveEnv
		want map[string]string
	}{
		{serveEnv{"BACKEND_TYPE": "redis", "REDIS_URL": "10.0.0.1:6379", "REDIS_AUTH": "pw", "CACHE_KEY_PREFIX": "rl_", "REDIS_TIMEOUT": "5ms", "REDIS_PIPELINE_WINDOW": "150us"},
			map[string]string{"store": "redis", "redis-url": "redis://10.0.0.1:6379", "redis-password": "pw", "redis-key-prefix": "rl_", "redis-timeout": "5ms", "redis-pipeline-window": "150µs"}},
		{serveEnv{"REDIS_URL": "r:6380", "REDIS_TLS": "true", "REDIS_TLS_CACERT": "/ca.pem", "REDIS_AUTH": "u:p"},
			map[string]string{"redis-url": "rediss://r:6380", "redis-tls": "true", "redis-tls-ca": "/ca.pem", "redis-username": "u", "redis-password": "p"}},
		{serveEnv{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "/run/redis.sock"}, map[string]string{"redis-url": "unix:///run/redis.sock"}},
		// Envoy Gateway's: host:port over TCP; a URL stays as given.
		{serveEnv{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis.redis.svc:6379"}, map[string]string{"store": "redis", "redis-url": "redis://redis.redis.svc:6379"}},
		{serveEnv{"REDIS_URL": "rediss://u:p@r:6380/2"}, map[string]string{"redis-url": "rediss://u:p@r:6380/2"}},
		{serveEnv{"REDIS_URL": "r:6380", "REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": "/redis-certs/tls.crt", "REDIS_TLS_CLIENT_KEY": "/redis-certs/tls.key"},
			map[string]string{"redis-url": "rediss://r:6380", "redis-tls-cert": "/redis-certs/tls.crt", "redis-tls-key": "/redis-certs/tls.key"}},
		{serveEnv{"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379", "REDIS_SENTINEL_AUTH": "sp"},
			map[string]string{"redis-sentinel-master": "mymaster", "redis-sentinel": "s1:26379,s2:26379", "redis-sentinel-password": "sp"}},
		{serveEnv{"REDIS_TYPE": "CLUSTER", "REDIS_URL": "c1:7000,c2:7000", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"},
			map[string]string{"redis-cluster": "c1:7000,c2:7000", "redis-health": "true"}},
		// REDIS_PERSECOND: a second Redis, each of its variables on its
		// own flag; the TLS files are the reference's one set, for either
		// Redis on TLS.
		{serveEnv{"REDIS_URL": "r:6379", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "ps:6379", "REDIS_PERSECOND_AUTH": "u:p",
			"REDIS_PERSECOND_TIMEOUT": "7ms", "REDIS_PERSECOND_PIPELINE_WINDOW": "50us", "REDIS_PERSECOND_POOL_SIZE": "5"},
			map[string]string{"redis-url": "redis://r:6379", "redis-persecond-url": "redis://ps:6379", "redis-persecond-username": "u",
				"redis-persecond-password": "p", "redis-persecond-timeout": "7ms", "redis-persecond-pipeline-window": "50µs", "redis-persecond-tls": "false"}},
		{serveEnv{"REDIS_URL": "r:6379", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "unix", "REDIS_PERSECOND_URL": "/run/ps.sock"},
			map[string]string{"redis-persecond-url": "unix:///run/ps.sock"}},
		{serveEnv{"REDIS_URL": "r:6379", "REDIS_PERSECOND": "1", "REDIS_PERSECOND_TYPE": "sentinel", "REDIS_PERSECOND_URL": "m2,s1:26379",
			"REDIS_PERSECOND_SENTINEL_AUTH": "sp2", "REDIS_SENTINEL_AUTH": "sp1"},
			map[string]string{"redis-persecond-sentinel-master": "m2", "redis-persecond-sentinel": "s1:26379",
				"redis-persecond-sentinel-password": "sp2", "redis-sentinel-password": "sp1"}},
		{serveEnv{"REDIS_URL": "r:6379", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_TYPE": "Cluster", "REDIS_PERSECOND_URL": "c1:7000,c2:7000"},
			map[string]string{"redis-persecond-cluster": "c1:7000,c2:7000", "redis-persecond-url": ""}},
		{serveEnv{"REDIS_URL": "r:6379", "REDIS_PERSECOND": "true", "REDIS_PERSECOND_URL": "ps:6380", "REDIS_PERSECOND_TLS": "true",
			"REDIS_TLS_CACERT": "/ca.pem", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"},
			map[string]string{"redis-url": "redis://r:6379", "redis-persecond-url": "rediss://ps:6380", "redis-persecond-tls": "true",
				"redis-persecond-tls-ca": "/ca.pem", "redis-tls-ca": "", "redis-persecond-tls-skip-hostname-verification": "true",
				"redis-tls-skip-hostname-verification": "false"}},
		{serveEnv{"REDIS_URL": "r:6380", "REDIS_TLS": "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "t"},
			map[string]string{"redis-tls-skip-hostname-verification": "true", "redis-persecond-tls-skip-hostname-verification": "false"}},
		// Without REDIS_PERSECOND=true its variables are not read.
		{serveEnv{"REDIS_URL": "r:6379", "REDIS_PERSECOND_URL": "ps:6379", "REDIS_PERSECOND_TLS": "true"},
			map[string]string{"redis-persecond-url": "", "redis-persecond-tls": "false"}},
	}
	for i, c := range cases {
		fs, _, err := parseServe(t, nil, c.env)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		for name, want := range c.want {
			if got := flagValue(fs, name); got != want {
				t.Errorf("case %d: --%s = %q, want %q", i, name, got, want)
			}
		}
	}
	// A flag wins over the reference's variable; --redis-failure-mode is
	// --store-failure-mode.
	fs, _, err := parseServe(t, []string{"--redis-url", "redis://flag:1", "--redis-failure-mode", "deny"}, serveEnv{"REDIS_URL": "env:2"})
	if err != nil {
		t.Fatal(err)
	}
	if got := flagValue(fs, "redis-url"); got != "redis://flag:1" {
		t.Errorf("--redis-url = %q, want the flag's", got)
	}
	if got := flagValue(fs, "store-failure-mode"); got != "deny" {
		t.Errorf("--store-failure-mode = %q after --redis-failure-mode deny", got)
	}
	for _, env := range []serveEnv{
		{"REDIS_PERSECOND": "true"}, // without REDIS_PERSECOND_URL
		{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "only-master"},
		{"REDIS_TYPE": "ring", "REDIS_URL": "x:1"},
		{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_TYPE": "ring", "REDIS_PERSECOND_URL": "x:1"},
		{"REDIS_PERSECOND": "true", "REDIS_PERSECOND_TYPE": "SENTINEL", "REDIS_PERSECOND_URL": "only-master"},
		// The reference reads its booleans with strconv.ParseBool.
		{"REDIS_TLS": "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "maybe"},
		{"REDIS_PERSECOND": "yes", "REDIS_PERSECOND_URL": "x:1"},
		{"REDIS_TLS": "maybe"},
	} {
		if _, _, err := parseServe(t, nil, env); err == nil {
			t.Errorf("%v: no error", env)
		}
	}
}

func TestServeRedis_BadSettings(t *testing.T) {
	const url = "redis://127.0.0.1:1" // nothing listens
	for _, c := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"--store", "redis"}, "give --redis-url"},
		{[]string{"--redis-url", url, "--redis-clock", "sundial"}, "--redis-clock"},
		{[]string{"--redis-url", url, "--redis-timeout", "0s"}, "--redis-timeout"},
		{[]string{"--redis-url", url, "--redis-expiry-jitter", "500ms"}, "--redis-expiry-jitter"},
		{[]string{"--redis-url", url, "--redis-expiry-jitter", "-1s"}, "--redis-expiry-jitter"},
		{[]string{"--redis-url", url, "--redis-pipeline-window", "-1us"}, "--redis-pipeline-window"},
		{[]string{"--redis-url", url, "--redis-pipeline-window", "1s"}, "--redis-pipeline-window"},
		{[]string{"--redis-url", url, "--redis-tls-cert", "c.pem"}, "--redis-tls-cert"},
		{[]string{"--redis-url", url, "--redis-tls-skip-hostname-verification", "--redis-tls-server-name", "r"}, "give one"},
		// The per-second Redis's settings are checked too, before either
		// Redis is asked, and its errors name its flags.
		{[]string{"--redis-url", url, "--redis-persecond-url", url, "--redis-persecond-timeout", "0s"}, "--redis-persecond-timeout"},
		{[]string{"--redis-url", url, "--redis-persecond-cluster", "127.0.0.1:2", "--redis-persecond-pipeline-window", "1s"}, "--redis-persecond-pipeline-window"},
		{[]string{"--redis-url", url, "--redis-persecond-url", url, "--redis-persecond-tls-key", "k.pem"}, "--redis-persecond-tls-cert and --redis-persecond-tls-key"},
		{[]string{"--redis-url", url, "--redis-persecond-url", url, "--redis-persecond-tls-ca", "/nonexistent.pem"}, "--redis-persecond-tls-ca"},
		{[]string{"--redis-url", url, "--redis-connect-retry", "0s"}, "--redis-connect-retry"},
		{[]string{"--redis-url", url, "--redis-connect-retry", "1s", "--redis-connect-retry-max", "10ms"}, "--redis-connect-retry-max"},
		{[]string{"--redis-url", url, "--redis-connect-max-wait", "-1s"}, "--redis-connect-max-wait"},
		// A Redis not up yet is waited for, with --redis-connect-max-wait
		// only so long (the error names the Redis).
		{[]string{"--redis-url", url, "--redis-connect-retry", "1ms", "--redis-connect-max-wait", "1ms"}, "redis 127.0.0.1:1: not reachable after 1ms (--redis-connect-max-wait)"},
		{[]string{"--redis-url", "redis://" + redistest.Start(t).Addr, "--redis-persecond-url", url, "--redis-connect-retry", "1ms", "--redis-connect-max-wait", "1ms"},
			"redis 127.0.0.1:1: not reachable after 1ms"},
	} {
		args := append([]string{"--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--store", "redis"}, c.args...)
		err := serve(testCtx(t), args, serveEnv{}.get, &bytes.Buffer{}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("serve %v: error %v, want one about %q", c.args, err, c.want)
		}
	}
}

// buildSluice builds this command without the race detector (the
// multi-process tests measure grants, not races, and the race detector
// would make three servers on two cores crawl).
func buildSluice(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sluice")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// startSluices starts n `sluice serve` processes on the given store flags
// and returns their gRPC addresses once each reports SERVING.
func startSluices(t *testing.T, n int, config string, storeArgs ...string) []string {
	t.Helper()
	bin := buildSluice(t)
	var addrs []string
	for i := range n {
		args := append([]string{"serve", "--config", config, "--grpc-addr", "127.0.0.1:0",
			"--http-addr", "127.0.0.1:0", "--log-level", "info", "--log-format", "text"}, storeArgs...)
		// A process checks Redis at startup and exits if no PONG comes
		// within the probe's 500 ms (per node of a Cluster): on a busy
		// machine that happens with Redis up. Like a supervisor, start it
		// again then (these tests are about serving, not starting).
		var addr string
		for attempt := 1; ; attempt++ {
			var exited bool
			addr, exited = startSluice(t, i, bin, args)
			if !exited {
				break
			}
			if attempt == 3 {
				t.Fatalf("sluice %d exited at startup %d times", i, attempt)
			}
		}
		addrs = append(addrs, addr)
	}
	return addrs
}

// startSluice starts process i of startSluices and waits until it reports
// SERVING, or reports exited if it gave up at startup on a Redis that did
// not answer its check in time.
func startSluice(t *testing.T, i int, bin string, args []string) (addr string, exited bool) {
	t.Helper()
	cmd := redistest.Command(bin, args...)
	var out logbuf.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	log := out.String
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("sluice %d output:\n%s", i, log())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		var ok bool
		if addr, _, ok = servingAddrs(log()); ok {
			break
		}
		select {
		case <-done:
			if l := log(); strings.Contains(l, "redis: ping") && strings.Contains(l, "deadline exceeded") {
				t.Logf("sluice %d gave up on Redis at startup (a busy machine): again\n%s", i, l)
				return "", true
			}
			t.Fatalf("sluice %d exited:\n%s", i, log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice %d did not serve:\n%s", i, log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, hc := dialRLS(t, addr)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && r.Status == healthpb.HealthCheckResponse_SERVING {
			return addr, false
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice %d not serving: %v\n%s", i, err, log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

const multiConfig = `domain: shared
descriptors:
  - key: fw
    rate_limit: {unit: year, requests_per_unit: 1000}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 100, algorithm: token_bucket, burst: 500}
  - key: a
    rate_limit: {unit: year, requests_per_unit: 300}
  - key: b
    rate_limit: {unit: year, requests_per_unit: 500}
  - key: c
    rate_limit: {unit: year, requests_per_unit: 1000}
`

func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

func desc(kv ...string) *ratelimitpb.RateLimitDescriptor {
	d := &ratelimitpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hammer sends total requests from clients goroutines spread over the
// servers and returns how many were OK.
func hammer(t *testing.T, addrs []string, clients, total int, req *rlspb.RateLimitRequest) int64 {
	t.Helper()
	rls := make([]rlspb.RateLimitServiceClient, len(addrs))
	for i, a := range addrs {
		rls[i], _ = dialRLS(t, a)
	}
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			client := rls[c%len(rls)]
			for next.Add(1) <= int64(total) {
				// A deadline per call, not one for the whole run: tens of
				// thousands of calls take minutes on a busy machine, and
				// this test counts grants, not time.
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				resp, err := client.ShouldRateLimit(ctx, req)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == rlspb.RateLimitResponse_OK {
					ok.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return ok.Load()
}

// remaining asks without consuming (hits_addend 0) what is left of each
// descriptor.
func remaining(t *testing.T, addr string, descs ...*ratelimitpb.RateLimitDescriptor) []uint32 {
	t.Helper()
	rls, _ := dialRLS(t, addr)
	for _, d := range descs {
		d.HitsAddend = wrapperspb.UInt64(0)
	}
	resp, err := rls.ShouldRateLimit(testCtx(t), &rlspb.RateLimitRequest{Domain: "shared", Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	var out []uint32
	for _, s := range resp.Statuses {
		out = append(out, s.LimitRemaining)
	}
	return out
}

// noOverGrant is the shared-limit test: 32 clients over three sluice
// processes on one Redis deployment never grant more than the limits:
// total requests at one fixed-window key, a fifth of that at a token
// bucket, a tenth with three descriptors.
func noOverGrant(t *testing.T, total int, storeArgs ...string) {
	addrs := startSluices(t, 3, writeConfig(t, multiConfig), storeArgs...)

	if got := hammer(t, addrs, 32, total, &rlspb.RateLimitRequest{Domain: "shared",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{desc("fw", "x")}}); got != 1000 {
		t.Errorf("fixed window: %d of %d granted, want exactly 1000", got, total)
	}

	start := time.Now()
	got := hammer(t, addrs, 32, total/5, &rlspb.RateLimitRequest{Domain: "shared",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{desc("tb", "x")}})
	refill := int64(time.Since(start)/(10*time.Millisecond)) + 1 // 100 per second
	if got < 500 || got > 500+refill {
		t.Errorf("token bucket: %d granted, want the burst 500 plus at most the %d refilled", got, refill)
	}

	multi := &rlspb.RateLimitRequest{Domain: "shared",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{desc("a", "x"), desc("b", "x"), desc("c", "x")}}
	if got := hammer(t, addrs, 32, total/10, multi); got != 300 {
		t.Errorf("multi-descriptor: %d granted, want the 300 of the tightest descriptor", got)
	}
	// No descriptor was charged for the denied requests.
	rem := remaining(t, addrs[1], desc("a", "x"), desc("b", "x"), desc("c", "x"))
	if fmt.Sprint(rem) != "[0 200 700]" {
		t.Errorf("remaining after the multi-descriptor run: %v, want [0 200 700]", rem)
	}
}

// storeTimeout is the tests' --redis-timeout (REDIS_TIMEOUT) and
// --memcache-timeout where every call to a store that is up must be
// answered by it: the defaults (1 s, 500 ms, dialling and TLS handshakes
// included) can pass on a busy machine, and the failure mode answers
// instead. A call to a store that was killed fails at once (connection
// refused), so the tests take no longer.
const storeTimeout = "10s"

// noOverGrantTimeout is the processes' --redis-timeout: these tests count
// grants, and on a busy machine a call to Redis can take longer than the
// 1 s default (a call that failed would be an error, not a grant).
const noOverGrantTimeout = "30s"

func TestServeRedis_ThreeProcessesNoOverGrant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis and three sluice processes")
	}
	srv := redistest.Start(t)
	noOverGrant(t, 50_000, "--store", "redis", "--redis-url", "redis://"+srv.Addr, "--redis-timeout", noOverGrantTimeout)
}

func TestServeRedis_ClusterNoOverGrant(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster and three sluice processes")
	}
	cl := redistest.StartCluster(t, 3)
	seeds := ""
	for i, s := range cl.Seeds() {
		if i > 0 {
			seeds += ","
		}
		seeds += s
	}
	noOverGrant(t, 5_000, "--store", "redis", "--redis-cluster", seeds, "--redis-timeout", noOverGrantTimeout)
}

// TestServeRedis_FailureModeAndHealth: with Redis down, requests get the
// failure mode's answer and (with --redis-health) health is NOT_SERVING,
// also across a config reload; when Redis is back, both recover without a
// restart.
func TestServeRedis_FailureModeAndHealth(t *testing.T) {
	srv := redistest.Start(t)
	limits, err := os.ReadFile("testdata/serve/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := writeConfig(t, string(limits))
	grpcAddr, httpAddr, stop := startServe(t, nil, "--config", dir, "--store", "redis",
		"--redis-url", "redis://"+srv.Addr, "--redis-timeout", storeTimeout, "--redis-failure-mode", "allow", "--redis-health")
	defer stop()
	rls, hc := dialRLS(t, grpcAddr)
	ctx := testCtx(t)
	serving := func() bool {
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && r.Status == healthpb.HealthCheckResponse_SERVING
	}
	ask := func() rlspb.RateLimitResponse_Code {
		resp, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", "10.9.9.9"))
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	if !serving() || ask() != rlspb.RateLimitResponse_OK {
		t.Fatal("not serving with Redis up")
	}
	metricUp := func(want string) {
		t.Helper()
		if m := httpGet(t, "http://"+httpAddr+"/metrics"); !strings.Contains(m, "\nsluice_redis_up "+want+"\n") {
			t.Errorf("/metrics: no sluice_redis_up %s", want)
		}
	}
	metricUp("1")
	if m := httpGet(t, "http://"+httpAddr+"/metrics"); !strings.Contains(m, `sluice_redis_call_duration_seconds_count{result="ok"} 1`) {
		t.Errorf("/metrics: the one Redis call is not timed:\n%s", m)
	}
	srv.Kill()
	// The limit is 2 per minute: with Redis down, "allow" answers OK to
	// every request.
	for i := range 5 {
		if c := ask(); c != rlspb.RateLimitResponse_OK {
			t.Fatalf("request %d with Redis down: %v, want OK (failure mode allow)", i, c)
		}
	}
	waitUntil(t, mustWithin, "NOT_SERVING with Redis down", func() bool { return !serving() })
	metricUp("0")

	// A config reload while Redis is down must not flip health to
	// SERVING, not even until Redis's health is next polled: Watch
	// reports every change.
	watch, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	statuses := make(chan healthpb.HealthCheckResponse_ServingStatus, 16)
	go func() {
		for {
			r, err := watch.Recv()
			if err != nil {
				return
			}
			statuses <- r.Status
		}
	}()
	if st := <-statuses; st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("Watch starts at %v with Redis down", st)
	}
	reloads := func() bool {
		return strings.Contains(httpGet(t, "http://"+httpAddr+"/metrics"), `sluice_config_reloads_total{result="success"} 1`)
	}
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), append(limits, "\n# edited\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, mustWithin, "config reloaded", reloads)
	select {
	case st := <-statuses:
		t.Fatalf("health changed to %v on a config reload with Redis down", st)
	case <-time.After(300 * time.Millisecond):
	}

	srv.Restart()
	waitUntil(t, mustWithin, "SERVING with Redis back", serving)
	// Counting again, from zero (the killed Redis kept nothing): the
	// limit of 2 per minute holds.
	for i := range 2 {
		if c := ask(); c != rlspb.RateLimitResponse_OK {
			t.Fatalf("request %d after recovery: %v, want OK", i, c)
		}
	}
	if c := ask(); c != rlspb.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after recovery: %v, want OVER_LIMIT (Redis counts again)", c)
	}
	m := httpGet(t, "http://"+httpAddr+"/metrics")
	for _, want := range []string{"\nsluice_redis_transitions_total{to=\"down\"} 1\n", "\nsluice_redis_transitions_total{to=\"up\"} 1\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %q", strings.TrimSpace(want))
		}
	}
	if !regexp.MustCompile(`\nsluice_redis_failed_takes_total ([5-9]|\d\d+)\n`).MatchString(m) {
		t.Errorf("/metrics: sluice_redis_failed_takes_total does not count the 5 requests answered while Redis was down")
	}
}

// TestServeRedis_LogsOutage: serve's log gets one WARN line naming Redis's
// address and the failure mode in force when Redis becomes unreachable,
// and one INFO line when it is back.
func TestServeRedis_LogsOutage(t *testing.T) {
	srv := redistest.Start(t)
	dir := writeConfig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	var logs logbuf.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- serve(ctx, []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--config", dir,
			"--store", "redis", "--redis-url", "redis://" + srv.Addr, "--store-failure-mode", "deny", "--redis-timeout", storeTimeout,
			"--rlqs=false"}, // RLQS logs its own failed exchanges with Redis
			func(string) string { return "" }, &logs, func(net.Addr, net.Addr) { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		cancel()
		t.Fatal(err)
	}
	// (Deferred only once serve is known to run: a serve that failed to
	// start has sent its one error already, and a second read would hang.)
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	srv.Kill()
	waitUntil(t, mustWithin, "a WARN line", func() bool { return strings.Contains(logs.String(), "level=WARN") })
	srv.Restart()
	waitUntil(t, mustWithin, "an INFO line", func() bool { return strings.Contains(logs.String(), "redis reachable again") })
	out := logs.String()
	warn := regexp.MustCompile(`level=WARN msg="redis unreachable: answering by the failure mode" addr=` + regexp.QuoteMeta(srv.Addr) + ` cause=".+" failure_mode=deny`)
	if n := len(warn.FindAllString(out, -1)); n != 1 || strings.Count(out, "level=WARN") != 1 {
		t.Errorf("want one WARN line with the address, cause and failure mode, got:\n%s", out)
	}
	if !regexp.MustCompile(`level=INFO msg="redis reachable again" addr=\S+ outage=\S+ answered_by_failure_mode=\d+`).MatchString(out) {
		t.Errorf("want an INFO line with the outage, got:\n%s", out)
	}
}

func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServeRedis_ClusterSlotsNotChosenByValues: descriptor values holding
// a Redis Cluster hash tag ("{t}...") do not choose their counters' slot:
// the counters of 60 such values spread over the cluster's three nodes,
// where a tag would put them all on one.
func TestServeRedis_ClusterSlotsNotChosenByValues(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	cfg := writeConfig(t, "domain: tags\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	grpcAddr, _, _ := startServe(t, nil, "--config", cfg, "--store", "redis", "--redis-cluster", strings.Join(cl.Seeds(), ","), "--redis-timeout", storeTimeout)
	rls, _ := dialRLS(t, grpcAddr)
	for i := range 60 {
		resp, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("tags", "user", fmt.Sprintf("{t}%d", i)))
		if err != nil || resp.OverallCode != rlspb.RateLimitResponse_OK {
			t.Fatalf("request %d: %v %v", i, resp, err)
		}
	}
	var counts []string
	for _, n := range cl.Nodes {
		c := strings.TrimSpace(n.CLI("dbsize"))
		if c == "0" {
			t.Errorf("a node holds no counter: keys per node %v so far; a client's hash tag chose the slot", append(counts, c))
		}
		counts = append(counts, c)
	}
	t.Logf("keys per node: %v", counts)
}
