package main

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/observe/tracing/tracingtest"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// egRefused are the Envoy Gateway test deployments Sluice refuses to
// start, each with a piece of its reason; every other one starts.
var egRefused = map[string]string{
	"patch-deployment-containers": "Sentinel wants master,host:port", // REDIS_TYPE=sentinel with one host:port
}

// egDeployments reads the environment of Envoy Gateway's test
// deployments (testdata/envoy-gateway/deployments.yaml), and adds the one
// of Envoy Gateway releases that ran a statsd-exporter sidecar (issue 19).
func egDeployments(t *testing.T) map[string][][2]string {
	t.Helper()
	b, err := os.ReadFile("testdata/envoy-gateway/deployments.yaml")
	if err != nil {
		t.Fatal(err)
	}
	deps := map[string][][2]string{}
	if err := yaml.Unmarshal(b, &deps); err != nil {
		t.Fatal(err)
	}
	if len(deps) < 19 {
		t.Fatalf("%d deployments, want Envoy Gateway's 19", len(deps))
	}
	sidecar := slices.Clone(deps["default"])
	for i, kv := range sidecar {
		if kv[0] == "USE_STATSD" {
			sidecar[i][1] = "true"
		}
	}
	deps["statsd-sidecar"] = append(slices.DeleteFunc(sidecar, func(kv [2]string) bool {
		return strings.HasPrefix(kv[0], "PROMETHEUS_") || kv[0] == "USE_PROMETHEUS"
	}), [2]string{"STATSD_PORT", "9125"})
	return deps
}

// TestEnvoyGatewayDeployments runs serve with the environment of each of
// Envoy Gateway's test deployments, its files (certificates, statsd
// mapping) at the same paths under a temporary root, the limits pushed
// over xDS (CONFIG_TYPE=GRPC_XDS_SOTW, as in every one of them) by a
// go-control-plane server that requires the client certificate the
// deployment names, a local Redis (with TLS and a password where the
// deployment has them) and local statsd and metrics ports. Each starts or
// is refused as egRefused says. One that starts takes the push, answers
// ShouldRateLimit over TLS, reports SERVING over gRPC and on the plain
// HTTP /healthcheck that the probes read, keeps Sluice's /metrics, and
// sends the reference's stats where the deployment asks: statsd lines on
// UDP, the Prometheus series of Envoy Gateway's mapping on
// PROMETHEUS_ADDR, and with TRACING_ENABLED=true the span of a call to an
// OTLP receiver, a child of the traceparent the call sent.
func TestEnvoyGatewayDeployments(t *testing.T) {
	root := t.TempDir()
	ca := testcert.NewCA(t)
	for _, d := range []string{"certs", "redis-certs", "etc/statsd-exporter"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	caFile := ca.WriteFile(t, filepath.Join(root, "certs"))
	// /certs/tls.crt serves gRPC and is the xDS client's certificate.
	ca.Peer(t).WriteFiles(t, filepath.Join(root, "certs"), "tls")
	ca.Client(t).WriteFiles(t, filepath.Join(root, "redis-certs"), "tls")
	redisCert, redisKey := ca.Server(t).WriteFiles(t, t.TempDir(), "redis")
	xs := xdstest.Start(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Peer(t).TLS(t)},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	// Every deployment has node id envoy-ratelimit: each takes this push.
	xs.Push(t, egNode, "1", &ratelimitpb.RateLimitConfig{Name: "eg", Domain: "eg", Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "k", DetailedMetric: true, RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: 2},
	}}})
	mapping, err := os.ReadFile("../../observe/testdata/envoy-gateway-statsd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/statsd-exporter/conf.yaml"), mapping, 0o644); err != nil {
		t.Fatal(err)
	}
	plain := redistest.Start(t)
	secure := redistest.StartTLS(t, redisCert, redisKey, caFile, "--requirepass", "redis_auth_password")
	statsd, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer statsd.Close()
	creds := credentials.NewTLS(&tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12})

	deps := egDeployments(t)
	names := make([]string, 0, len(deps))
	for n := range deps {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			env := serveEnv{}
			for _, kv := range deps[name] {
				v := kv[1]
				for _, p := range []string{"/certs/", "/redis-certs/", "/etc/statsd-exporter/"} {
					if strings.HasPrefix(v, p) {
						v = root + v
					}
				}
				env[kv[0]] = v
			}
			// The test's own: the local xDS server, Redis and statsd, a
			// local port for the reference's metrics, flushed often. A
			// cluster's CA is in the system roots; the test's goes in
			// REDIS_TLS_CACERT.
			env["CONFIG_GRPC_XDS_SERVER_URL"] = xs.Addr
			env["REDIS_URL"] = plain.Addr
			if env["REDIS_TLS"] == "true" {
				env["REDIS_URL"], env["REDIS_TLS_CACERT"] = secure.Addr, caFile
			}
			if env["USE_STATSD"] == "true" {
				env["STATSD_HOST"], env["STATSD_PORT"] = "127.0.0.1", strconv.Itoa(statsd.LocalAddr().(*net.UDPAddr).Port)
				// The reference's default is TCP (TestBinary_StatsdTCP);
				// statsd_exporter listens on both.
				env["STATSD_PROTOCOL"] = "udp"
			}
			if env["PROMETHEUS_ADDR"] != "" {
				env["PROMETHEUS_ADDR"] = "127.0.0.1:0"
			}
			env["STATS_FLUSH_INTERVAL"] = "20ms"
			// The first call on a new TLS connection to Redis can take more
			// than the default 10 ms (--redis-timeout) on a loaded machine.
			env["REDIS_TIMEOUT"] = storeTimeout

			args := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
			if want := egRefused[name]; want != "" {
				err := serve(context.Background(), args, env.get, io.Discard, nil)
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Fatalf("serve: %v, want refused with %q", err, want)
				}
				return
			}
			// OpenTelemetry's exporter reads OTEL_* from the process's
			// environment, not serve's getenv: the test's receiver goes
			// there.
			var traces *tracingtest.Receiver
			if env["TRACING_ENABLED"] == "true" {
				traces = tracingtest.StartHTTP(t)
				t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", traces.URL)
				t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
			}
			logs := &logbuf.Buffer{}
			grpcAddr, httpAddr := startServeLogged(t, env, logs, args...)
			rls, health := dialRLS(t, grpcAddr, grpc.WithTransportCredentials(creds))
			ctx := metadata.AppendToOutgoingContext(testCtx(t), traceHeaders["traceparent"]...)
			waitFor(t, func() bool { return strings.Contains(logs.String(), "xds: config applied (ACK)") }, "the xDS push")
			if h, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("gRPC health: %v %v", h, err)
			}
			if body := httpGet(t, "http://"+httpAddr+"/healthcheck"); !strings.Contains(body, "OK") {
				t.Errorf("/healthcheck over plain HTTP: %q", body)
			}
			for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
				resp, err := rls.ShouldRateLimit(ctx, rlsRequest("eg", "k", name))
				if err != nil {
					t.Fatal(err)
				}
				if resp.OverallCode != want {
					t.Fatalf("request %d: %v, want %v", i+1, resp.OverallCode, want)
				}
			}
			if traces != nil {
				clientChild(t, traces)
			}
			if body := httpGet(t, "http://"+httpAddr+"/metrics"); !strings.Contains(body, `sluice_rule_hits_total{domain="eg"`) {
				t.Error("Sluice's /metrics lost its series")
			}
			if env["USE_STATSD"] == "true" {
				want := "ratelimit.service.rate_limit.eg.k_" + name + ".total_hits:"
				waitStatsd(t, statsd, want)
			}
			if env["USE_PROMETHEUS"] == "true" {
				addr := logValue(t, logs, `msg="envoyproxy/ratelimit metrics"`, "addr")
				want := `ratelimit_service_rate_limit_over_limit{domain="eg",key1="k_` + name + `"} 1`
				waitFor(t, func() bool { return strings.Contains(httpGet(t, "http://"+addr+"/metrics"), want) }, want)
			}
		})
	}
}

// startServeLogged is startServe with serve's log (text, at the
// environment's level) written to logs.
func startServeLogged(t *testing.T, env serveEnv, logs io.Writer, args ...string) (grpcAddr, httpAddr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan [2]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, args, env.get, logs, func(g, h net.Addr) { ready <- [2]string{g.String(), h.String()} })
	}()
	select {
	case a := <-ready:
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
		return a[0], a[1]
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v\n%s", err, logs)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatal("serve did not start")
	}
	return "", ""
}

// logValue returns the value of key on the first log line containing
// marker.
func logValue(t *testing.T, logs *logbuf.Buffer, marker, key string) string {
	t.Helper()
	for line := range strings.Lines(logs.String()) {
		if !strings.Contains(line, marker) {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if v, ok := strings.CutPrefix(f, key+"="); ok {
				return v
			}
		}
	}
	t.Fatalf("no %s= on a log line with %s:\n%s", key, marker, logs)
	return ""
}

// mustWithin bounds the tests' waits for what must happen (a log line, a
// reload, a health change, a statsd line): long enough for a slow, busy
// CI machine, where a process can stall for seconds. A wait for what
// must not happen is short instead, and says so where it is.
const mustWithin = 30 * time.Second

// waitFor polls cond until it holds, failing t after mustWithin.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(mustWithin)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("no %s within %v", what, mustWithin)
		}
	}
}

// waitStatsd reads statsd datagrams from pc until a line starts with
// prefix.
func waitStatsd(t *testing.T, pc net.PacketConn, prefix string) {
	t.Helper()
	if err := pc.SetReadDeadline(time.Now().Add(mustWithin)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 65536)
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no statsd line %s...: %v", prefix, err)
		}
		for l := range strings.Lines(string(buf[:n])) {
			if strings.HasPrefix(l, prefix) {
				return
			}
		}
	}
}

// TestServe_RefStatsSettings: bad settings of the reference's stats stop
// serve with the flag's name; a missing mapping file (Envoy Gateway's
// ConfigMap is optional) falls back to the built-in mapping.
func TestServe_RefStatsSettings(t *testing.T) {
	cfg := "testdata/serve"
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("mappings: [{match: 'a.*', name: 'bad name'}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--statsd-addr", "no-port"}, "--statsd-addr"},
		{[]string{"--statsd-addr", "127.0.0.1:9", "--stats-tags", "novalue"}, "--stats-tags"},
		{[]string{"--statsd-addr", "127.0.0.1:9", "--stats-flush-interval", "0s"}, "--stats-flush-interval"},
		{[]string{"--ref-prometheus-addr", "127.0.0.1:0", "--ref-prometheus-path", "metrics"}, "--ref-prometheus-path"},
		{[]string{"--ref-prometheus-addr", "127.0.0.1:0", "--ref-prometheus-mapping", bad}, "--ref-prometheus-mapping"},
		{[]string{"--ref-prometheus-addr", "no-port"}, "--ref-prometheus-addr"},
	} {
		args := append([]string{"--config", cfg, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, c.args...)
		err := serve(context.Background(), args, serveEnv{}.get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error naming %s", c.args, err, c.want)
		}
	}

	logs := &logbuf.Buffer{}
	startServeLogged(t, serveEnv{}, logs, "--config", cfg, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--stats-flush-interval", "20ms", "--ref-prometheus-addr", "127.0.0.1:0", "--ref-prometheus-path", "/stats", "--ref-prometheus-mapping", filepath.Join(t.TempDir(), "absent.yaml"))
	addr := logValue(t, logs, `msg="envoyproxy/ratelimit metrics"`, "addr")
	if !strings.Contains(logs.String(), "no statsd mapping file: using the default mapping") {
		t.Errorf("no warning about the missing mapping file:\n%s", logs)
	}
	waitFor(t, func() bool {
		return strings.Contains(httpGet(t, "http://"+addr+"/stats"), "ratelimit_service_config_load_success 1")
	}, "ratelimit_service_config_load_success 1 on /stats")
}
