package tracing

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Options configure New. The zero value exports over OTLP/HTTP, samples
// nothing (SamplingRate 0) and names the service "sluice" unless
// OTEL_SERVICE_NAME does.
type Options struct {
	// Protocol is "http" (OTLP/HTTP with protobuf, the default as in
	// envoyproxy/ratelimit) or "grpc", in any case.
	Protocol string
	// ServiceName, ServiceNamespace and ServiceInstanceID are the
	// resource's service.name, service.namespace and service.instance.id.
	// An empty name is OTEL_SERVICE_NAME's, else "sluice"; an empty
	// namespace is left out; an empty instance id is a random UUID, as
	// the reference makes one.
	ServiceName, ServiceNamespace, ServiceInstanceID string
	// SamplingRate is the fraction of traces sampled that do not come
	// with a sampling decision: a caller's sampled (or unsampled) parent
	// is followed, as in the reference. 1 or more samples all, 0 or less
	// none.
	SamplingRate float64
	// ParentSampledPerSecond caps the traces that a caller's sampled
	// parent (its traceparent's or B3's sampled flag) makes Sluice
	// record: at most this many a second, with a burst of as many (at
	// least 1); past it such a span is not recorded. 0 (or less) follows
	// every sampled parent, as the reference does.
	ParentSampledPerSecond float64
	// Now tells the time for ParentSampledPerSecond; nil means time.Now.
	Now func() time.Time
}

// MaxAttributeBytes bounds the value of each string attribute of a span,
// each string of a slice included (longer ones are cut), unless
// OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT or
// OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT asks for less: a caller's domain or
// descriptor values cannot make a span larger than the attribute count
// (128, OpenTelemetry's default) times this.
const MaxAttributeBytes = 1024

// spanLimits are OpenTelemetry's limits (from the environment, else its
// defaults), with attribute values bounded by MaxAttributeBytes.
func spanLimits() sdktrace.SpanLimits {
	l := sdktrace.NewSpanLimits()
	if l.AttributeValueLengthLimit < 0 || l.AttributeValueLengthLimit > MaxAttributeBytes {
		l.AttributeValueLengthLimit = MaxAttributeBytes
	}
	return l
}

// sampler samples the traces that start here at rate and follows a
// caller's parent, a sampled one within perSecond when that is above 0.
func sampler(rate, perSecond float64, now func() time.Time) sdktrace.Sampler {
	var opts []sdktrace.ParentBasedSamplerOption
	if perSecond > 0 {
		if now == nil {
			now = time.Now
		}
		opts = append(opts, sdktrace.WithRemoteParentSampled(&capped{perSecond: perSecond, tokens: max(perSecond, 1), now: now}))
	}
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(rate), opts...)
}

// capped samples at most perSecond spans a second (a token bucket of
// max(perSecond, 1) tokens), the rest not.
type capped struct {
	perSecond float64
	now       func() time.Time
	mu        sync.Mutex
	tokens    float64
	last      time.Time
}

func (c *capped) ShouldSample(p sdktrace.SamplingParameters) sdktrace.SamplingResult {
	res := sdktrace.SamplingResult{Decision: sdktrace.Drop, Tracestate: trace.SpanContextFromContext(p.ParentContext).TraceState()}
	now := c.now()
	c.mu.Lock()
	if !c.last.IsZero() && now.After(c.last) {
		c.tokens = min(c.tokens+now.Sub(c.last).Seconds()*c.perSecond, max(c.perSecond, 1))
	}
	if c.last.IsZero() || now.After(c.last) {
		c.last = now
	}
	if c.tokens >= 1 {
		c.tokens--
		res.Decision = sdktrace.RecordAndSample
	}
	c.mu.Unlock()
	return res
}

func (c *capped) Description() string {
	return fmt.Sprintf("ParentSampledCap{%g/s}", c.perSecond)
}

// Name is the instrumentation scope of Sluice's spans.
const Name = "github.com/sluicehq/sluice"

// Provider exports spans. Its Tracer starts them; Shutdown flushes them.
type Provider struct {
	tp *sdktrace.TracerProvider
	// Tracer starts Sluice's spans.
	Tracer trace.Tracer
	// Resource is what every exported span is attributed to.
	Resource *resource.Resource
}

// New returns a provider exporting over o.Protocol to the endpoint the
// OTEL_EXPORTER_OTLP_* variables name (OpenTelemetry's default,
// localhost:4318 or :4317, when none does). Nothing connects until the
// first batch is sent; spans are batched and sent in the background until
// Shutdown.
func New(ctx context.Context, o Options) (*Provider, error) {
	if math.IsNaN(o.SamplingRate) {
		return nil, errors.New("tracing: sampling rate is not a number")
	}
	if math.IsNaN(o.ParentSampledPerSecond) || math.IsInf(o.ParentSampledPerSecond, 0) {
		return nil, errors.New("tracing: the cap on parent-sampled traces is not a finite number")
	}
	var (
		exp sdktrace.SpanExporter
		err error
	)
	switch strings.ToLower(o.Protocol) {
	case "", "http":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		return nil, fmt.Errorf("tracing: protocol %q: want grpc or http", o.Protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	res, err := newResource(ctx, o)
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSampler(sampler(o.SamplingRate, o.ParentSampledPerSecond, o.Now)),
		sdktrace.WithRawSpanLimits(spanLimits()),
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
	)
	return &Provider{tp: tp, Tracer: tp.Tracer(Name), Resource: res}, nil
}

// newResource is the service's resource: OpenTelemetry's SDK attributes,
// then OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME, then o's, each
// overriding the ones before.
func newResource(ctx context.Context, o Options) (*resource.Resource, error) {
	id := o.ServiceInstanceID
	if id == "" {
		id = randomUUID()
	}
	own := []attribute.KeyValue{attribute.String("service.instance.id", id)}
	if o.ServiceName != "" {
		own = append(own, attribute.String("service.name", o.ServiceName))
	}
	if o.ServiceNamespace != "" {
		own = append(own, attribute.String("service.namespace", o.ServiceNamespace))
	}
	res, err := resource.New(ctx,
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attribute.String("service.name", "sluice")),
		resource.WithFromEnv(),
		resource.WithAttributes(own...))
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return res, nil
}

// randomUUID is a version 4 UUID.
func randomUUID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// Shutdown sends the spans not yet sent, within ctx, and stops the
// provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// Propagator reads (and writes) a trace context as W3C traceparent and
// tracestate, B3 (the single b3 header or the X-B3-* headers) and W3C
// baggage, as envoyproxy/ratelimit does. When a request carries both, the
// B3 context wins, being extracted last.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{},
		b3.New(b3.WithInjectEncoding(b3.B3MultipleHeader|b3.B3SingleHeader)), propagation.Baggage{})
}
