package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// serveEnv maps variable names to values for serve's getenv.
type serveEnv map[string]string

func (e serveEnv) get(k string) string { return e[k] }

// parseServe registers serve's flags and the backends', parses args and
// applies env; it returns the flag set for inspection.
func parseServe(t *testing.T, args []string, env serveEnv) (*flag.FlagSet, []string, error) {
	t.Helper()
	fs := newServeCmd(io.Discard).fs
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	warnings, err := applyEnv(fs, env.get)
	return fs, warnings, err
}

// TestServe_EnvPrecedence: flag > SLUICE_* > the reference's variable >
// default, flag by flag.
func TestServe_EnvPrecedence(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  serveEnv
		flag string
		want string
	}{
		{"default", nil, nil, "grpc-addr", ":8081"},
		{"reference", nil, serveEnv{"GRPC_PORT": "9000"}, "grpc-addr", ":9000"},
		{"reference host", nil, serveEnv{"GRPC_HOST": "127.0.0.1", "GRPC_PORT": "9000"}, "grpc-addr", "127.0.0.1:9000"},
		{"SLUICE_ over reference", nil, serveEnv{"GRPC_PORT": "9000", "SLUICE_GRPC_ADDR": ":9001"}, "grpc-addr", ":9001"},
		{"flag over all", []string{"--grpc-addr", ":9002"}, serveEnv{"GRPC_PORT": "9000", "SLUICE_GRPC_ADDR": ":9001"}, "grpc-addr", ":9002"},
		{"PORT", nil, serveEnv{"PORT": "7000", "HOST": "0.0.0.0"}, "http-addr", ":7000"},
		{"runtime dirs", nil, serveEnv{"RUNTIME_ROOT": "/srv/runtime", "RUNTIME_SUBDIRECTORY": "ratelimit"}, "config", "/srv/runtime/ratelimit/config"},
		{"runtime app dir", nil, serveEnv{"RUNTIME_ROOT": "/r", "RUNTIME_SUBDIRECTORY": "s", "RUNTIME_APPDIRECTORY": "limits"}, "config", "/r/s/limits"},
		{"LOG_LEVEL", nil, serveEnv{"LOG_LEVEL": "WARN"}, "log-level", "warn"},
		{"LOG_LEVEL logrus", nil, serveEnv{"LOG_LEVEL": "trace"}, "log-level", "debug"},
		{"LOG_FORMAT", nil, serveEnv{"LOG_FORMAT": "json"}, "log-format", "json"},
		{"SHADOW_MODE", nil, serveEnv{"SHADOW_MODE": "true"}, "shadow-mode", "true"},
		{"SLUICE_ bool", nil, serveEnv{"SLUICE_SHADOW_MODE": "true"}, "shadow-mode", "true"},
		{"QUOTA_MODE", nil, serveEnv{"QUOTA_MODE": "true"}, "quota-mode", "true"},
		{"RESPONSE_DYNAMIC_METADATA", nil, serveEnv{"RESPONSE_DYNAMIC_METADATA": "true"}, "response-dynamic-metadata", "true"},
		{"SLUICE_IETF_HEADERS", nil, serveEnv{"SLUICE_IETF_HEADERS": "true"}, "ietf-headers", "true"},
		{"response headers", nil, serveEnv{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}, "response-headers", "true"},
		{"header name", nil, serveEnv{"LIMIT_REMAINING_HEADER": "X-Left"}, "header-remaining", "X-Left"},
		{"merge", nil, serveEnv{"MERGE_DOMAIN_CONFIG": "true"}, "merge-domains", "true"},
		{"near limit", nil, serveEnv{"NEAR_LIMIT_RATIO": "0.9"}, "near-limit-ratio", "0.9"},
		{"max age", nil, serveEnv{"GRPC_MAX_CONNECTION_AGE": "5m"}, "max-connection-age", "5m0s"},
		{"GRPC_UDS", nil, serveEnv{"GRPC_UDS": "/run/rls.sock"}, "grpc-addr", "unix:///run/rls.sock"},
		{"GRPC_UDS over GRPC_PORT", nil, serveEnv{"GRPC_PORT": "9000", "GRPC_UDS": "/run/rls.sock"}, "grpc-addr", "unix:///run/rls.sock"},
		{"GRPC_CLIENT_TLS_SAN", nil, serveEnv{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k",
			"GRPC_CLIENT_TLS_CACERT": "/ca", "GRPC_CLIENT_TLS_SAN": "envoy"}, "tls-client-san", "envoy"},
		{"GRPC_CLIENT_TLS_SAN without mTLS", nil, serveEnv{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k",
			"GRPC_CLIENT_TLS_SAN": "envoy"}, "tls-client-san", ""},
		{"TLS only with USE_TLS", nil, serveEnv{"GRPC_SERVER_TLS_CERT": "/c"}, "tls-cert", ""},
		{"TLS", nil, serveEnv{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k"}, "tls-cert", "/c"},
		{"TLS as ParseBool reads it", nil, serveEnv{"GRPC_SERVER_USE_TLS": "1", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k"}, "tls-cert", "/c"},
		{"BACKEND_TYPE memory", nil, serveEnv{"BACKEND_TYPE": "memory"}, "store", "memory"},
		{"HTTP plain with the reference's TLS", nil, serveEnv{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k"}, "tls-http", "false"},
		{"HTTP TLS with --tls-cert", nil, nil, "tls-http", "true"},
		{"USE_STATSD", nil, serveEnv{"USE_STATSD": "true", "STATSD_PORT": "9125"}, "statsd-addr", "localhost:9125"},
		{"USE_STATSD host", nil, serveEnv{"USE_STATSD": "true", "STATSD_HOST": "10.0.0.5"}, "statsd-addr", "10.0.0.5:8125"},
		{"STATSD_PORT alone", nil, serveEnv{"STATSD_PORT": "9125"}, "statsd-addr", "localhost:9125"},
		{"USE_STATSD false", nil, serveEnv{"USE_STATSD": "false", "STATSD_PORT": "9125"}, "statsd-addr", ""},
		{"STATSD_PROTOCOL unset", nil, serveEnv{"USE_STATSD": "true"}, "statsd-protocol", "tcp"},
		{"STATSD_PROTOCOL", nil, serveEnv{"USE_STATSD": "true", "STATSD_PROTOCOL": "UDP"}, "statsd-protocol", "udp"},
		{"STATSD_PROTOCOL without statsd", nil, serveEnv{"STATSD_PROTOCOL": "tcp"}, "statsd-protocol", "udp"},
		{"USE_DOG_STATSD", nil, serveEnv{"USE_DOG_STATSD": "true", "USE_STATSD": "false"}, "statsd-dogstatsd", "true"},
		{"USE_DOG_STATSD address", nil, serveEnv{"USE_DOG_STATSD": "true"}, "statsd-addr", "localhost:8125"},
		{"USE_DOG_STATSD is UDP", nil, serveEnv{"USE_DOG_STATSD": "true", "STATSD_PROTOCOL": "tcp"}, "statsd-protocol", "udp"},
		{"USE_DOG_STATSD false", nil, serveEnv{"USE_DOG_STATSD": "false"}, "statsd-dogstatsd", "false"},
		{"DISABLE_STATS", nil, serveEnv{"USE_STATSD": "true", "DISABLE_STATS": "true"}, "statsd-addr", ""},
		{"EXTRA_TAGS", nil, serveEnv{"USE_STATSD": "true", "EXTRA_TAGS": "a:b,c:d"}, "stats-tags", "a:b,c:d"},
		{"STATS_FLUSH_INTERVAL", nil, serveEnv{"USE_STATSD": "true", "STATS_FLUSH_INTERVAL": "3s"}, "stats-flush-interval", "3s"},
		{"USE_PROMETHEUS default addr", nil, serveEnv{"USE_PROMETHEUS": "true"}, "ref-prometheus-addr", ":9090"},
		{"USE_PROMETHEUS", nil, serveEnv{"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001"}, "ref-prometheus-addr", ":19001"},
		{"PROMETHEUS_PATH", nil, serveEnv{"USE_PROMETHEUS": "true", "PROMETHEUS_PATH": "/m"}, "ref-prometheus-path", "/m"},
		{"PROMETHEUS_MAPPER_YAML", nil, serveEnv{"USE_PROMETHEUS": "true", "PROMETHEUS_MAPPER_YAML": "/etc/m.yaml"}, "ref-prometheus-mapping", "/etc/m.yaml"},
		{"PROMETHEUS_* need USE_PROMETHEUS", nil, serveEnv{"PROMETHEUS_ADDR": ":19001"}, "ref-prometheus-addr", ""},
		{"response time ms", nil, serveEnv{"USE_PROMETHEUS": "true", "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"}, "ref-prometheus-response-time-ms", "true"},
	}
	for _, c := range cases {
		fs, _, err := parseServe(t, c.args, c.env)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := flagValue(fs, c.flag); got != c.want {
			t.Errorf("%s: --%s = %q, want %q", c.name, c.flag, got, c.want)
		}
	}
}

func TestServe_EnvRefusedAndIgnored(t *testing.T) {
	for _, env := range []serveEnv{
		{"CONFIG_TYPE": "GRPC_XDS_DELTA"},
		{"BACKEND_TYPE": "couchbase"},
		{"GRPC_SERVER_USE_TLS": "true"},
		{"GRPC_SERVER_USE_TLS": "yes"},
		{"SLUICE_MAX_ENTRIES": "many"},
		{"USE_DOG_STATSD": "true", "USE_STATSD": "true"},
		{"USE_STATSD": "yes please"},
		{"USE_STATSD": "true", "STATSD_PROTOCOL": "quic"},
		{"TRACING_ENABLED": "maybe"}, // mapped (serve_tracing_test.go); a malformed boolean is refused
	} {
		if _, _, err := parseServe(t, nil, env); err == nil {
			t.Errorf("%v: accepted, want refused", env)
		}
	}
	// BACKEND_TYPE=redis selects the redis backend when this build has it.
	fs, _, err := parseServe(t, nil, serveEnv{"BACKEND_TYPE": "redis"})
	if _, have := backends["redis"]; have {
		if err != nil || flagValue(fs, "store") != "redis" {
			t.Errorf("BACKEND_TYPE=redis: store %q err %v, want redis", flagValue(fs, "store"), err)
		}
	} else if err == nil {
		t.Errorf("BACKEND_TYPE=redis without a redis backend: accepted")
	}
	// REDIS_URL alone selects Redis too: the reference's default backend.
	fs, _, err = parseServe(t, nil, serveEnv{"REDIS_URL": "127.0.0.1:6379"})
	if _, have := backends["redis"]; have && (err != nil || flagValue(fs, "store") != "redis") {
		t.Errorf("REDIS_URL: store %q err %v, want redis", flagValue(fs, "store"), err)
	}
	// CONFIG_TYPE=FILE is what Sluice does.
	if _, _, err := parseServe(t, nil, serveEnv{"CONFIG_TYPE": "FILE"}); err != nil {
		t.Errorf("CONFIG_TYPE=FILE: %v", err)
	}
	_, warnings, err := parseServe(t, nil, serveEnv{"REDIS_POOL_SIZE": "10", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "true"})
	if err != nil || len(warnings) != 2 || !strings.Contains(warnings[1], "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT is ignored") {
		t.Errorf("ignored variables: warnings %q err %v, want 2 warnings", warnings, err)
	}
}

// startServe runs serve in this process with real loopback listeners and
// returns its addresses and a stop function that waits for it to return.
func startServe(t *testing.T, env serveEnv, args ...string) (grpcAddr, httpAddr string, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	args = append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-level", "error"}, args...)
	go func() {
		done <- serve(ctx, args, env.get, io.Discard, func(g, h net.Addr) { ready <- [2]string{g.String(), h.String()} })
	}()
	select {
	case a := <-ready:
		var once sync.Once
		var err error
		stop = func() error {
			once.Do(func() { cancel(); err = <-done })
			return err
		}
		t.Cleanup(func() { stop() })
		return a[0], a[1], stop
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v", err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("serve did not start")
	}
	return "", "", nil
}

func dialRLS(t *testing.T, addr string, opts ...grpc.DialOption) (rlspb.RateLimitServiceClient, healthpb.HealthClient) {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return rlspb.NewRateLimitServiceClient(cc), healthpb.NewHealthClient(cc)
}

func rlsRequest(domain string, kv ...string) *rlspb.RateLimitRequest {
	d := &ratelimitpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitpb.RateLimitDescriptor{d}}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestServe_EndToEnd runs serve in process on loopback listeners: gRPC
// with go-control-plane's client, HTTP, health; then a clean stop.
func TestServe_EndToEnd(t *testing.T) {
	grpcAddr, httpAddr, stop := startServe(t, nil, "--config", "testdata/serve", "--response-headers")
	rls, hc := dialRLS(t, grpcAddr)
	ctx := testCtx(t)
	for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		got, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", "10.1.1.1"))
		if err != nil || got.OverallCode != want {
			t.Fatalf("request %d: %v %v, want %v", i, got, err, want)
		}
		if len(got.ResponseHeadersToAdd) == 0 {
			t.Errorf("request %d: no response headers with --response-headers", i)
		}
	}
	if _, err := rls.ShouldRateLimit(ctx, rlsRequest("")); status.Code(err) != codes.InvalidArgument {
		t.Errorf("empty domain: %v, want InvalidArgument", err)
	}
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health: %v %v", r, err)
	}
	res, err := http.Post("http://"+httpAddr+"/v1/check", "application/json", strings.NewReader(`{"domain":"e2e","key":"path","value":"/login"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("RateLimit-Limit") != "1" {
		t.Errorf("/v1/check: %s %v", res.Status, res.Header)
	}
	if err := stop(); err != nil {
		t.Errorf("serve returned %v after its context ended, want nil", err)
	}
}

func TestServe_BadSettings(t *testing.T) {
	for _, args := range [][]string{
		{}, // no --config
		{"--config", "testdata/serve", "--store", "nope"},
		{"--config", "testdata/serve", "--denied-hits", "sometimes"},
		{"--config", "testdata/serve", "--store-failure-mode", "open"},
		{"--config", "testdata/serve", "--tls-cert", "x.pem"},
		{"--config", "testdata/serve", "--log-level", "loud"},
		{"--config", "testdata/serve", "--grpc-max-concurrent-streams", "0"},
		{"--config", t.TempDir()}, // empty without --allow-empty-config
		{"--config", filepath.Join(t.TempDir(), "missing"), "--allow-empty-config"},
	} {
		err := serve(testCtx(t), append(args, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"), serveEnv{}.get, io.Discard, nil)
		if err == nil {
			t.Errorf("serve %q: no error", args)
		}
	}
}

// TestServe_EmptyConfigThenLoad starts with an empty directory: NOT_SERVING
// and UNAVAILABLE until a valid file appears, then SERVING.
func TestServe_EmptyConfigThenLoad(t *testing.T) {
	dir := t.TempDir()
	grpcAddr, httpAddr, _ := startServe(t, nil, "--config", dir, "--allow-empty-config")
	rls, hc := dialRLS(t, grpcAddr)
	ctx := testCtx(t)
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health before config: %v %v, want NOT_SERVING", r, err)
	}
	if res, err := http.Get("http://" + httpAddr + "/healthcheck"); err != nil || res.StatusCode != 503 {
		t.Fatalf("/healthcheck before config: %v %v, want 503", res, err)
	} else {
		res.Body.Close()
	}
	if _, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "a", "b")); status.Code(err) != codes.Unavailable {
		t.Fatalf("before config: %v, want Unavailable", err)
	}
	data, err := os.ReadFile("testdata/serve/limits.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := w.Recv()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		if r.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	if got, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "path", "/login")); err != nil || got.Statuses[0].CurrentLimit.GetName() != "login" {
		t.Errorf("after config: %v %v", got, err)
	}
}

// TestServe_ReloadUnderLoad rewrites the config 100 times while clients
// hammer the server: no request fails.
func TestServe_ReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "limits.yaml")
	write := func(i int) {
		y := fmt.Sprintf("domain: load\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", 1000000+i)
		if err := os.WriteFile(file+".tmp", []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".tmp", file); err != nil {
			t.Fatal(err)
		}
	}
	write(0)
	grpcAddr, _, _ := startServe(t, nil, "--config", dir)
	rls, _ := dialRLS(t, grpcAddr)
	ctx := testCtx(t)

	var stopLoad atomic.Bool
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for c := range 4 {
		wg.Go(func() {
			req := rlsRequest("load", "k", fmt.Sprint(c))
			for !stopLoad.Load() {
				r, err := rls.ShouldRateLimit(ctx, req)
				if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit == nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%v %v", r, err))
					continue
				}
				ok.Add(1)
			}
		})
	}
	start := time.Now()
	for i := 1; i <= 100; i++ {
		write(i)
		// Every fourth change waits out the watcher's debounce, so about
		// 25 reloads happen under load; the others come in bursts.
		if i%4 == 0 {
			time.Sleep(150 * time.Millisecond)
		}
	}
	t.Logf("100 changes in %v", time.Since(start))
	// The last version comes into force while the load goes on.
	for {
		r, err := rls.ShouldRateLimit(ctx, rlsRequest("load", "k", "probe"))
		if err != nil {
			t.Fatal(err)
		}
		if r.Statuses[0].CurrentLimit.GetRequestsPerUnit() == 1000100 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the last config never came into force: %v", r)
		}
	}
	stopLoad.Store(true)
	wg.Wait()
	t.Logf("%d requests in %v", ok.Load(), time.Since(start))
	if failed.Load() > 0 {
		t.Errorf("%d of %d requests failed during reloads; first: %v", failed.Load(), failed.Load()+ok.Load(), firstErr.Load())
	}
	if ok.Load() < 100 {
		t.Errorf("only %d requests during 100 reloads", ok.Load())
	}
}
