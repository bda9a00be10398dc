// Package tracing exports Sluice's traces with OpenTelemetry: New builds
// the tracer provider (OTLP over gRPC or HTTP, a parent-based ratio
// sampler, the service's resource) and Propagator reads a caller's trace
// context from W3C traceparent or B3 (single or multiple headers), as
// Envoy may send either. Store wraps a store.Store so that each batch it
// takes is a child span of the request's.
//
// The exporters read the standard OTEL_EXPORTER_OTLP_* variables
// (endpoint, headers, TLS, timeout, compression) from the process
// environment themselves; this package does not. server adds the spans of
// each protocol through the trace API alone; cmd/sluice wires the
// provider. With tracing off nothing here runs: no provider, no wrapper.
// docs/TRACING.md describes the spans and their attributes.
package tracing
