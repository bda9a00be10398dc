package client

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/store"
)

// DefaultTimeout is the per-call deadline of a Client, like Envoy's
// rate-limit filter.
const DefaultTimeout = 20 * time.Millisecond

// Never is the RetryAfter of a denial that no amount of waiting turns
// into a grant (the cost exceeds the limit's capacity).
const Never = store.Never

// FailureMode says what a Client answers when Sluice cannot: unreachable,
// too slow, or failing.
type FailureMode uint8

const (
	// FailAllow lets requests through (the default, like Envoy's
	// failure_mode_deny: false).
	FailAllow FailureMode = iota
	// FailDeny refuses them.
	FailDeny
)

// Entry is one key/value pair of a descriptor.
type Entry struct {
	Key, Value string
}

// Descriptor is an ordered list of entries, matched against a domain's
// rules as in Envoy's rate-limit descriptors.
type Descriptor []Entry

// Status is the decision for one descriptor.
type Status struct {
	// Allowed is false when this descriptor was over its limit.
	Allowed bool
	// Limited is false when no limit applied: no rule matched, the rule
	// is unlimited, or another rule replaced it. The fields below are
	// then zero.
	Limited bool
	// Name is the rule's name from the limits file, if it has one.
	Name string
	// Limit is requests per window (fixed window) or the capacity (token
	// bucket); over Envoy's API, the rule's requests_per_unit.
	Limit uint64
	// Unit is the limit's unit over Envoy's API ("second", "minute", ...);
	// empty over Sluice's API.
	Unit string
	// Remaining is what is left after this request.
	Remaining uint64
	// ResetAfter is the time until the window ends or the bucket is full.
	// Envoy's API carries whole seconds.
	ResetAfter time.Duration
	// RetryAfter is zero when allowed. When denied it is the time until
	// the request could succeed, or Never. Envoy's API does not carry it:
	// there it is ResetAfter, which for a token bucket is an upper bound.
	RetryAfter time.Duration
}

// Result is Sluice's answer to one call.
type Result struct {
	// Allowed is the overall decision. When Sluice did not answer, it is
	// the failure mode's.
	Allowed bool
	// Statuses holds one Status per descriptor, in request order; empty
	// when Sluice did not answer.
	Statuses []Status
	// Limit, Remaining and ResetAfter are those of the most restrictive
	// limited descriptor (the least remaining); zero when none is limited.
	Limit      uint64
	Remaining  uint64
	ResetAfter time.Duration
	// RetryAfter is the longest RetryAfter of the denied descriptors (or
	// Never); zero when allowed, or when Envoy's API gave no limit for a
	// denial.
	RetryAfter time.Duration
	// FailedOpen is true when Sluice did not answer and FailAllow let the
	// request through.
	FailedOpen bool
}

// Stats counts a Client's calls. Calls = answered + Failures.
type Stats struct {
	Calls     uint64 // calls made to Sluice
	OverLimit uint64 // answers that denied
	Failures  uint64 // calls Sluice did not answer; the FailureMode decided
}

// Option configures a Client.
type Option func(*options)

type options struct {
	timeout  time.Duration
	mode     FailureMode
	rls      bool
	tls      *tls.Config
	dialOpts []grpc.DialOption
}

// WithTimeout sets the deadline of each call to Sluice (default
// DefaultTimeout). Zero or less leaves only the caller's context.
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithFailureMode sets what the Client answers when Sluice does not
// (default FailAllow).
func WithFailureMode(m FailureMode) Option { return func(o *options) { o.mode = m } }

// WithEnvoyRLS makes the enforcement middleware ask over Envoy's
// RateLimitService instead of Sluice's own API, for servers that speak
// only Envoy's protocol (envoyproxy/ratelimit). Retry hints are then the
// time until the limit resets, in whole seconds.
func WithEnvoyRLS() Option { return func(o *options) { o.rls = true } }

// WithTLS makes Dial connect over TLS with cfg. Without it Dial connects
// in plaintext.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithDialOptions adds options to Dial's grpc.NewClient.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dialOpts = append(o.dialOpts, opts...) }
}

// Client calls Sluice, over Envoy's RateLimitService or Sluice's own API.
// Safe for concurrent use.
type Client struct {
	conn  *grpc.ClientConn
	owned bool // Dial made conn; Close closes it
	rls   rlspb.RateLimitServiceClient
	api   sluicev1.RateLimiterClient
	opts  options

	calls, overLimit, failures atomic.Uint64
}

// New returns a Client over conn. Closing conn is the caller's job.
func New(conn *grpc.ClientConn, opts ...Option) *Client {
	o := options{timeout: DefaultTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	return &Client{conn: conn, rls: rlspb.NewRateLimitServiceClient(conn), api: sluicev1.NewRateLimiterClient(conn), opts: o}
}

// Dial returns a Client of Sluice at addr (host:port, or any gRPC target),
// in plaintext unless WithTLS is given. It starts connecting in the
// background and returns at once, so that the first call's short deadline
// is not spent on the handshake. Close releases the connection.
func Dial(addr string, opts ...Option) (*Client, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	creds := insecure.NewCredentials()
	if o.tls != nil {
		creds = credentials.NewTLS(o.tls)
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(creds)}, o.dialOpts...)...)
	if err != nil {
		return nil, fmt.Errorf("client: dial %s: %w", addr, err)
	}
	conn.Connect()
	c := New(conn, opts...)
	c.owned = true
	return c, nil
}

// Close closes the connection if Dial made it.
func (c *Client) Close() error {
	if !c.owned {
		return nil
	}
	return c.conn.Close()
}

// Stats returns the call counters.
func (c *Client) Stats() Stats {
	return Stats{Calls: c.calls.Load(), OverLimit: c.overLimit.Load(), Failures: c.failures.Load()}
}

// ShouldRateLimit asks over Envoy's RateLimitService. hits is the
// request's hits_addend: the cost of every descriptor, 0 meaning 1.
//
// When Sluice does not answer, err says why and the Result carries the
// FailureMode's decision (Allowed, FailedOpen) and no statuses.
func (c *Client) ShouldRateLimit(ctx context.Context, domain string, descriptors []Descriptor, hits uint32) (Result, error) {
	req := &rlspb.RateLimitRequest{Domain: domain, HitsAddend: hits,
		Descriptors: make([]*ratelimitpb.RateLimitDescriptor, len(descriptors))}
	for i, d := range descriptors {
		pd := &ratelimitpb.RateLimitDescriptor{Entries: make([]*ratelimitpb.RateLimitDescriptor_Entry, len(d))}
		for j, e := range d {
			pd.Entries[j] = &ratelimitpb.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value}
		}
		req.Descriptors[i] = pd
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	c.calls.Add(1)
	resp, err := c.rls.ShouldRateLimit(ctx, req)
	if err != nil {
		return c.failed(fmt.Errorf("client: ShouldRateLimit: %w", err))
	}
	return c.answered(rlsResult(resp)), nil
}

// Check asks over Sluice's own API. cost is taken from every descriptor,
// all or nothing; 0 checks without consuming (a peek): over only past the
// limit, or with the server's --strict-peeks unless one more unit fits.
//
// When Sluice does not answer, err says why and the Result carries the
// FailureMode's decision (Allowed, FailedOpen) and no statuses.
func (c *Client) Check(ctx context.Context, domain string, descriptors []Descriptor, cost uint64) (Result, error) {
	return c.check(ctx, domain, descriptors, cost, sluicev1.CostKind_COST_KIND_UNSPECIFIED)
}

// Charge records usage that already happened (the tokens a response
// used) on every descriptor, whole, past the limits too: later checks are
// denied until the limits have room again. The Result is not allowed when
// the charge did not fit.
func (c *Client) Charge(ctx context.Context, domain string, descriptors []Descriptor, cost uint64) (Result, error) {
	return c.check(ctx, domain, descriptors, cost, sluicev1.CostKind_COST_KIND_CHARGE)
}

// Refund gives usage back on every descriptor (an estimate charged
// earlier, trued up), never below empty nor above the limits.
func (c *Client) Refund(ctx context.Context, domain string, descriptors []Descriptor, cost uint64) (Result, error) {
	return c.check(ctx, domain, descriptors, cost, sluicev1.CostKind_COST_KIND_REFUND)
}

func (c *Client) check(ctx context.Context, domain string, descriptors []Descriptor, cost uint64, kind sluicev1.CostKind) (Result, error) {
	req := &sluicev1.CheckRequest{Domain: domain, Cost: &cost, Kind: kind,
		Descriptors: make([]*sluicev1.Descriptor, len(descriptors))}
	for i, d := range descriptors {
		pd := &sluicev1.Descriptor{Entries: make([]*sluicev1.Entry, len(d))}
		for j, e := range d {
			pd.Entries[j] = &sluicev1.Entry{Key: e.Key, Value: e.Value}
		}
		req.Descriptors[i] = pd
	}
	ctx, cancel := c.callContext(ctx)
	defer cancel()
	c.calls.Add(1)
	resp, err := c.api.Check(ctx, req)
	if err != nil {
		return c.failed(fmt.Errorf("client: Check: %w", err))
	}
	return c.answered(checkResult(resp)), nil
}

// decide asks by the protocol the Client was configured for, with a cost
// of one.
func (c *Client) decide(ctx context.Context, domain string, descriptors []Descriptor) (Result, error) {
	if c.opts.rls {
		return c.ShouldRateLimit(ctx, domain, descriptors, 1)
	}
	return c.Check(ctx, domain, descriptors, 1)
}

func (c *Client) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if c.opts.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.opts.timeout)
}

func (c *Client) failed(err error) (Result, error) {
	c.failures.Add(1)
	allow := c.opts.mode == FailAllow
	return Result{Allowed: allow, FailedOpen: allow}, err
}

func (c *Client) answered(r Result) Result {
	if !r.Allowed {
		c.overLimit.Add(1)
	}
	return r
}

func rlsResult(resp *rlspb.RateLimitResponse) Result {
	r := Result{Allowed: resp.GetOverallCode() != rlspb.RateLimitResponse_OVER_LIMIT,
		Statuses: make([]Status, len(resp.GetStatuses()))}
	for i, ps := range resp.GetStatuses() {
		s := &r.Statuses[i]
		s.Allowed = ps.GetCode() != rlspb.RateLimitResponse_OVER_LIMIT
		if l := ps.GetCurrentLimit(); l != nil {
			s.Limited = true
			s.Name, s.Limit = l.GetName(), uint64(l.GetRequestsPerUnit())
			s.Unit = strings.ToLower(l.GetUnit().String())
			s.Remaining = uint64(ps.GetLimitRemaining())
			s.ResetAfter = ps.GetDurationUntilReset().AsDuration()
			if !s.Allowed {
				s.RetryAfter = s.ResetAfter
			}
		}
	}
	summarize(&r)
	return r
}

// summarize fills a Result's most-restrictive figures from its statuses.
func summarize(r *Result) {
	best := -1
	for i := range r.Statuses {
		s := &r.Statuses[i]
		if !s.Limited {
			continue
		}
		if best < 0 || s.Remaining < r.Statuses[best].Remaining {
			best = i
		}
		if !s.Allowed && !r.Allowed {
			r.RetryAfter = max(r.RetryAfter, s.RetryAfter)
		}
	}
	if best >= 0 {
		s := &r.Statuses[best]
		r.Limit, r.Remaining, r.ResetAfter = s.Limit, s.Remaining, s.ResetAfter
	}
}

func checkResult(resp *sluicev1.CheckResponse) Result {
	r := Result{Allowed: resp.GetAllowed(), Statuses: make([]Status, len(resp.GetResults())),
		Limit: resp.GetLimit(), Remaining: resp.GetRemaining(), ResetAfter: resp.GetResetAfter().AsDuration()}
	if !r.Allowed {
		r.RetryAfter = Never
		if ra := resp.GetRetryAfter(); ra != nil {
			r.RetryAfter = ra.AsDuration()
		}
	}
	for i, pr := range resp.GetResults() {
		s := &r.Statuses[i]
		s.Allowed, s.Limited = pr.GetAllowed(), pr.GetLimited()
		if !s.Limited {
			continue
		}
		s.Name, s.Limit, s.Remaining = pr.GetRule(), pr.GetLimit(), pr.GetRemaining()
		s.ResetAfter = pr.GetResetAfter().AsDuration()
		if !s.Allowed {
			s.RetryAfter = Never
			if ra := pr.GetRetryAfter(); ra != nil {
				s.RetryAfter = ra.AsDuration()
			}
		}
	}
	return r
}
