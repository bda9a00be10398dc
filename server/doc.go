// Package server holds Sluice's protocol adapters over a limiter.Limiter:
// Envoy's envoy.service.ratelimit.v3.RateLimitService (RLS), Sluice's own
// sluice.v1.RateLimiter (API), the HTTP endpoints (HTTP: /healthcheck,
// the reference's POST /json, POST /v1/check and its GET peek), the
// counter lookup and reset (Counters: /v1/counters, resets allowed by an
// Authorizer), grpc.health.v1 (Health), and TLS with certificate
// reload (CertReloader). They translate requests and
// answers and map the limiter's errors to gRPC codes and HTTP statuses;
// the policy lives in the limiter.
package server
