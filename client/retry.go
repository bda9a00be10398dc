package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrRateLimited is returned (wrapped) when RetryConfig.FailFast is set
// and the outgoing Bucket has no token for an attempt.
var ErrRateLimited = errors.New("client: outgoing rate limit reached")

// DefaultMaxAttempts is the most attempts, the first try included, that a
// Retrier makes for one call by default.
const DefaultMaxAttempts = 5

// RetryConfig configures a Retrier. The zero value means: no outgoing
// pacing, a default RetryBudget, the default Backoff, DefaultMaxAttempts,
// and retries for gRPC UNAVAILABLE and RESOURCE_EXHAUSTED and HTTP 429 and
// 503.
type RetryConfig struct {
	// Bucket, if not nil, paces every attempt, first tries included.
	Bucket *Bucket
	// FailFast makes an attempt fail with ErrRateLimited when Bucket is
	// empty, instead of waiting for a token. (The gRPC interceptor's error
	// also has the status RESOURCE_EXHAUSTED.) A wait that cannot end
	// before the call's deadline fails at once either way.
	FailFast bool
	// Budget limits retries across all calls. Nil means a budget of
	// BudgetConfig's defaults owned by this Retrier. Share one Budget
	// between Retriers that call the same service.
	Budget *RetryBudget
	// Backoff is the template for each call's delays: its Base, Cap and
	// Rand are copied into a fresh Backoff per call. Rand, if set, must be
	// safe for concurrent use.
	Backoff Backoff
	// MaxAttempts bounds the attempts per call, the first try included.
	// Zero means DefaultMaxAttempts; 1 disables retries.
	MaxAttempts int
	// RetryableError reports whether a gRPC call that failed with err may
	// be retried. Nil means codes UNAVAILABLE and RESOURCE_EXHAUSTED.
	RetryableError func(err error) bool
	// RetryableResponse reports whether an HTTP attempt may be retried:
	// resp is nil when err is not. Nil means responses 429 and 503;
	// transport errors are not retried.
	RetryableResponse func(resp *http.Response, err error) bool
	// RetryAnyMethod lets the RoundTripper retry methods that are not
	// idempotent (POST, PATCH) when their body can be replayed. By default
	// only GET, HEAD, OPTIONS, TRACE, PUT, DELETE and requests carrying an
	// Idempotency-Key or X-Idempotency-Key header are retried.
	RetryAnyMethod bool
}

// Retrier retries failed calls with decorrelated-jitter backoff under a
// retry budget, optionally pacing every attempt with a Bucket. It
// packages as a gRPC client interceptor and an HTTP RoundTripper. A
// server's retry hint (a google.rpc.RetryInfo status detail, or an HTTP
// Retry-After header) is a floor for the delay. A retry that would wait
// past the call's deadline is not attempted: the last failure is
// returned. Waiting uses one timer per call, stopped when the call ends;
// a Retrier starts no goroutines and is safe for concurrent use.
//
// A first try that does not fail retryably counts as a success and
// deposits into the budget; a refused retry returns an error wrapping
// both ErrRetryBudgetExhausted and the failure.
type Retrier struct {
	cfg RetryConfig
}

// NewRetrier returns a Retrier configured by cfg.
func NewRetrier(cfg RetryConfig) *Retrier {
	if cfg.Budget == nil {
		cfg.Budget = newRetryBudget(DefaultBudgetCap, DefaultBudgetInitial, nil)
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.RetryableError == nil {
		cfg.RetryableError = RetryableCode
	}
	if cfg.RetryableResponse == nil {
		cfg.RetryableResponse = RetryableStatus
	}
	cfg.Backoff.prev = 0
	return &Retrier{cfg: cfg}
}

// RetryableCode is the default RetryableError: gRPC UNAVAILABLE and
// RESOURCE_EXHAUSTED.
func RetryableCode(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.ResourceExhausted:
		return true
	}
	return false
}

// RetryableStatus is the default RetryableResponse: HTTP 429 and 503.
func RetryableStatus(resp *http.Response, err error) bool {
	return err == nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable)
}

// UnaryClientInterceptor returns an interceptor that retries unary calls.
func (r *Retrier) UnaryClientInterceptor() grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		c := call{r: r, bo: r.cfg.Backoff}
		defer c.stop()
		for attempt := 1; ; attempt++ {
			if err := c.pace(ctx); err != nil {
				return grpcPaceError(err)
			}
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil || !r.cfg.RetryableError(err) {
				if attempt == 1 {
					r.cfg.Budget.Deposit()
				}
				return err
			}
			if attempt >= r.cfg.MaxAttempts {
				return err
			}
			switch werr := c.wait(ctx, retryInfo(err)); {
			case errors.Is(werr, ErrRetryBudgetExhausted):
				return fmt.Errorf("%w: %w", werr, err)
			case werr != nil:
				return err
			}
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
		}
	}
}

// errRateLimitedGRPC is ErrRateLimited as the gRPC interceptor returns
// it: also a RESOURCE_EXHAUSTED status.
var errRateLimitedGRPC = fmt.Errorf("%w (%w)", ErrRateLimited, status.Error(codes.ResourceExhausted, "outgoing rate limit"))

// grpcPaceError gives a pacing failure a gRPC status: RESOURCE_EXHAUSTED
// for an empty bucket, the context's code for a wait cut short.
func grpcPaceError(err error) error {
	if errors.Is(err, ErrRateLimited) {
		return errRateLimitedGRPC
	}
	return status.FromContextError(err).Err()
}

// RoundTripper returns an http.RoundTripper that retries through next
// (http.DefaultTransport if nil). Only requests whose body can be
// replayed (no body, or GetBody set, as http.NewRequest does for byte
// and string readers) are retried, and only idempotent methods unless
// RetryAnyMethod is set. A retry discards the previous response after
// reading at most 64 KiB of its body.
func (r *Retrier) RoundTripper(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return roundTripper{r: r, next: next}
}

type roundTripper struct {
	r    *Retrier
	next http.RoundTripper
}

func (t roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	cfg := &t.r.cfg
	ctx := req.Context()
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	canRetry := replayable && (cfg.RetryAnyMethod || idempotent(req))
	c := call{r: t.r, bo: cfg.Backoff}
	defer c.stop()
	for attempt := 1; ; attempt++ {
		if err := c.pace(ctx); err != nil {
			if attempt == 1 && req.Body != nil {
				req.Body.Close()
			}
			return nil, err
		}
		areq := req
		if attempt > 1 && req.GetBody != nil {
			body, err := req.GetBody()
			if err != nil {
				return nil, fmt.Errorf("client: replaying request body: %w", err)
			}
			areq = req.Clone(ctx)
			areq.Body = body
		}
		resp, err := t.next.RoundTrip(areq)
		if !cfg.RetryableResponse(resp, err) {
			if attempt == 1 {
				cfg.Budget.Deposit()
			}
			return resp, err
		}
		if !canRetry || attempt >= cfg.MaxAttempts {
			return resp, err
		}
		var hint time.Duration
		if resp != nil {
			hint = retryAfterHeader(resp.Header.Get("Retry-After"), time.Now())
		}
		if werr := c.wait(ctx, hint); werr != nil {
			if errors.Is(werr, ErrRetryBudgetExhausted) {
				discard(resp)
				if err != nil {
					return nil, fmt.Errorf("%w: %w", werr, err)
				}
				return nil, fmt.Errorf("%w: %s %s: %s", werr, req.Method, req.URL.Redacted(), resp.Status)
			}
			return resp, err
		}
		discard(resp)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
}

// call is the state of one call's retries.
type call struct {
	r     *Retrier
	bo    Backoff
	timer *time.Timer
}

// pace takes a token from the outgoing bucket, if any.
func (c *call) pace(ctx context.Context) error {
	b := c.r.cfg.Bucket
	if b == nil {
		return nil
	}
	if c.r.cfg.FailFast {
		if !b.Allow() {
			return ErrRateLimited
		}
		return nil
	}
	return b.Wait(ctx)
}

// wait decides whether to retry and sleeps before it. It returns
// ErrRetryBudgetExhausted when the budget refuses, errDeadline when the
// delay would outlast ctx, and nil after sleeping or when ctx ended
// during the sleep (the caller checks ctx).
func (c *call) wait(ctx context.Context, hint time.Duration) error {
	d := c.bo.Next(hint)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return errDeadline
	}
	if !c.r.cfg.Budget.Withdraw() {
		return ErrRetryBudgetExhausted
	}
	if c.timer == nil {
		c.timer = time.NewTimer(d)
	} else {
		c.timer.Reset(d)
	}
	select {
	case <-ctx.Done():
	case <-c.timer.C:
	}
	return nil
}

func (c *call) stop() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

var errDeadline = errors.New("client: retry delay outlasts the deadline")

// retryInfo returns the delay of a google.rpc.RetryInfo detail in err's
// status, or zero.
func retryInfo(err error) time.Duration {
	s, _ := status.FromError(err)
	for _, d := range s.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return max(ri.GetRetryDelay().AsDuration(), 0)
		}
	}
	return 0
}

// retryAfterHeader parses an HTTP Retry-After value: delay-seconds or an
// HTTP-date. Anything else is zero.
func retryAfterHeader(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0)
	}
	return 0
}

func idempotent(req *http.Request) bool {
	switch req.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, k1 := req.Header["Idempotency-Key"]
	_, k2 := req.Header["X-Idempotency-Key"]
	return k1 || k2
}

// discard drains a little of a response body, so the connection can be
// reused, and closes it.
func discard(resp *http.Response) {
	if resp == nil {
		return
	}
	io.CopyN(io.Discard, resp.Body, 64<<10)
	resp.Body.Close()
}
