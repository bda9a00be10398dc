// Package loadgen drives load at an Envoy rate-limit service (RLS v3) and
// measures it, for `sluice bench`.
//
// The generator is built to cost little CPU, so that on a small machine it
// measures the server rather than itself: requests are marshalled once
// before the run and sent as raw bytes, replies are scanned for their
// overall code without being decoded, and every worker records into its
// own histogram, merged at the end. Closed-loop runs keep Concurrency
// requests outstanding; open-loop runs (Rate > 0) send on a fixed
// schedule and measure latency from each request's intended send time, so
// a server that stalls is charged for the requests it delayed.
//
// RunRLQS simulates a fleet of Envoys on RLQS streams (`sluice bench
// --rlqs`): each proxy steps through time, enforcing its assignments as
// Envoy's rate_limit_quota filter does and reporting its usage, and each
// second of the run is compared with the max-min fair shares of the limit.
//
// Noop is an RLS server that answers OK without doing anything: the floor
// that gRPC-go itself sets on a machine.
package loadgen
