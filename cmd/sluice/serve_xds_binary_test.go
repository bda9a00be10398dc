package main

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3pb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/statsd_exporter/pkg/event"
	"github.com/prometheus/statsd_exporter/pkg/exporter"
	"github.com/prometheus/statsd_exporter/pkg/line"
	"github.com/prometheus/statsd_exporter/pkg/listener"
	"github.com/prometheus/statsd_exporter/pkg/mapper"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// egNode is the node id Envoy Gateway keeps the limits under.
const egNode = "envoy-ratelimit"

// egLimits is a RateLimitConfig as Envoy Gateway writes one for a
// BackendTrafficPolicy with a global limit of perHour requests per client
// address on route rule 0 of an HTTPRoute: a level without a rate limit,
// then the rule. (An hour, not a minute: the test's counts must not meet a
// window's end.)
func egLimits(perHour uint32) *ratelimitpb.RateLimitConfig {
	const name = "default/eg/http"
	return &ratelimitpb.RateLimitConfig{Name: name, Domain: name, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "httproute/default/backend/rule/0/match/0/example", Value: "httproute/default/backend/rule/0/match/0/example",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{{
			Key:       "rule-0-match-0",
			RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: perHour},
		}},
	}}}
}

// egRequest is what Envoy asks for egLimits: the route's entry, then the
// client's address.
func egRequest(client string) *rlspb.RateLimitRequest {
	const route = "httproute/default/backend/rule/0/match/0/example"
	return &rlspb.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3pb.RateLimitDescriptor{{
		Entries: []*ratelimitv3pb.RateLimitDescriptor_Entry{{Key: route, Value: route}, {Key: "rule-0-match-0", Value: client}},
	}}}
}

// egControlPlane writes the /certs of Envoy Gateway's Deployment under a
// new directory (tls.crt is both the gRPC server's certificate and the xDS
// client's) and starts an xDS server that requires that client
// certificate. It returns the directory, the server, and the TLS config
// with which Envoy reaches the rate-limit service.
func egControlPlane(t *testing.T) (dir string, xs *xdstest.Server, envoyTLS *tls.Config) {
	t.Helper()
	dir = t.TempDir()
	ca := testcert.NewCA(t)
	if err := os.MkdirAll(filepath.Join(dir, "certs"), 0o755); err != nil {
		t.Fatal(err)
	}
	ca.Peer(t).WriteFiles(t, filepath.Join(dir, "certs"), "tls")
	ca.WriteFile(t, filepath.Join(dir, "certs"))
	xs = xdstest.Start(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Peer(t).TLS(t)},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	return dir, xs, &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Peer(t).TLS(t)}, MinVersion: tls.VersionTLS12}
}

// egProc is one rate-limit pod of the test, and Envoy's connection to it.
type egProc struct {
	*sluiceProc
	name   string
	rls    rlspb.RateLimitServiceClient
	health healthpb.HealthClient
}

// TestBinary_EnvoyGateway is issue 19's "Done means", end to end. The real
// binary runs three times with the environment of Envoy Gateway's default
// Deployment as the issue gives it (with USE_STATSD=true STATSD_PORT=9125
// for its statsd-exporter sidecar; egDeployments' "statsd-sidecar"), its
// certificates written where the variables say: as `sluice serve`, as
// /bin/ratelimit with no arguments (the image's entry point), and as
// `sluice serve` with FORCE_START_WITHOUT_INITIAL_CONFIG=false (the
// reference's default). They take their limits from a go-control-plane
// xDS server on loopback that requires client certificates (mTLS both
// ways), share a Redis of their own, and send statsd to Envoy Gateway's
// statsd-exporter (statsdExporter). Only addresses (the xDS server's, the
// Redis's, statsd's host, port 0 for every listener) and two timings (a
// stats flush every 20 ms; a Redis timeout of 2 s, where Sluice's 10 ms
// default fails on a loaded test machine) are the test's own.
//
// Checked: before the first push, SERVING with no limits (forced) or
// NOT_SERVING (not); the pushed limits, shared through Redis; a live
// update; a bad push NACKed naming the resource and field, the old limits
// kept; /healthcheck as the probes read it; /rlconfig; and the Prometheus
// series the exporter makes of the statsd lines.
func TestBinary_EnvoyGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, an xDS server, a statsd exporter and three sluice processes")
	}
	dir, xs, clientTLS := egControlPlane(t)
	rdb := redistest.Start(t)
	exp := startStatsdExporter(t)

	var env []string
	for _, kv := range egDeployments(t)["statsd-sidecar"] {
		k, v := kv[0], kv[1]
		switch {
		case strings.HasPrefix(v, "/certs/"):
			v = dir + v
		case k == "CONFIG_GRPC_XDS_SERVER_URL":
			v = xs.Addr
		case k == "REDIS_URL":
			v = rdb.Addr
		case k == "STATSD_PORT":
			v = strconv.Itoa(exp.port)
		}
		env = append(env, k+"="+v)
	}
	env = append(env, "STATSD_HOST=127.0.0.1", "HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0",
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0", "STATS_FLUSH_INTERVAL=20ms", "REDIS_TIMEOUT="+storeTimeout)
	if !slices.Contains(env, "FORCE_START_WITHOUT_INITIAL_CONFIG=true") || !slices.Contains(env, "USE_STATSD=true") {
		t.Fatalf("not Envoy Gateway's default environment: %q", env)
	}

	bin, err := filepath.Abs(sluiceBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	ratelimit := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(bin, ratelimit); err != nil {
		t.Fatal(err)
	}
	start := func(name string, env []string, argv ...string) *egProc {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = env
		p := &egProc{sluiceProc: startCmd(t, cmd), name: name}
		p.rls, p.health = dialRLS(t, p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
		return p
	}
	serveP := start("sluice serve", env, bin, "serve")
	ratelimitP := start("/bin/ratelimit", env, ratelimit)
	waiting := start("sluice serve without FORCE_START_WITHOUT_INITIAL_CONFIG",
		append(slices.Clone(env), "FORCE_START_WITHOUT_INITIAL_CONFIG=false"), bin, "serve")
	procs := []*egProc{serveP, ratelimitP, waiting}

	ctx := testCtx(t)
	calls := 0 // ShouldRateLimit calls, for ratelimit_service_total_requests
	ask := func(p *egProc, client string) *rlspb.RateLimitResponse {
		t.Helper()
		calls++
		r, err := p.rls.ShouldRateLimit(ctx, egRequest(client))
		if err != nil {
			t.Fatalf("%s: ShouldRateLimit: %v", p.name, err)
		}
		return r
	}
	// The kubelet's probe: plain HTTP, as the reference serves its HTTP
	// port even with GRPC_SERVER_USE_TLS=true.
	healthcheck := func(p *egProc) int {
		t.Helper()
		res, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	health := func(p *egProc) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := p.health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("%s: gRPC health: %v", p.name, err)
		}
		return r.Status
	}
	rlconfig := func() string {
		t.Helper()
		m := regexp.MustCompile(`msg="debug endpoints" addr=(\S+)`).FindStringSubmatch(ratelimitP.log())
		if m == nil {
			t.Fatalf("no debug address in the log:\n%s", ratelimitP.log())
		}
		res, err := http.Get("http://" + m[1] + "/rlconfig")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("/rlconfig: %s", res.Status)
		}
		return string(body)
	}
	// replies waits for each pod's ACK of version, or its NACK (then
	// version is the one in force) naming the resource and field.
	const reason = `config: resource "default/eg/http": descriptors[0].descriptors[0]: unknown unit "42"`
	replies := func(version string, nack bool) {
		t.Helper()
		for n := 0; n < len(procs); {
			r := xs.Reply(t)
			if r.GetErrorDetail() != nil != nack {
				continue // a late reply to an earlier push
			}
			if nack && (r.GetVersionInfo() != version || !strings.HasPrefix(r.GetErrorDetail().GetMessage(), reason)) {
				t.Fatalf("NACK %v, want version %s (the one in force) and %q", r, version, reason)
			}
			if nack || r.GetVersionInfo() == version {
				n++
			}
		}
	}

	// Before the first push: with FORCE_START_WITHOUT_INITIAL_CONFIG,
	// healthy and no limits; without it, not serving.
	for _, p := range []*egProc{serveP, ratelimitP} {
		if st, code := health(p), healthcheck(p); st != healthpb.HealthCheckResponse_SERVING || code != 200 {
			t.Errorf("%s before the first push: %v, /healthcheck %d; want SERVING, 200", p.name, st, code)
		}
		if r := ask(p, "10.0.0.1"); r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
			t.Errorf("%s before the first push: %v, want OK without a limit", p.name, r)
		}
	}
	if st, code := health(waiting), healthcheck(waiting); st != healthpb.HealthCheckResponse_NOT_SERVING || code != 503 {
		t.Errorf("%s before the first push: %v, /healthcheck %d; want NOT_SERVING, 503", waiting.name, st, code)
	}
	if got := rlconfig(); got != "" {
		t.Errorf("/rlconfig before the first push: %q, want no rule", got)
	}

	// The first push reaches all three (their ACKs), and the limit holds
	// across them: they share Redis.
	xs.Push(t, egNode, "1", egLimits(3))
	replies("1", false)
	waitServing(t, waiting.health)
	for i, c := range []struct {
		p    *egProc
		want rlspb.RateLimitResponse_Code
	}{{serveP, rlspb.RateLimitResponse_OK}, {ratelimitP, rlspb.RateLimitResponse_OK}, {waiting, rlspb.RateLimitResponse_OK}, {serveP, rlspb.RateLimitResponse_OVER_LIMIT}} {
		if r := ask(c.p, "10.0.0.1"); r.OverallCode != c.want || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 3 {
			t.Fatalf("request %d (%s): %v, want %v under the pushed limit of 3", i, c.p.name, r, c.want)
		}
	}
	const rule = "default/eg/http.httproute/default/backend/rule/0/match/0/example_httproute/default/backend/rule/0/match/0/example.rule-0-match-0: unit=HOUR requests_per_unit=3, shadow_mode: false, quota_mode: false\n"
	if got := rlconfig(); got != rule {
		t.Errorf("/rlconfig after the push:\n%q\nwant\n%q", got, rule)
	}
	if keys := strings.TrimSpace(rdb.CLI("DBSIZE")); keys == "0" {
		t.Error("no counter in Redis")
	}

	// A live update: the new limit applies at once, the count goes on
	// (3 hits allowed, the denied one not counted, and this one).
	xs.Push(t, egNode, "2", egLimits(10))
	replies("2", false)
	if r := ask(ratelimitP, "10.0.0.1"); r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 10 || r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("after the update: %v, want OK with 6 of 10 left", r)
	}

	// A bad push is NACKed with the resource and field; the limit stays.
	bad := egLimits(1)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unit = ratelimitpb.RateLimitUnit(42)
	xs.Push(t, egNode, "3", bad)
	replies("2", true)
	for _, p := range procs {
		// A pod's NACK repeated (the snapshot cache resends the config)
		// may have been counted for another's: wait for each one's.
		waitFor(t, func() bool { return strings.Contains(p.log(), "xds: config rejected (NACK)") }, p.name+"'s NACK")
		if r := ask(p, "10.0.0.2"); r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 10 {
			t.Errorf("%s after the bad push: %v, want the limit of 10 still", p.name, r)
		}
		if code := healthcheck(p); code != 200 {
			t.Errorf("%s: /healthcheck after the bad push: %d, want 200", p.name, code)
		}
		if log := p.log(); strings.Count(log, "xds: config applied (ACK)") != 2 {
			t.Errorf("%s: the log lacks the two ACKs:\n%s", p.name, log)
		}
	}

	// What Envoy Gateway's dashboards read, summed over the three pods:
	// 8 hits under a limit (4 under the first push, 1 after the update, 3
	// after the bad push), one of them denied; 2 pushes applied and 1
	// rejected by each pod.
	const domain, key1, key2 = "default/eg/http", "httproute/default/backend/rule/0/match/0/example_httproute/default/backend/rule/0/match/0/example", "rule-0-match-0"
	hits := map[string]string{"domain": domain, "key1": key1, "key2": key2}
	exp.wait(t, "ratelimit_service_rate_limit_total_hits", hits, 8)
	exp.wait(t, "ratelimit_service_rate_limit_within_limit", hits, 7)
	exp.wait(t, "ratelimit_service_rate_limit_over_limit", hits, 1)
	exp.wait(t, "ratelimit_service_total_requests", map[string]string{"grpc_method": "ShouldRateLimit"}, float64(calls))
	exp.wait(t, "ratelimit_service_response_time_seconds", map[string]string{"grpc_method": "ShouldRateLimit"}, float64(calls))
	exp.wait(t, "ratelimit_service_config_load_success", nil, 6)
	exp.wait(t, "ratelimit_service_config_load_error", nil, 3)
}

// statsdExporter is Envoy Gateway's prom/statsd-exporter sidecar in the
// test: statsd_exporter's own UDP packet and TCP line handling, line
// parser, mapper and exporter, with Envoy Gateway's mapping
// (observe/testdata), on loopback port 9125 (UDP and TCP, as
// statsd_exporter listens) as in the pod. Its series are on reg.
type statsdExporter struct {
	port int
	reg  *prometheus.Registry
}

// startStatsdExporter listens on 127.0.0.1:9125, Envoy Gateway's
// STATSD_PORT. When that port is taken (another test run on the machine
// has it), it listens on a free port and says so: the test then sets
// STATSD_PORT to that port, the one variable it changes.
func startStatsdExporter(t *testing.T) *statsdExporter {
	t.Helper()
	conn, tcp := listenStatsdPort(t, 9125)
	if port := conn.LocalAddr().(*net.UDPAddr).Port; port != 9125 {
		t.Logf("statsd: 127.0.0.1:9125 is taken; STATSD_PORT=%d instead", port)
	}
	mapping, err := os.ReadFile("../../observe/testdata/envoy-gateway-statsd.yaml")
	if err != nil {
		t.Fatal(err)
	}
	discard := slog.New(slog.DiscardHandler)
	e := &statsdExporter{port: conn.LocalAddr().(*net.UDPAddr).Port, reg: prometheus.NewRegistry()}
	m := &mapper.MetricMapper{Registerer: e.reg, Logger: discard}
	if err := m.InitFromYAMLString(string(mapping)); err != nil {
		t.Fatal(err)
	}
	// The exporter's own counters (statsd_exporter_*), not looked at here.
	counter := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "c", Help: "c"}) }
	vec := func() *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "v", Help: "v"}, []string{"l"})
	}
	ex := exporter.NewExporter(e.reg, m, discard, vec(), counter(), vec(), vec(), vec(),
		prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "g", Help: "g"}, []string{"l"}))
	events := make(chan event.Events)
	l := &listener.StatsDUDPListener{Conn: conn, EventHandler: &event.UnbufferedEventHandler{C: events}, Logger: discard,
		LineParser: line.NewParser(), UDPPackets: counter(), UDPPacketDrops: counter(), LinesReceived: counter(),
		EventsFlushed: counter(), SampleErrors: *vec(), SamplesReceived: counter(), TagErrors: counter(), TagsReceived: counter()}
	go func() {
		defer close(events)
		buf := make([]byte, 65535)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return // closed
			}
			l.HandlePacket(buf[:n])
		}
	}()
	tl := &listener.StatsDTCPListener{Conn: tcp, EventHandler: &event.UnbufferedEventHandler{C: events}, Logger: discard,
		LineParser: line.NewParser(), LinesReceived: counter(), EventsFlushed: counter(), SampleErrors: *vec(), SamplesReceived: counter(),
		TagErrors: counter(), TagsReceived: counter(), TCPConnections: counter(), TCPErrors: counter(), TCPLineTooLong: counter()}
	var handlers sync.WaitGroup
	go func() {
		for {
			c, err := tcp.AcceptTCP()
			if err != nil {
				return // closed
			}
			handlers.Go(func() { tl.HandleConn(c) })
		}
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		ex.Listen(events)
	}()
	// Registered before the sluice processes start, so run after they
	// are killed: their TCP connections have ended.
	t.Cleanup(func() {
		tcp.Close()
		handlers.Wait()
		conn.Close()
		<-done
	})
	return e
}

// listenStatsdPort listens on UDP and TCP on the same loopback port:
// port if both are free, else any port free on both.
func listenStatsdPort(t *testing.T, port int) (*net.UDPConn, *net.TCPListener) {
	t.Helper()
	lo := net.IPv4(127, 0, 0, 1)
	for range 20 {
		conn, err := net.ListenUDP("udp", &net.UDPAddr{IP: lo, Port: port})
		if err != nil {
			port = 0
			continue
		}
		tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: lo, Port: conn.LocalAddr().(*net.UDPAddr).Port})
		if err != nil {
			conn.Close()
			port = 0
			continue
		}
		return conn, tcp
	}
	t.Fatal("no loopback port free on both UDP and TCP")
	return nil, nil
}

// value is the series' value (a histogram's count), or false while the
// exporter has none.
func (e *statsdExporter) value(t *testing.T, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	fams, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	metrics:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue metrics
				}
			}
			if h := m.GetHistogram(); h != nil {
				return float64(h.GetSampleCount()), true
			}
			return m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// wait waits until the series has the value want, failing t if it goes
// past it or mustWithin passes; the failure lists the series there are.
func (e *statsdExporter) wait(t *testing.T, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(mustWithin)
	for {
		got, ok := e.value(t, name, labels)
		if ok && got == want {
			return
		}
		if got > want || time.Now().After(deadline) {
			var all strings.Builder
			fams, _ := e.reg.Gather()
			for _, f := range fams {
				for _, m := range f.GetMetric() {
					fmt.Fprintf(&all, "%s%v %v%v\n", f.GetName(), m.GetLabel(), m.GetCounter().GetValue(), m.GetHistogram().GetSampleCount())
				}
			}
			t.Fatalf("statsd-exporter: %s%v = %v (present: %v), want %v; the series:\n%s", name, labels, got, ok, want, all.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
