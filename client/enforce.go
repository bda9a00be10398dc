package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// PushbackTrailer is the trailer a denied gRPC call carries: the
// retry-after in milliseconds, the name gRPC's own retry policy honours.
const PushbackTrailer = "grpc-retry-pushback-ms"

// ErrOverLimit is wrapped by the Limiter's error for a denied call.
var ErrOverLimit = errors.New("client: over the rate limit")

// GRPCDescriptors builds a gRPC call's descriptors from its full method
// name ("/pkg.Service/Method") and incoming metadata. Returning none lets
// the call through without asking Sluice.
type GRPCDescriptors func(fullMethod string, md metadata.MD) []Descriptor

// HTTPDescriptors builds a request's descriptors. Returning none lets the
// request through without asking Sluice.
type HTTPDescriptors func(r *http.Request) []Descriptor

// Limiter returns an implementation of go-grpc-middleware's
// ratelimit.Limiter that asks Sluice for domain. That package turns any
// error into RESOURCE_EXHAUSTED with the error's text and drops its
// details; UnaryServerInterceptor and StreamServerInterceptor keep the
// retry-after. Use with ratelimit.UnaryServerInterceptor on a server (the
// method comes from grpc.Method(ctx)).
func (c *Client) Limiter(domain string, fn GRPCDescriptors) ratelimit.Limiter {
	return grpcLimiter{c: c, domain: domain, fn: fn}
}

type grpcLimiter struct {
	c      *Client
	domain string
	fn     GRPCDescriptors
}

// Limit implements ratelimit.Limiter.
func (l grpcLimiter) Limit(ctx context.Context) error {
	method, _ := grpc.Method(ctx)
	r, err := l.c.enforceGRPC(ctx, l.domain, l.fn, method)
	switch {
	case r.Allowed:
		return nil
	case err != nil:
		return fmt.Errorf("rate limit service unavailable: %w", err)
	case r.RetryAfter > 0 && r.RetryAfter != Never:
		return fmt.Errorf("%w; retry after %v", ErrOverLimit, r.RetryAfter)
	}
	return ErrOverLimit
}

// UnaryServerInterceptor returns an interceptor that asks Sluice for
// domain before each call with descriptors from fn. A denied call fails
// with RESOURCE_EXHAUSTED, a google.rpc.RetryInfo detail and the
// PushbackTrailer when the retry-after is known. When Sluice does not
// answer and the FailureMode is FailDeny, the call fails with UNAVAILABLE.
func (c *Client) UnaryServerInterceptor(domain string, fn GRPCDescriptors) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		r, err := c.enforceGRPC(ctx, domain, fn, info.FullMethod)
		if r.Allowed {
			return handler(ctx, req)
		}
		if md := pushback(r, err); md != nil {
			grpc.SetTrailer(ctx, md)
		}
		return nil, denial(info.FullMethod, r, err)
	}
}

// StreamServerInterceptor is UnaryServerInterceptor for streams: Sluice
// is asked once, when the stream starts.
func (c *Client) StreamServerInterceptor(domain string, fn GRPCDescriptors) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		r, err := c.enforceGRPC(ss.Context(), domain, fn, info.FullMethod)
		if r.Allowed {
			return handler(srv, ss)
		}
		if md := pushback(r, err); md != nil {
			ss.SetTrailer(md)
		}
		return denial(info.FullMethod, r, err)
	}
}

// enforceGRPC asks Sluice about a call; calls without descriptors pass.
func (c *Client) enforceGRPC(ctx context.Context, domain string, fn GRPCDescriptors, method string) (Result, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	ds := fn(method, md)
	if len(ds) == 0 {
		return Result{Allowed: true}, nil
	}
	return c.decide(ctx, domain, ds)
}

func knownRetryAfter(r Result) bool { return r.RetryAfter > 0 && r.RetryAfter != Never }

func pushback(r Result, err error) metadata.MD {
	if err != nil || !knownRetryAfter(r) {
		return nil
	}
	return metadata.Pairs(PushbackTrailer, strconv.FormatInt(r.RetryAfter.Milliseconds(), 10))
}

func denial(method string, r Result, err error) error {
	if err != nil {
		return status.Errorf(codes.Unavailable, "%s: rate limit service unavailable: %v", method, err)
	}
	s := status.New(codes.ResourceExhausted, method+": over the rate limit")
	if !knownRetryAfter(r) {
		return s.Err()
	}
	ds, derr := s.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryAfter)})
	if derr != nil {
		return s.Err()
	}
	return ds.Err()
}

// HTTPMiddleware returns middleware that asks Sluice for domain before
// each request with descriptors from fn. Answered requests carry
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset (seconds,
// rounded up) of the most restrictive limit; a denied request gets 429
// with Retry-After (seconds, rounded up) when the wait is known. When
// Sluice does not answer and the FailureMode is FailDeny, the answer is
// 503.
func (c *Client) HTTPMiddleware(domain string, fn HTTPDescriptors) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			ds := fn(req)
			if len(ds) == 0 {
				next.ServeHTTP(w, req)
				return
			}
			r, err := c.decide(req.Context(), domain, ds)
			if err == nil && hasLimit(r) {
				h := w.Header()
				h.Set("RateLimit-Limit", strconv.FormatUint(r.Limit, 10))
				h.Set("RateLimit-Remaining", strconv.FormatUint(r.Remaining, 10))
				h.Set("RateLimit-Reset", strconv.FormatInt(ceilSeconds(r.ResetAfter), 10))
			}
			switch {
			case r.Allowed:
				next.ServeHTTP(w, req)
			case err != nil:
				http.Error(w, "rate limit service unavailable", http.StatusServiceUnavailable)
			default:
				if knownRetryAfter(r) {
					w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(r.RetryAfter), 10))
				}
				http.Error(w, "over the rate limit", http.StatusTooManyRequests)
			}
		})
	}
}

func hasLimit(r Result) bool {
	for i := range r.Statuses {
		if r.Statuses[i].Limited {
			return true
		}
	}
	return false
}

// ceilSeconds rounds d up to whole seconds.
func ceilSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return s
}
