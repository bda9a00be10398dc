package server

import (
	"context"
	"net/http"
	"strings"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
)

// Tracing makes the adapters start a span for every decision (Envoy's
// ShouldRateLimit, our API's Check, the HTTP checks) and every RLQS usage
// report, a child of the trace context the caller sent in its gRPC
// metadata or HTTP headers. The zero value traces nothing and costs a
// nil check per call.
type Tracing struct {
	// Tracer starts the spans; nil turns tracing off.
	Tracer trace.Tracer
	// Propagator reads the caller's trace context (observe/tracing's
	// reads W3C traceparent and B3); nil ignores it.
	Propagator propagation.TextMapPropagator
}

// Span names.
const (
	spanShouldRateLimit = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	spanAPICheck        = "sluice.v1.RateLimiter/Check"
	spanRLQSReport      = "envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas report"
)

// Attribute keys of the spans. Descriptor values appear only for rules
// with detailed_metric, as in the metrics.
const (
	attrDomain      = attribute.Key("ratelimit.domain")
	attrDescriptors = attribute.Key("ratelimit.descriptors")
	attrOverall     = attribute.Key("ratelimit.overall_code")
	attrRules       = attribute.Key("ratelimit.rules")
	attrValues      = attribute.Key("ratelimit.descriptor_values")
	attrBuckets     = attribute.Key("ratelimit.buckets")
)

// check runs lim.Check on req, within a span named name when tracing is
// on. The span's parent is read from headers, or when headers is nil from
// the gRPC metadata of ctx.
func (t *Tracing) check(ctx context.Context, name string, headers http.Header, lim *limiter.Limiter, req *limiter.Request, resp *limiter.Response) error {
	if t.Tracer == nil {
		return lim.Check(ctx, req, resp)
	}
	ctx, span := t.start(ctx, name, headers)
	defer span.End()
	err := lim.Check(ctx, req, resp)
	if span.IsRecording() {
		annotate(span, req, resp, err)
	}
	return err
}

// start starts a server span named name, a child of the trace context in
// headers or in ctx's gRPC metadata.
func (t *Tracing) start(ctx context.Context, name string, headers http.Header) (context.Context, trace.Span) {
	if t.Propagator != nil {
		if headers != nil {
			ctx = t.Propagator.Extract(ctx, propagation.HeaderCarrier(headers))
		} else if md, ok := metadata.FromIncomingContext(ctx); ok {
			ctx = t.Propagator.Extract(ctx, metadataCarrier(md))
		}
	}
	return t.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
}

// annotate describes the decision on span: the domain, the number of
// descriptors, the overall code, the rules that applied and, for rules
// with detailed_metric, the descriptors' entries. Strings of req may
// alias a reused buffer and the span outlives the call: they are copied.
func annotate(span trace.Span, req *limiter.Request, resp *limiter.Response, err error) {
	span.SetAttributes(attrDomain.String(strings.Clone(clip(req.Domain, maxSpanDomain))), attrDescriptors.Int(len(req.Descriptors)))
	if err != nil {
		failed(span, err)
		return
	}
	var rules, values []string
	for i := range resp.Statuses {
		r := resp.Statuses[i].Rule
		if r == nil {
			continue
		}
		if r.Name != "" {
			rules = append(rules, r.Name)
		} else {
			rules = append(rules, r.Path)
		}
		if r.DetailedMetric && i < len(req.Descriptors) {
			values = append(values, entriesString(req.Descriptors[i].Entries))
		}
	}
	span.SetAttributes(attrOverall.String(resp.Overall.String()))
	if rules != nil {
		span.SetAttributes(attrRules.StringSlice(rules))
	}
	if values != nil {
		span.SetAttributes(attrValues.StringSlice(values))
	}
}

// maxSpanDomain bounds the part of a domain a span copies (a refused
// request's may be as long as its message; the exporter cuts attributes
// to about this anyway).
const maxSpanDomain = 1024

// clip is s cut to at most n bytes, at the start of a UTF-8 sequence.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// failed records err on span and marks it failed.
func failed(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// entriesString is "key=value,key2=value2", a new string.
func entriesString(es []config.Entry) string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(e.Key)
		b.WriteByte('=')
		b.WriteString(e.Value)
	}
	return b.String()
}

// metadataCarrier reads a trace context from gRPC metadata, whose keys
// are lower case.
type metadataCarrier metadata.MD

func (c metadataCarrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c metadataCarrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c metadataCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
