package server

import (
	"context"
	"errors"
	"strings"
	"sync"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
)

// Headers names the response headers added when Options.ResponseHeaders is
// set. The zero value means the IETF draft names.
type Headers struct {
	Limit, Remaining, Reset string
}

func (h Headers) withDefaults() Headers {
	if h.Limit == "" {
		h.Limit = "RateLimit-Limit"
	}
	if h.Remaining == "" {
		h.Remaining = "RateLimit-Remaining"
	}
	if h.Reset == "" {
		h.Reset = "RateLimit-Reset"
	}
	return h
}

// Options configure the protocol adapters. The zero value means defaults.
type Options struct {
	// ResponseHeaders adds RateLimit-Limit, -Remaining and -Reset (values
	// of the most restrictive descriptor) to Envoy's
	// response_headers_to_add, and Retry-After when over the limit.
	ResponseHeaders bool
	// HeaderNames renames those headers.
	HeaderNames Headers
	// IETFHeaders adds the RateLimit-Policy and RateLimit fields of the
	// IETF httpapi draft (one item per limit the request was counted
	// against) to response_headers_to_add and to /v1/check answers, and
	// Retry-After when over the limit.
	IETFHeaders bool
	// DynamicMetadata fills RateLimitResponse.dynamic_metadata as the
	// reference does with RESPONSE_DYNAMIC_METADATA: the domain, the
	// descriptors, the hits addend and the merged metadata of the rules
	// of the descriptors that passed.
	DynamicMetadata bool
	// MaxBodyBytes bounds the body of an HTTP request (POST /json and
	// /v1/check): a larger one gets 413. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Tracing, with a Tracer, starts a span per decision and per RLQS
	// report.
	Tracing Tracing
	// OnIgnoredField, if set, is called for each field of a
	// ShouldRateLimit request that Sluice ignores: a field its version of
	// Envoy's proto does not define (a newer Envoy's), by the full name of
	// its message and its number, once per request and field (at most 8
	// fields a request). Called on the request's path: it must be cheap.
	OnIgnoredField func(message string, number int32)
	// Refunds says who may give usage back; RefundAuth decides the
	// token of RefundsToken (the admin token).
	Refunds    Refunds
	RefundAuth Authorizer
}

// RLS serves Envoy's envoy.service.ratelimit.v3.RateLimitService. It
// translates between the wire messages and the limiter, nothing else.
type RLS struct {
	rlspb.UnimplementedRateLimitServiceServer
	lim     *limiter.Limiter
	opts    Options
	headers Headers
	calls   sync.Pool
	replies *sync.Pool
	// info and handle are what interceptors get for every call of
	// rlsService (built once: gRPC's generated handlers allocate them per
	// call).
	info   *grpc.UnaryServerInfo
	handle grpc.UnaryHandler
	bounds bounds
	shape  shape // of a request's wire form
}

// call holds the limiter's request and response for one RPC. Pooled.
// Over gRPC the codec fills req from the message bytes copied into buf
// (see decodeRLS); domain is the last domain decoded, reused when equal.
type call struct {
	req     limiter.Request
	resp    limiter.Response
	buf     []byte
	domain  string
	unknown unknownFields
	// invalid is why the codec stopped decoding req: past the bounds.
	invalid *limiter.InvalidError
}

// maxPooledBuf bounds the message buffer a pooled call keeps: a call that
// held a larger request is left to the garbage collector, so that a few
// large requests do not pin their size in every pooled call.
const maxPooledBuf = 64 << 10

// release returns c to the pool unless it holds a large buffer.
func (s *RLS) release(c *call) {
	if cap(c.buf) > maxPooledBuf {
		return
	}
	s.calls.Put(c)
}

// NewRLS returns Envoy's rate-limit service over lim.
// Header names that are not valid UTF-8 have their bad bytes replaced,
// as a proto string must be valid UTF-8.
func NewRLS(lim *limiter.Limiter, opts Options) *RLS {
	h := opts.HeaderNames.withDefaults()
	for _, n := range []*string{&h.Limit, &h.Remaining, &h.Reset} {
		*n = strings.ToValidUTF8(*n, "\uFFFD")
	}
	s := &RLS{lim: lim, opts: opts, headers: h, replies: newReplyPool(), bounds: limiterBounds(lim)}
	s.shape = requestShape(s.bounds)
	s.calls.New = func() any { return new(call) }
	s.info = &grpc.UnaryServerInfo{Server: s, FullMethod: shouldRateLimitMethod}
	s.handle = func(ctx context.Context, req any) (any, error) { return s.reply(ctx, req.(*call)) }
	return s
}

// ShouldRateLimit implements rlspb.RateLimitServiceServer.
func (s *RLS) ShouldRateLimit(ctx context.Context, in *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	c := s.calls.Get().(*call)
	defer s.calls.Put(c)
	fillRequest(&c.req, in)
	if s.opts.OnIgnoredField != nil {
		unknownOf(in, &c.unknown)
		c.unknown.report(s.opts.OnIgnoredField)
	}
	return s.check(ctx, c)
}

// check answers c's request with a message.
func (s *RLS) check(ctx context.Context, c *call) (*rlspb.RateLimitResponse, error) {
	if err := s.opts.checkRefunds(ctx, nil, &c.req); err != nil {
		return nil, grpcError(err)
	}
	if err := s.opts.Tracing.check(ctx, spanShouldRateLimit, nil, s.lim, &c.req, &c.resp); err != nil {
		return nil, grpcError(err)
	}
	return s.response(&c.req, &c.resp), nil
}

// reply answers c's request with a *reply, the response's wire form,
// which no longer refers to c.
func (s *RLS) reply(ctx context.Context, c *call) (any, error) {
	if err := s.opts.checkRefunds(ctx, nil, &c.req); err != nil {
		return nil, grpcError(err)
	}
	if err := s.opts.Tracing.check(ctx, spanShouldRateLimit, nil, s.lim, &c.req, &c.resp); err != nil {
		return nil, grpcError(err)
	}
	r := s.replies.Get().(*reply)
	r.data = s.appendResponse(r.data[:0], &c.req, &c.resp)
	return r, nil
}

// fillRequest translates an Envoy request into r, reusing r's buffers.
// The strings alias in's; r must not outlive it.
func fillRequest(r *limiter.Request, in *rlspb.RateLimitRequest) {
	r.Reset()
	r.Domain = in.GetDomain()
	r.HitsAddend = uint64(in.GetHitsAddend())
	for _, pd := range in.GetDescriptors() {
		d := r.AddDescriptor()
		for _, e := range pd.GetEntries() {
			d.Entries = append(d.Entries, config.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		if h := pd.GetHitsAddend(); h != nil {
			d.Cost, d.HasCost = h.GetValue(), true
		}
		d.Kind = kind(d.HasCost, d.Cost, pd.GetIsNegativeHits())
		if o := pd.GetLimit(); o != nil {
			d.Override = limiter.Override{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: config.Unit(o.GetUnit()),
				UnitMultiplier: o.GetUnitMultiplier().GetValue()}
		}
	}
}

// response is Envoy's response to req as a message: appendResponse's
// bytes, unmarshalled, for the paths that need the message.
func (s *RLS) response(req *limiter.Request, r *limiter.Response) *rlspb.RateLimitResponse {
	out := new(rlspb.RateLimitResponse)
	if err := proto.Unmarshal(s.appendResponse(nil, req, r), out); err != nil {
		// appendResponse writes valid UTF-8 and well-formed fields only.
		panic("server: unmarshal an encoded response: " + err.Error())
	}
	return out
}

// grpcError maps the limiter's errors to gRPC status codes.
func grpcError(err error) error {
	var inv *limiter.InvalidError
	var se *limiter.StoreError
	var re *RefusedError
	switch {
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, inv.Reason)
	case errors.As(err, &se):
		return status.Error(codes.Unavailable, se.Error())
	case errors.As(err, &re):
		return status.Error(codes.PermissionDenied, re.Reason)
	case errors.Is(err, limiter.ErrNoConfig):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}
