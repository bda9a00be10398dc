// Package limiter is the request policy every protocol shares: it takes
// descriptors in protocol-neutral form, matches them against the current
// limits table, applies Envoy's semantics (hits_addend, charges recorded
// whole and refunds, unlimited, replaces, limit overrides, rule and global
// shadow mode, quota mode) and asks the store for every limit of every
// descriptor (a rate_limits rule has several) as one all-or-nothing batch
// at one instant (charges and refunds apply whatever its outcome). It
// returns one status per descriptor, reporting the limit that decided, and
// the overall code.
//
// The hot path allocates nothing: callers reuse Request and Response, and
// the key and hit buffers are pooled. server/ translates Envoy's RLS v3,
// Sluice's own API and HTTP into Requests and nothing else.
package limiter
