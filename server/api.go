package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/config"
	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// API serves Sluice's own sluice.v1.RateLimiter service.
type API struct {
	sluicev1.UnimplementedRateLimiterServer
	lim     *limiter.Limiter
	calls   sync.Pool
	tracing Tracing
	opts    Options
	bounds  bounds
	shape   shape // of a request's wire form
}

// NewAPI returns the sluice.v1.RateLimiter service over lim; of opts it
// reads Tracing.
func NewAPI(lim *limiter.Limiter, opts Options) *API {
	a := &API{lim: lim, tracing: opts.Tracing, opts: opts, bounds: limiterBounds(lim)}
	a.shape = requestShape(a.bounds)
	a.calls.New = func() any { return new(call) }
	return a
}

// Check implements sluicev1.RateLimiterServer.
func (a *API) Check(ctx context.Context, in *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	out, err := a.check(ctx, in)
	if err != nil {
		return nil, grpcError(err)
	}
	return out, nil
}

// check runs a request through the limiter; errors are the limiter's.
func (a *API) check(ctx context.Context, in *sluicev1.CheckRequest) (*sluicev1.CheckResponse, error) {
	c := a.calls.Get().(*call)
	defer a.calls.Put(c)
	if err := fillCheck(&c.req, in); err != nil {
		return nil, err
	}
	if err := a.opts.checkRefunds(ctx, nil, &c.req); err != nil {
		return nil, err
	}
	if err := a.tracing.check(ctx, spanAPICheck, nil, a.lim, &c.req, &c.resp); err != nil {
		return nil, err
	}
	return checkResponse(&c.resp), nil
}

// fillCheck translates our API's request. Every descriptor gets an
// explicit cost, so 0 means "check only" here, unlike Envoy's hits_addend,
// and its kind is said in words: a cost is the request's own unless the
// request or the descriptor makes it a charge or a refund.
func fillCheck(r *limiter.Request, in *sluicev1.CheckRequest) error {
	r.Reset()
	r.Domain = in.GetDomain()
	cost := uint64(1)
	if in.Cost != nil {
		cost = in.GetCost()
	}
	kind, err := costKind(in.GetKind())
	if err != nil {
		return err
	}
	if in.GetKey() != "" || in.GetValue() != "" {
		if len(in.GetDescriptors()) > 0 {
			return &limiter.InvalidError{Reason: "key/value and descriptors are mutually exclusive"}
		}
		d := r.AddDescriptor()
		d.Entries = append(d.Entries, config.Entry{Key: in.GetKey(), Value: in.GetValue()})
		d.Cost, d.HasCost, d.Kind = cost, true, kind
		return nil
	}
	for _, pd := range in.GetDescriptors() {
		d := r.AddDescriptor()
		for _, e := range pd.GetEntries() {
			d.Entries = append(d.Entries, config.Entry{Key: e.GetKey(), Value: e.GetValue()})
		}
		d.Cost, d.HasCost, d.Kind = cost, true, kind
		if pd.Cost != nil {
			d.Cost = pd.GetCost()
		}
		if pd.Kind != nil {
			if d.Kind, err = costKind(pd.GetKind()); err != nil {
				return err
			}
		}
	}
	return nil
}

// costKind translates our API's CostKind.
func costKind(k sluicev1.CostKind) (limiter.Kind, error) {
	switch k {
	case sluicev1.CostKind_COST_KIND_UNSPECIFIED:
		return limiter.Hits, nil
	case sluicev1.CostKind_COST_KIND_CHARGE:
		return limiter.Charge, nil
	case sluicev1.CostKind_COST_KIND_REFUND:
		return limiter.Refund, nil
	}
	return 0, &limiter.InvalidError{Reason: fmt.Sprintf("unknown cost kind %d", int32(k))}
}

func checkResponse(r *limiter.Response) *sluicev1.CheckResponse {
	out := &sluicev1.CheckResponse{Allowed: r.Overall == limiter.OK}
	results := make([]sluicev1.DescriptorResult, len(r.Statuses))
	out.Results = make([]*sluicev1.DescriptorResult, len(r.Statuses))
	for i := range r.Statuses {
		st, res := &r.Statuses[i], &results[i]
		out.Results[i] = res
		res.Allowed = st.Code == limiter.OK
		res.Limited = st.Limited
		if !st.Limited {
			continue
		}
		res.Rule, res.Limit, res.Remaining = st.Name, st.Decision.Limit, st.Decision.Remaining
		res.ResetAfter = durationpb.New(st.Decision.ResetAfter)
		if st.Code == limiter.OverLimit && st.Decision.RetryAfter != store.Never {
			res.RetryAfter = durationpb.New(st.Decision.RetryAfter)
		}
	}
	if i := r.MostRestrictive(); i >= 0 {
		st := &r.Statuses[i]
		out.Limit, out.Remaining = st.Decision.Limit, st.Decision.Remaining
		out.ResetAfter = durationpb.New(st.Decision.ResetAfter)
	}
	if d := exactRetryAfter(r); d > 0 {
		out.RetryAfter = durationpb.New(d)
	}
	return out
}

// exactRetryAfter is the unrounded time until a denied request could
// succeed; 0 when allowed or when it never can.
func exactRetryAfter(r *limiter.Response) time.Duration {
	if r.Overall != limiter.OverLimit {
		return 0
	}
	var longest time.Duration
	for i := range r.Statuses {
		st := &r.Statuses[i]
		if st.Code != limiter.OverLimit {
			continue
		}
		if st.Decision.RetryAfter == store.Never {
			return 0
		}
		longest = max(longest, st.Decision.RetryAfter)
	}
	return longest
}
