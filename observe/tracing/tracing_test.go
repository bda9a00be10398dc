package tracing_test

import (
	"context"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/observe/tracing"
	"github.com/sluicehq/sluice/observe/tracing/tracingtest"
	"github.com/sluicehq/sluice/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// fakeStore answers every hit allowed, or fails with err.
type fakeStore struct {
	err   error
	takes int
}

func (s *fakeStore) Take(_ context.Context, _ int64, hits []store.Hit, out []store.Decision) error {
	s.takes++
	if s.err != nil {
		return s.err
	}
	for i := range hits {
		out[i] = store.Decision{Allowed: true, Limit: 10}
	}
	return nil
}

func hits(costs ...uint64) []store.Hit {
	r, _ := store.NewFixedWindow(10, time.Minute)
	hs := make([]store.Hit, len(costs))
	for i, c := range costs {
		hs[i] = store.Hit{Key: "k", Rule: r, Cost: c}
	}
	return hs
}

// TestNew_Exports: over each protocol, to the endpoint of
// OTEL_EXPORTER_OTLP_ENDPOINT, a span and its store child reach a real
// OTLP receiver with the service's resource, once Shutdown has flushed.
func TestNew_Exports(t *testing.T) {
	for proto, start := range map[string]func(testing.TB) *tracingtest.Receiver{"grpc": tracingtest.StartGRPC, "HTTP": tracingtest.StartHTTP} {
		t.Run(proto, func(t *testing.T) {
			rcv := start(t)
			t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
			p, err := tracing.New(testCtx(t), tracing.Options{Protocol: proto, ServiceName: "rl", ServiceNamespace: "ns",
				ServiceInstanceID: "pod-1", SamplingRate: 1})
			if err != nil {
				t.Fatal(err)
			}
			ctx, span := p.Tracer.Start(testCtx(t), "call")
			st := tracing.Store(&fakeStore{}, p.Tracer, "redis")
			if err := st.Take(ctx, 0, hits(1, 3), make([]store.Decision, 2)); err != nil {
				t.Fatal(err)
			}
			span.End()
			if err := p.Shutdown(testCtx(t)); err != nil {
				t.Fatal(err)
			}
			call := rcv.Wait(t, "call", func(s tracingtest.Span) bool { return s.GetName() == "call" })
			take := rcv.Wait(t, "store.Take", func(s tracingtest.Span) bool { return s.GetName() == "store.Take" })
			if take.ParentSpanID() != call.SpanID() || take.TraceID() != call.TraceID() {
				t.Errorf("store.Take: trace %s parent %s, want %s %s", take.TraceID(), take.ParentSpanID(), call.TraceID(), call.SpanID())
			}
			for k, want := range map[string]string{"ratelimit.store": "redis", "ratelimit.store.batch_size": "2", "ratelimit.store.hits": "4"} {
				if got, _ := take.Attr(k); got != want {
					t.Errorf("store.Take %s = %q, want %q", k, got, want)
				}
			}
			for k, want := range map[string]string{"service.name": "rl", "service.namespace": "ns", "service.instance.id": "pod-1"} {
				if got := call.Resource[k]; got != want {
					t.Errorf("resource %s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestNew_SamplingRateZero: at rate 0 a trace that starts here is not
// exported; one whose sampled parent came from the caller is.
func TestNew_SamplingRateZero(t *testing.T) {
	rcv := tracingtest.StartHTTP(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	p, err := tracing.New(testCtx(t), tracing.Options{SamplingRate: 0})
	if err != nil {
		t.Fatal(err)
	}
	_, root := p.Tracer.Start(testCtx(t), "root")
	root.End()
	parent := tracing.Propagator().Extract(testCtx(t), propagation.HeaderCarrier(http.Header{
		"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}))
	_, child := p.Tracer.Start(parent, "child")
	child.End()
	if err := p.Shutdown(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	rcv.Wait(t, "child", func(s tracingtest.Span) bool { return s.GetName() == "child" })
	for _, s := range rcv.Spans() {
		if s.GetName() == "root" {
			t.Error("rate 0 exported a root span")
		}
	}
}

// TestNew_Resource: without names, service.name is OTEL_SERVICE_NAME's,
// else sluice, and service.instance.id a random UUID.
func TestNew_Resource(t *testing.T) {
	uuid := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)
	for env, want := range map[string]string{"": "sluice", "from-env": "from-env"} {
		t.Setenv("OTEL_SERVICE_NAME", env)
		p, err := tracing.New(testCtx(t), tracing.Options{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, kv := range p.Resource.Attributes() {
			got[string(kv.Key)] = kv.Value.String()
		}
		if got["service.name"] != want || !uuid.MatchString(got["service.instance.id"]) {
			t.Errorf("OTEL_SERVICE_NAME=%q: resource %v, want service.name %s and a UUID", env, got, want)
		}
		if err := p.Shutdown(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tracing.New(testCtx(t), tracing.Options{Protocol: "zipkin"}); err == nil {
		t.Error("protocol zipkin accepted")
	}
}

// TestStore_OutsideASpan: without a recording span Take goes straight to
// the store; a store's error marks the span.
func TestStore_OutsideASpan(t *testing.T) {
	rcv := tracingtest.StartGRPC(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
	p, err := tracing.New(testCtx(t), tracing.Options{Protocol: "grpc", SamplingRate: 1})
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeStore{}
	st := tracing.Store(fake, p.Tracer, "memory")
	out := make([]store.Decision, 1)
	if err := st.Take(testCtx(t), 0, hits(1), out); err != nil || !out[0].Allowed || fake.takes != 1 {
		t.Fatalf("Take: %v %+v after %d takes", err, out[0], fake.takes)
	}
	fake.err = errors.New("redis: i/o timeout")
	ctx, span := p.Tracer.Start(testCtx(t), "call")
	if err := st.Take(ctx, 0, hits(1), out); !errors.Is(err, fake.err) {
		t.Fatalf("Take: %v, want the store's error", err)
	}
	span.End()
	if err := p.Shutdown(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	take := rcv.Wait(t, "store.Take", func(s tracingtest.Span) bool { return s.GetName() == "store.Take" })
	if take.GetStatus().GetMessage() != "redis: i/o timeout" || len(take.GetEvents()) != 1 {
		t.Errorf("store.Take status %v events %v, want the error", take.GetStatus(), take.GetEvents())
	}
	if n := len(rcv.Spans()); n != 2 {
		t.Errorf("%d spans exported, want call and one store.Take (none for the Take outside a span)", n)
	}
}

// TestPropagator reads W3C traceparent and both B3 encodings.
func TestPropagator(t *testing.T) {
	const traceID, spanID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for name, h := range map[string]http.Header{
		"traceparent": {"Traceparent": {"00-" + traceID + "-" + spanID + "-01"}},
		"b3":          {"B3": {traceID + "-" + spanID + "-1"}},
		"x-b3":        {"X-B3-Traceid": {traceID}, "X-B3-Spanid": {spanID}, "X-B3-Sampled": {"1"}},
	} {
		sc := trace.SpanContextFromContext(tracing.Propagator().Extract(context.Background(), propagation.HeaderCarrier(h)))
		if sc.TraceID().String() != traceID || sc.SpanID().String() != spanID || !sc.IsSampled() || !sc.IsRemote() {
			t.Errorf("%s: %v, want trace %s span %s, sampled, remote", name, sc, traceID, spanID)
		}
	}
}

// resettingStore is a fakeStore that can reset counters.
type resettingStore struct {
	fakeStore
	resets int
}

func (s *resettingStore) Reset(context.Context, int64, []store.Hit) error {
	s.resets++
	return nil
}

// TestStore_KeepsResetter: the wrapper of a store that resets counters
// resets them too (the counters endpoint with --tracing on), and the
// wrapper of one that cannot does not claim to.
func TestStore_KeepsResetter(t *testing.T) {
	tracer := noop.NewTracerProvider().Tracer("test")
	rs := &resettingStore{}
	st, ok := tracing.Store(rs, tracer, "memory").(store.Resetter)
	if !ok {
		t.Fatal("the wrapper of a store.Resetter is no store.Resetter")
	}
	if err := st.Reset(testCtx(t), 0, hits(1)); err != nil || rs.resets != 1 {
		t.Errorf("Reset: %v after %d resets of the store underneath, want 1", err, rs.resets)
	}
	if _, ok := tracing.Store(&fakeStore{}, tracer, "memory").(store.Resetter); ok {
		t.Error("the wrapper of a store that cannot reset claims to")
	}
}

// TestNew_ParentSampledCap: with ParentSampledPerSecond, a caller's
// sampled flag records at most that many spans a second (on a fake
// clock: 3 of 10 at one instant, 3 more a second later), and without it
// every one, as the reference; a string attribute longer than
// MaxAttributeBytes is exported cut to it.
func TestNew_ParentSampledCap(t *testing.T) {
	for _, perSecond := range []float64{0, 3} {
		rcv := tracingtest.StartHTTP(t)
		t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.URL)
		now := time.Unix(1_800_000_000, 0)
		p, err := tracing.New(testCtx(t), tracing.Options{SamplingRate: 0, ParentSampledPerSecond: perSecond,
			Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		parent := tracing.Propagator().Extract(testCtx(t), propagation.HeaderCarrier(http.Header{
			"Traceparent": {"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}))
		for range 2 {
			for range 10 {
				_, span := p.Tracer.Start(parent, "child")
				span.SetAttributes(attribute.String("long", strings.Repeat("x", 5000)))
				span.End()
			}
			now = now.Add(time.Second)
		}
		if err := p.Shutdown(testCtx(t)); err != nil {
			t.Fatal(err)
		}
		want := 20
		if perSecond > 0 {
			want = 6
		}
		spans := rcv.Spans()
		if len(spans) != want {
			t.Errorf("cap %v/s: %d spans of 20 recorded, want %d", perSecond, len(spans), want)
		}
		for _, s := range spans {
			if v, _ := s.Attr("long"); len(v) != tracing.MaxAttributeBytes {
				t.Errorf("an attribute of 5000 bytes exported as %d, want %d", len(v), tracing.MaxAttributeBytes)
				break
			}
		}
	}
}
