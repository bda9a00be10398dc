package server_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"net/http/httptest"

	"github.com/sluicehq/sluice/config"
	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe/tracing"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
)

const traceLimits = `
domain: traced
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// The caller's trace context, as Envoy sends it.
const (
	callerTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan   = "00f067aa0ba902b7"
	traceparent  = "00-" + callerTrace + "-" + callerSpan + "-01"
	unsampledTP  = "00-" + callerTrace + "-" + callerSpan + "-00"
	secretValue  = "10.1.2.3" // an ip: its rule has no detailed_metric
	detailedUser = "alice"
)

type traceEnv struct {
	spans *tracetest.InMemoryExporter
	rls   rlspb.RateLimitServiceClient
	api   sluicev1.RateLimiterClient
	rlqs  rlqspb.RateLimitQuotaServiceClient
	http  *httptest.Server
}

// newTraceEnv serves traceLimits over gRPC (with interceptors when
// given: the message path) and HTTP, traced with sampler into an
// in-memory exporter, the store wrapped by tracing.Store.
func newTraceEnv(t *testing.T, sampler sdktrace.Sampler, interceptors ...grpc.UnaryServerInterceptor) *traceEnv {
	t.Helper()
	p := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte(traceLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	table, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSyncer(spans))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	tracer := tp.Tracer(tracing.Name)
	tr := server.Tracing{Tracer: tracer, Propagator: tracing.Propagator()}
	lim := limiter.New(tables{table}, tracing.Store(memory.New(memory.Options{}), tracer, "memory"), limiter.Options{})
	health := server.NewHealth()
	health.SetServing(true)
	opts := server.Options{Tracing: tr}
	cc := serveLoopback(t, server.NewGRPC(lim, health, server.GRPCOptions{Options: opts, Interceptors: interceptors,
		Quota: quota.New(tables{loadTable(t)}, quota.Options{})}))
	hs := httptest.NewServer(server.NewHTTP(lim, health, opts))
	t.Cleanup(hs.Close)
	return &traceEnv{spans: spans, rls: rlspb.NewRateLimitServiceClient(cc), api: sluicev1.NewRateLimiterClient(cc),
		rlqs: rlqspb.NewRateLimitQuotaServiceClient(cc), http: hs}
}

// only returns the one span named name, failing t unless there is
// exactly one.
func (e *traceEnv) only(t *testing.T, name string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range e.spans.GetSpans() {
		if s.Name == name {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans %q, want 1 (all: %v)", len(found), name, spanNames(e.spans.GetSpans()))
	}
	return found[0]
}

func spanNames(ss tracetest.SpanStubs) []string {
	var n []string
	for _, s := range ss {
		n = append(n, s.Name)
	}
	return n
}

func attrs(s tracetest.SpanStub) map[attribute.Key]string {
	m := map[attribute.Key]string{}
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value.String()
	}
	return m
}

// checkChild checks that s is a server span child of the caller's span
// (same trace).
func checkChild(t *testing.T, s tracetest.SpanStub) {
	t.Helper()
	if got := s.SpanContext.TraceID().String(); got != callerTrace {
		t.Errorf("%s: trace %s, want the caller's %s", s.Name, got, callerTrace)
	}
	if got := s.Parent.SpanID().String(); got != callerSpan || !s.Parent.IsRemote() {
		t.Errorf("%s: parent %s (remote %v), want the caller's %s", s.Name, got, s.Parent.IsRemote(), callerSpan)
	}
	if s.SpanKind != trace.SpanKindServer {
		t.Errorf("%s: kind %v, want server", s.Name, s.SpanKind)
	}
}

// noSecret checks that no attribute of any span holds secretValue.
func (e *traceEnv) noSecret(t *testing.T) {
	t.Helper()
	for _, s := range e.spans.GetSpans() {
		for k, v := range attrs(s) {
			if strings.Contains(v, secretValue) {
				t.Errorf("%s: attribute %s = %q holds a descriptor value of a rule without detailed_metric", s.Name, k, v)
			}
		}
	}
}

func tracedRequest() *rlspb.RateLimitRequest {
	r := req(0, d("user", detailedUser), d("ip", secretValue), d("other", "x"))
	r.Domain = "traced"
	return r
}

// TestTracing_ShouldRateLimit: a ShouldRateLimit call is one server span,
// child of the traceparent of its metadata, with the domain, the number
// of descriptors, the overall code and the rules that applied; the
// descriptor values only of the rule with detailed_metric; and the store
// call is its child. On the fast path (no interceptors) and the message
// path alike.
func TestTracing_ShouldRateLimit(t *testing.T) {
	passthrough := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	for name, ics := range map[string][]grpc.UnaryServerInterceptor{"direct": nil, "interceptor": {passthrough}} {
		t.Run(name, func(t *testing.T) {
			e := newTraceEnv(t, sdktrace.ParentBased(sdktrace.AlwaysSample()), ics...)
			c := metadata.AppendToOutgoingContext(ctx(t), "traceparent", traceparent)
			for range 2 {
				if _, err := e.rls.ShouldRateLimit(c, tracedRequest()); err != nil {
					t.Fatal(err)
				}
			}
			spans := e.spans.GetSpans()
			if len(spans) != 4 {
				t.Fatalf("spans %v, want ShouldRateLimit and store.Take twice", spanNames(spans))
			}
			call, store := spans[3], spans[2] // the second call: a child ends first
			if call.Name != "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit" || store.Name != "store.Take" {
				t.Fatalf("spans %v", spanNames(spans))
			}
			checkChild(t, call)
			want := map[attribute.Key]string{"ratelimit.domain": "traced", "ratelimit.descriptors": "3",
				"ratelimit.overall_code": "OVER_LIMIT", "ratelimit.rules": `["per_user","ip"]`, "ratelimit.descriptor_values": `["user=alice"]`}
			if got := attrs(call); !mapsEqual(got, want) {
				t.Errorf("attributes %v, want %v", got, want)
			}
			if store.Parent.SpanID() != call.SpanContext.SpanID() || store.SpanContext.TraceID() != call.SpanContext.TraceID() {
				t.Errorf("store.Take's parent %s, want the call's %s", store.Parent.SpanID(), call.SpanContext.SpanID())
			}
			want = map[attribute.Key]string{"ratelimit.store": "memory", "ratelimit.store.batch_size": "2", "ratelimit.store.hits": "2"}
			if got := attrs(store); !mapsEqual(got, want) {
				t.Errorf("store.Take attributes %v, want %v", got, want)
			}
			e.noSecret(t)
		})
	}
}

func mapsEqual(a, b map[attribute.Key]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestTracing_B3: Envoy configured for Zipkin sends B3, in one header or
// several; the span joins that trace.
func TestTracing_B3(t *testing.T) {
	for name, md := range map[string][]string{
		"single":   {"b3", callerTrace + "-" + callerSpan + "-1"},
		"multiple": {"x-b3-traceid", callerTrace, "x-b3-spanid", callerSpan, "x-b3-sampled", "1"},
	} {
		t.Run(name, func(t *testing.T) {
			e := newTraceEnv(t, sdktrace.ParentBased(sdktrace.NeverSample()))
			if _, err := e.rls.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx(t), md...), tracedRequest()); err != nil {
				t.Fatal(err)
			}
			checkChild(t, e.only(t, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"))
		})
	}
}

// TestTracing_Sampling: with a ratio of 0, a call without a trace context
// or with an unsampled one records nothing; a sampled parent is followed.
func TestTracing_Sampling(t *testing.T) {
	e := newTraceEnv(t, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0)))
	for _, c := range []context.Context{ctx(t), metadata.AppendToOutgoingContext(ctx(t), "traceparent", unsampledTP)} {
		if _, err := e.rls.ShouldRateLimit(c, tracedRequest()); err != nil {
			t.Fatal(err)
		}
	}
	if spans := e.spans.GetSpans(); len(spans) != 0 {
		t.Fatalf("ratio 0: spans %v, want none", spanNames(spans))
	}
	if _, err := e.rls.ShouldRateLimit(metadata.AppendToOutgoingContext(ctx(t), "traceparent", traceparent), tracedRequest()); err != nil {
		t.Fatal(err)
	}
	checkChild(t, e.only(t, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"))
}

// TestTracing_Failed: a refused request's span carries the error.
func TestTracing_Failed(t *testing.T) {
	e := newTraceEnv(t, sdktrace.AlwaysSample())
	if _, err := e.rls.ShouldRateLimit(ctx(t), &rlspb.RateLimitRequest{Domain: "traced"}); err == nil {
		t.Fatal("a request without descriptors was answered")
	}
	s := e.only(t, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	if s.Status.Code != otelcodes.Error || !strings.Contains(s.Status.Description, "descriptor") {
		t.Errorf("status %+v, want an error about descriptors", s.Status)
	}
}

// TestTracing_APIAndHTTP: our API's Check and the HTTP checks are spans,
// children of the traceparent sent in the metadata or the headers.
func TestTracing_APIAndHTTP(t *testing.T) {
	e := newTraceEnv(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	c := metadata.AppendToOutgoingContext(ctx(t), "traceparent", traceparent)
	if _, err := e.api.Check(c, &sluicev1.CheckRequest{Domain: "traced", Key: "user", Value: detailedUser}); err != nil {
		t.Fatal(err)
	}
	s := e.only(t, "sluice.v1.RateLimiter/Check")
	checkChild(t, s)
	if a := attrs(s); a["ratelimit.descriptor_values"] != `["user=alice"]` || a["ratelimit.overall_code"] != "OK" {
		t.Errorf("Check's attributes %v", a)
	}
	for _, r := range []struct{ method, path, body, span string }{
		{"POST", "/json", `{"domain":"traced","descriptors":[{"entries":[{"key":"ip","value":"` + secretValue + `"}]}]}`, "POST /json"},
		{"POST", "/v1/check", `{"domain":"traced","key":"ip","value":"` + secretValue + `"}`, "POST /v1/check"},
		{"GET", "/v1/check?domain=traced&key=ip&value=" + secretValue, "", "GET /v1/check"},
	} {
		hr, err := http.NewRequest(r.method, e.http.URL+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		hr.Header.Set("Content-Type", "application/json")
		hr.Header.Set("Traceparent", traceparent)
		res, err := http.DefaultClient.Do(hr)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		s := e.only(t, r.span)
		checkChild(t, s)
		if a := attrs(s); a["ratelimit.rules"] != `["ip"]` || a["ratelimit.domain"] != "traced" {
			t.Errorf("%s: attributes %v", r.span, a)
		}
	}
	e.noSecret(t)
}

// TestTracing_RLQSReport: each usage report on an RLQS stream is a span,
// child of the trace context of the stream's metadata.
func TestTracing_RLQSReport(t *testing.T) {
	e := newTraceEnv(t, sdktrace.ParentBased(sdktrace.NeverSample()))
	c, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx(t), "traceparent", traceparent))
	defer cancel()
	s, err := e.rlqs.StreamRateLimitQuotas(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(reports("e2e", usage(1, 0, "remote_address", "10.0.0.1"), usage(2, 0, "remote_address", "10.0.0.2"))); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := s.Recv(); err != nil {
			break // the stream ended, the report handled
		}
	}
	sp := e.only(t, "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas report")
	checkChild(t, sp)
	if a := attrs(sp); a["ratelimit.domain"] != "e2e" || a["ratelimit.buckets"] != "2" {
		t.Errorf("attributes %v, want domain e2e and 2 buckets", a)
	}
}
