package server

import (
	"context"
	"errors"
	"strconv"
	"sync"

	corepb "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
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
}

// RLS serves Envoy's envoy.service.ratelimit.v3.RateLimitService. It
// translates between the wire messages and the limiter, nothing else.
type RLS struct {
	rlspb.UnimplementedRateLimitServiceServer
	lim     *limiter.Limiter
	opts    Options
	headers Headers
	calls   sync.Pool
}

// call holds the limiter's request and response for one RPC. Pooled.
// Over gRPC the codec fills req from the message bytes copied into buf
// (see decodeRLS); domain is the last domain decoded, reused when equal.
type call struct {
	req    limiter.Request
	resp   limiter.Response
	buf    []byte
	domain string
}

// NewRLS returns Envoy's rate-limit service over lim.
func NewRLS(lim *limiter.Limiter, opts Options) *RLS {
	s := &RLS{lim: lim, opts: opts, headers: opts.HeaderNames.withDefaults()}
	s.calls.New = func() any { return new(call) }
	return s
}

// ShouldRateLimit implements rlspb.RateLimitServiceServer.
func (s *RLS) ShouldRateLimit(ctx context.Context, in *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	c := s.calls.Get().(*call)
	defer s.calls.Put(c)
	fillRequest(&c.req, in)
	return s.check(ctx, c)
}

// check answers c's request.
func (s *RLS) check(ctx context.Context, c *call) (*rlspb.RateLimitResponse, error) {
	if err := s.lim.Check(ctx, &c.req, &c.resp); err != nil {
		return nil, grpcError(err)
	}
	return s.response(&c.resp), nil
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
		if pd.GetIsNegativeHits() {
			// Refunds are not applied: the descriptor is only checked.
			d.Cost, d.HasCost = 0, true
		}
		if o := pd.GetLimit(); o != nil {
			d.Override = limiter.Override{RequestsPerUnit: o.GetRequestsPerUnit(), Unit: config.Unit(o.GetUnit()),
				UnitMultiplier: o.GetUnitMultiplier().GetValue()}
		}
	}
}

// statusBlock holds one descriptor's messages, so that a response's
// statuses are allocated together.
type statusBlock struct {
	status   rlspb.RateLimitResponse_DescriptorStatus
	limit    rlspb.RateLimitResponse_RateLimit
	duration durationpb.Duration
}

// response builds Envoy's response: three allocations whatever the
// number of descriptors.
func (s *RLS) response(r *limiter.Response) *rlspb.RateLimitResponse {
	out := &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_Code(r.Overall)}
	blocks := make([]statusBlock, len(r.Statuses))
	out.Statuses = make([]*rlspb.RateLimitResponse_DescriptorStatus, len(r.Statuses))
	for i := range r.Statuses {
		st, b := &r.Statuses[i], &blocks[i]
		ps := &b.status
		out.Statuses[i] = ps
		ps.Code = rlspb.RateLimitResponse_Code(st.Code)
		switch {
		case st.Unlimited:
			ps.LimitRemaining = st.Remaining()
		case st.Limited:
			l := &b.limit
			l.Name, l.RequestsPerUnit, l.Unit = st.Name, st.RequestsPerUnit, rlspb.RateLimitResponse_RateLimit_Unit(st.Unit)
			if st.UnitMultiplier > 1 {
				l.UnitMultiplier = wrapperspb.UInt32(st.UnitMultiplier)
			}
			b.duration.Seconds = int64(st.ResetAfter().Seconds())
			ps.CurrentLimit, ps.LimitRemaining, ps.DurationUntilReset = l, st.Remaining(), &b.duration
		}
	}
	if s.opts.ResponseHeaders {
		out.ResponseHeadersToAdd = s.responseHeaders(r)
	}
	return out
}

func (s *RLS) responseHeaders(r *limiter.Response) []*corepb.HeaderValue {
	i := r.MostRestrictive()
	if i < 0 {
		return nil
	}
	st := &r.Statuses[i]
	hs := []*corepb.HeaderValue{
		{Key: s.headers.Limit, Value: strconv.FormatUint(uint64(st.RequestsPerUnit), 10)},
		{Key: s.headers.Remaining, Value: strconv.FormatUint(uint64(st.Remaining()), 10)},
		{Key: s.headers.Reset, Value: strconv.FormatInt(int64(st.ResetAfter().Seconds()), 10)},
	}
	if d := r.RetryAfter(); d > 0 && d != store.Never {
		hs = append(hs, &corepb.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(int64(d.Seconds()), 10)})
	}
	return hs
}

// grpcError maps the limiter's errors to gRPC status codes.
func grpcError(err error) error {
	var inv *limiter.InvalidError
	var se *limiter.StoreError
	switch {
	case errors.As(err, &inv):
		return status.Error(codes.InvalidArgument, inv.Reason)
	case errors.As(err, &se):
		return status.Error(codes.Unavailable, se.Error())
	case errors.Is(err, limiter.ErrNoConfig):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	}
	return status.Error(codes.Internal, err.Error())
}
