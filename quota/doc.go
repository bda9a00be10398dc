// Package quota is the policy of Envoy's Rate Limit Quota Service (RLQS):
// Envoy proxies keep a stream open, report per bucket how many requests
// they allowed and denied, and are assigned a share of each global limit
// that they enforce locally.
//
// A Service holds the buckets that streams subscribe to by reporting them,
// matches each bucket id to a rule of the current limits table
// (config.Table.MatchBucket), and groups the buckets whose rule and counter
// key are the same: one group shares one limit L. Every interval Tick
// computes each proxy's share of L from the demands reported (allowed +
// denied per period) over its last reports (DemandOf), by what each is
// expected to use of a share (Divider: max-min fairly, as FairShares, for
// steady demand), after holding back a small reserve for proxies that
// just appeared. The shares may sum above L, up to Options.Overcommit
// times it, as far as the proxies leave them unused in turn. Tick queues
// an assignment for a stream only when its share moved by more than a
// threshold or its last assignment nears its time to live. With a Fleet
// (Redis), replicas publish their proxies' demands once per interval and
// each claims, atomically, its part of L: its proxies' expected usages at
// the water level of L over the whole fleet, at most what the others do
// not hold. Each group's claim stands alone (one that fails costs only its
// group), and at most MaxClaims groups are claimed an interval, however
// many buckets clients invent.
//
// What clients can make a Service hold is capped: streams (MaxStreams),
// buckets (MaxBuckets, MaxBucketsPerStream) and keys per bucket id
// (config.MaxBucketKeys); past a cap the stream ends with an error
// wrapping ErrExhausted. Before the first limits table is in force no
// bucket is answered, so that Envoy applies its no_assignment_behavior.
//
// Time is a parameter: Report and Tick take now, so tests walk a fake
// clock. The Service does no I/O itself besides calling its Fleet, speaks
// no protobuf (server/ translates Actions into Envoy's messages), and
// starts no goroutines: cmd/sluice calls Run, which recovers a panic in
// Tick. docs/RLQS.md describes the behaviour for users.
package quota
