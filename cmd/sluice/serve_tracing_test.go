package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/observe/tracing/tracingtest"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// The trace context a client (Envoy) sends in the tests: its trace and
// the span of its call to Sluice, sampled.
const (
	clientTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpan  = "00f067aa0ba902b7"
	shouldSpan  = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
)

// traceHeaders are the ways a client sends that context: W3C and B3's
// two encodings.
var traceHeaders = map[string][]string{
	"traceparent": {"traceparent", "00-" + clientTrace + "-" + clientSpan + "-01"},
	"b3":          {"b3", clientTrace + "-" + clientSpan + "-1"},
	"x-b3":        {"x-b3-traceid", clientTrace, "x-b3-spanid", clientSpan, "x-b3-sampled", "1"},
}

// clientChild waits for the ShouldRateLimit span that is a child of the
// client's span, then for its store call.
func clientChild(t *testing.T, rcv *tracingtest.Receiver) (call, store tracingtest.Span) {
	t.Helper()
	call = rcv.Wait(t, "ShouldRateLimit in the client's trace", func(s tracingtest.Span) bool {
		return s.GetName() == shouldSpan && s.TraceID() == clientTrace
	})
	if call.ParentSpanID() != clientSpan {
		t.Errorf("ShouldRateLimit's parent %s, want the client's span %s", call.ParentSpanID(), clientSpan)
	}
	store = rcv.Wait(t, "store.Take under ShouldRateLimit", func(s tracingtest.Span) bool {
		return s.GetName() == "store.Take" && s.ParentSpanID() == call.SpanID()
	})
	return call, store
}

// TestBinary_EnvoyGatewayTracing is issue 24's "Done means" for tracing:
// the binary, with the environment of Envoy Gateway's enable-tracing and
// enable-tracing-custom Deployments (TRACING_ENABLED=true, service name,
// namespace and instance id, sampling 1.0 or 0.6, OTLP/HTTP as Envoy
// Gateway sets no protocol), its certificates, limits over xDS with mTLS
// and a Redis, exports to an OTLP receiver on loopback the span of a
// ShouldRateLimit call as a child of the span the client sent (W3C
// traceparent, B3 single or multiple headers), with the Redis call as
// the span's child. Over gRPC too (TRACING_EXPORTER_PROTOCOL=grpc). Only
// addresses and OTEL_BSP_SCHEDULE_DELAY (spans sent within 20 ms, not 5 s)
// are the test's own.
func TestBinary_EnvoyGatewayTracing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, an xDS server and sluice processes")
	}
	dir, xs, clientTLS := egControlPlane(t)
	rdb := redistest.Start(t)
	xs.Push(t, egNode, "1", egLimits(100))
	deps := egDeployments(t)
	for _, c := range []struct{ deployment, protocol, header string }{
		{"enable-tracing", "", "traceparent"},
		{"enable-tracing-custom", "", "b3"},
		{"enable-tracing", "grpc", "x-b3"},
	} {
		t.Run(c.deployment+"/"+c.protocol+"/"+c.header, func(t *testing.T) {
			rcv := tracingtest.StartHTTP(t)
			if c.protocol == "grpc" {
				rcv = tracingtest.StartGRPC(t)
			}
			env := []string{"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "REDIS_TIMEOUT=" + storeTimeout,
				"OTEL_BSP_SCHEDULE_DELAY=20"}
			if c.protocol != "" {
				env = append(env, "TRACING_EXPORTER_PROTOCOL="+c.protocol)
			}
			sawTracing := false
			for _, kv := range deps[c.deployment] {
				k, v := kv[0], kv[1]
				switch {
				case strings.HasPrefix(v, "/certs/"):
					v = dir + v
				case k == "CONFIG_GRPC_XDS_SERVER_URL":
					v = xs.Addr
				case k == "REDIS_URL":
					v = rdb.Addr
				case k == "PROMETHEUS_ADDR":
					v = "127.0.0.1:0"
				case k == "OTEL_EXPORTER_OTLP_ENDPOINT":
					v = rcv.URL
				case k == "TRACING_ENABLED":
					sawTracing = v == "true"
				}
				env = append(env, k+"="+v)
			}
			if !sawTracing {
				t.Fatalf("%s: not a tracing deployment: %q", c.deployment, env)
			}
			cmd := exec.Command(sluiceBinary(t), "serve")
			cmd.Env = env
			p := startCmd(t, cmd)
			waitFor(t, func() bool { return strings.Contains(p.log(), "xds: config applied (ACK)") }, "the xDS push")
			rls, _ := dialRLS(t, p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS.Clone())))
			ctx := metadata.AppendToOutgoingContext(testCtx(t), traceHeaders[c.header]...)
			r, err := rls.ShouldRateLimit(ctx, egRequest("10.0.0.1"))
			if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 100 {
				t.Fatalf("ShouldRateLimit: %v %v, want OK under the pushed limit", r, err)
			}
			call, store := clientChild(t, rcv)
			for k, want := range map[string]string{"ratelimit.domain": "default/eg/http", "ratelimit.descriptors": "1",
				"ratelimit.overall_code": "OK", "ratelimit.rules": "httproute/default/backend/rule/0/match/0/example_httproute/default/backend/rule/0/match/0/example.rule-0-match-0"} {
				if got, _ := call.Attr(k); got != want {
					t.Errorf("ShouldRateLimit's %s = %q, want %q", k, got, want)
				}
			}
			if _, ok := call.Attr("ratelimit.descriptor_values"); ok {
				t.Error("descriptor values exported for a rule without detailed_metric")
			}
			if got, _ := store.Attr("ratelimit.store"); got != "redis" {
				t.Errorf("store.Take's store %q, want redis", got)
			}
			for k, want := range map[string]string{"service.name": "envoy-ratelimit", "service.namespace": "envoy-gateway-system",
				"service.instance.id": "envoy-ratelimit-5d8c9b7f4-x2x9k"} {
				if got := call.Resource[k]; got != want {
					t.Errorf("resource %s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestBinary_TracingEnv starts the binary with each TRACING_* and OTEL_*
// variable of refTable (a file config, a ShouldRateLimit call with a
// traceparent) and checks what each does to the span the receiver gets.
func TestBinary_TracingEnv(t *testing.T) {
	if testing.Short() {
		t.Skip("starts sluice processes")
	}
	for _, c := range []struct {
		name string
		// env is added to TRACING_ENABLED=true and OTEL_EXPORTER_OTLP_ENDPOINT
		// (the receiver's); {{url}} is the receiver's URL, {{addr}} its
		// address.
		env   []string
		grpc  bool // a gRPC receiver
		check func(t *testing.T, rcv *tracingtest.Receiver, call tracingtest.Span)
	}{
		{name: "TRACING_ENABLED", check: func(t *testing.T, _ *tracingtest.Receiver, call tracingtest.Span) {
			if got := call.Resource["service.name"]; got != "RateLimit" {
				t.Errorf("service.name %q, want the reference's default RateLimit", got)
			}
		}},
		{name: "OTEL_EXPORTER_OTLP_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT={{url}}"}},
		{name: "TRACING_SERVICE_NAME", env: []string{"TRACING_SERVICE_NAME=rl"}, check: resourceIs("service.name", "rl")},
		{name: "TRACING_SERVICE_NAMESPACE", env: []string{"TRACING_SERVICE_NAMESPACE=edge"}, check: resourceIs("service.namespace", "edge")},
		{name: "TRACING_SERVICE_INSTANCE_ID", env: []string{"TRACING_SERVICE_INSTANCE_ID=pod-7"}, check: resourceIs("service.instance.id", "pod-7")},
		{name: "TRACING_EXPORTER_PROTOCOL", env: []string{"TRACING_EXPORTER_PROTOCOL=gRPC"}, grpc: true},
		{name: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", env: []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:9", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT={{url}}/v1/traces"}},
		{name: "OTEL_EXPORTER_OTLP_HEADERS", env: []string{"OTEL_EXPORTER_OTLP_HEADERS=x-tenant=acme"}, check: func(t *testing.T, rcv *tracingtest.Receiver, _ tracingtest.Span) {
			if got := rcv.Header("x-tenant"); got != "acme" {
				t.Errorf("x-tenant %q, want acme", got)
			}
		}},
		{name: "OTEL_EXPORTER_OTLP_INSECURE", grpc: true, env: []string{"TRACING_EXPORTER_PROTOCOL=grpc", "OTEL_EXPORTER_OTLP_ENDPOINT=https://{{addr}}", "OTEL_EXPORTER_OTLP_INSECURE=true"}},
		{name: "TRACING_SAMPLING_RATE", env: []string{"TRACING_SAMPLING_RATE=0"}, check: func(t *testing.T, rcv *tracingtest.Receiver, _ tracingtest.Span) {
			// The call without a trace context went first: at rate 0 no
			// span of a trace started by Sluice is exported before the
			// client's.
			for _, s := range rcv.Spans() {
				if s.TraceID() != clientTrace {
					t.Errorf("span %s of trace %s exported at TRACING_SAMPLING_RATE=0", s.GetName(), s.TraceID())
				}
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			rcv := tracingtest.StartHTTP(t)
			if c.grpc {
				rcv = tracingtest.StartGRPC(t)
			}
			env := append(os.Environ(), "SLUICE_LOG_FORMAT=text", "TRACING_ENABLED=true", "OTEL_EXPORTER_OTLP_ENDPOINT="+rcv.URL, "OTEL_BSP_SCHEDULE_DELAY=20")
			for _, kv := range c.env {
				env = append(env, strings.NewReplacer("{{url}}", rcv.URL, "{{addr}}", rcv.Addr).Replace(kv))
			}
			cmd := exec.Command(sluiceBinary(t), "serve", "--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
			cmd.Env = env
			p := startCmd(t, cmd)
			rls, _ := dialRLS(t, p.grpcAddr)
			for _, ctx := range []context.Context{testCtx(t), metadata.AppendToOutgoingContext(testCtx(t), traceHeaders["traceparent"]...)} {
				if _, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", "10.0.0.9")); err != nil {
					t.Fatal(err)
				}
			}
			call, store := clientChild(t, rcv)
			if got, _ := store.Attr("ratelimit.store"); got != "memory" {
				t.Errorf("store.Take's store %q, want memory", got)
			}
			if c.check != nil {
				c.check(t, rcv, call)
			}
		})
	}
}

// resourceIs checks a resource attribute of the span.
func resourceIs(key, want string) func(*testing.T, *tracingtest.Receiver, tracingtest.Span) {
	return func(t *testing.T, _ *tracingtest.Receiver, call tracingtest.Span) {
		t.Helper()
		if got := call.Resource[key]; got != want {
			t.Errorf("resource %s = %q, want %q", key, got, want)
		}
	}
}

// TestServe_TracingSettings: bad tracing settings stop serve with the
// flag or variable at fault; the reference's TRACING_* without
// TRACING_ENABLED=true are warned about, and its sampling rate outside 0
// to 1 is taken as the reference takes it.
func TestServe_TracingSettings(t *testing.T) {
	base := []string{"--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		env  serveEnv
		want string
	}{
		{[]string{"--tracing", "--tracing-protocol", "zipkin"}, nil, "--tracing-protocol"},
		{[]string{"--tracing", "--tracing-sampling-rate", "1.5"}, nil, "--tracing-sampling-rate"},
		{[]string{"--tracing", "--tracing-sampling-rate", "-0.1"}, nil, "--tracing-sampling-rate"},
		{[]string{"--tracing", "--tracing-parent-sampled-per-second", "-1"}, nil, "--tracing-parent-sampled-per-second"},
		{nil, serveEnv{"SLUICE_TRACING": "true", "SLUICE_TRACING_PARENT_SAMPLED_PER_SECOND": "NaN"}, "--tracing-parent-sampled-per-second"},
		{[]string{"--max-domain-bytes", "0"}, nil, "--max-domain-bytes"},
		{nil, serveEnv{"TRACING_ENABLED": "yes"}, "TRACING_ENABLED"},
		{nil, serveEnv{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": "half"}, "TRACING_SAMPLING_RATE"},
		{nil, serveEnv{"TRACING_ENABLED": "true", "TRACING_EXPORTER_PROTOCOL": "thrift"}, "--tracing-protocol"},
	} {
		err := serve(testCtx(t), append(slices.Clone(base), c.args...), c.env.get, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q %v: %v, want an error naming %s", c.args, c.env, err, c.want)
		}
	}
	fs, warnings, err := parseServe(t, nil, serveEnv{"TRACING_SERVICE_NAME": "rl"})
	if err != nil || !slices.Contains(warnings, "TRACING_SERVICE_NAME is ignored without TRACING_ENABLED=true") || fs.Lookup("tracing-service-name").Value.String() != "" {
		t.Errorf("TRACING_SERVICE_NAME alone: warnings %q, err %v, want it ignored with a warning", warnings, err)
	}
	for v, want := range map[string]string{"1.0": "1", "0.6": "0.6", "7": "1", "-2": "0"} {
		fs, _, err := parseServe(t, nil, serveEnv{"TRACING_ENABLED": "true", "TRACING_SAMPLING_RATE": v})
		if got := fs.Lookup("tracing-sampling-rate").Value.String(); err != nil || got != want || fs.Lookup("tracing").Value.String() != "true" {
			t.Errorf("TRACING_SAMPLING_RATE=%s: --tracing-sampling-rate %s (%v), want %s", v, got, err, want)
		}
	}
}

// TestServe_TracingCollectorDown: when the collector cannot be reached,
// calls are answered as ever and the failed export is one warning in
// serve's log.
func TestServe_TracingCollectorDown(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9") // the discard port: nothing listens
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "100")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
	logs := &logbuf.Buffer{}
	grpcAddr, _ := startServeLogged(t, serveEnv{}, logs, "--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--tracing")
	rls, _ := dialRLS(t, grpcAddr)
	ctx := metadata.AppendToOutgoingContext(testCtx(t), traceHeaders["traceparent"]...)
	if r, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", "10.0.0.8")); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit with the collector down: %v %v", r, err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "level=WARN msg=tracing err=") }, "a warning about the failed export")
}

// TestServe_TracingSpanOfTheDrain: the span of a request that is in
// flight when serve is told to stop (SIGTERM ends its context) and is
// answered during the drain reaches the collector: tracing shuts down
// after the drain, not when the context ends. Spans are sent only at
// shutdown here (OTEL_BSP_SCHEDULE_DELAY of an hour).
func TestServe_TracingSpanOfTheDrain(t *testing.T) {
	rcv := tracingtest.StartHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "3600000")
	logs := &logbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serve(ctx, []string{"--config", "testdata/serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--tracing"},
			serveEnv{}.get, logs, func(_, h net.Addr) { ready <- h.String() })
	}()
	var httpAddr string
	select {
	case httpAddr = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v\n%s", err, logs)
	}
	// A check whose handler waits for its body: the server has read the
	// headers when it asks for the body (100 Continue).
	conn, err := net.Dial("tcp", httpAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"domain":"e2e","key":"path","value":"/login"}`
	fmt.Fprintf(conn, "POST /v1/check HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"+
		"Expect: 100-continue\r\ntraceparent: 00-%s-%s-01\r\n\r\n", len(body), clientTrace, clientSpan)
	br := bufio.NewReader(conn)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("want 100 Continue, got %q, %v", line, err)
	}
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	cancel()
	waitFor(t, func() bool { return strings.Contains(logs.String(), "msg=draining") }, "the drain")
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the check in flight: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("the check in flight: %s, want 200 OK", res.Status)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	// serve has returned: tracing has shut down, and sent what it had.
	if !slices.ContainsFunc(rcv.Spans(), func(s tracingtest.Span) bool {
		return s.GetName() == "POST /v1/check" && s.TraceID() == clientTrace
	}) {
		t.Errorf("the span of the check answered during the drain was not sent (%d spans received)\n%s", len(rcv.Spans()), logs)
	}
}
