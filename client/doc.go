// Package client calls Sluice, enforces its limits in Go servers, and
// retries rate-limited calls without storms.
//
// # Calling Sluice
//
// A Client asks over Envoy's RateLimitService (ShouldRateLimit) or over
// Sluice's own API (Check) and returns plain Go values: per descriptor
// whether it was allowed, the limit, what remains, and the time until the
// limit resets and until a denied request could succeed. Each call has a
// short deadline (DefaultTimeout, 20 ms, like Envoy's filter); when Sluice
// does not answer in time the FailureMode decides (FailAllow by default)
// and Stats counts it.
//
// # Enforcing Sluice in a Go server
//
// UnaryServerInterceptor and StreamServerInterceptor ask Sluice before each
// call, with descriptors built by a function of the full method name and
// the incoming metadata. A denied call fails with RESOURCE_EXHAUSTED
// carrying a google.rpc.RetryInfo detail and the grpc-retry-pushback-ms
// trailer. Limiter adapts the same check to go-grpc-middleware's
// ratelimit.Limiter. HTTPMiddleware answers 429 with Retry-After and sets
// RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset.
//
// # Retrying well
//
// Three pieces, each usable alone and combined by a Retrier into a gRPC
// UnaryClientInterceptor and an http.RoundTripper:
//
//   - Bucket paces a client's own requests with a token bucket (store's
//     exact integer token bucket): 8 per second with a burst of 40 lets a
//     cold client send 40 at once, then one every 125 ms.
//   - Backoff draws delays with decorrelated jitter: uniform in
//     [Base, min(previous × 3, Cap)], with a server's retry-after as a floor.
//   - RetryBudget caps retries at about 10 % of successful first tries,
//     with a banked balance for bursts, so that an outage does not turn
//     every client into a retry storm. A refused retry fails at once with
//     ErrRetryBudgetExhausted.
//
// Which failures are retryable is the caller's choice; by default gRPC
// UNAVAILABLE and RESOURCE_EXHAUSTED and HTTP 429 and 503.
//
// Everything in the package is safe for concurrent use except Backoff,
// which holds one retry sequence. The package starts no goroutines of its
// own (a connection made by Dial runs gRPC's); waits use one timer per
// call, stopped when the call ends.
package client
