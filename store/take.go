package store

import "math"

// Tombstone is a state no algorithm ever produces: a fixed-window count
// never exceeds MaxFixedWindowLimit (< 2^32-1, so the low half is never
// all ones), a sliding window's counts sum to at most its limit (so its
// fields are never all ones) and a token bucket's TAT stays below 2^63 +
// 2^62 + 1. Stores use it to mark a state as removed.
const Tombstone uint64 = math.MaxUint64

// clampNow treats instants before the Unix epoch as the epoch.
func clampNow(now int64) uint64 {
	if now < 0 {
		return 0
	}
	return uint64(now)
}

// Take applies cost at now (Unix nanoseconds) to state s by the rule's
// algorithm (TakeWindow, TakeTokens or TakeSliding). The zero state is
// fresh.
func Take(s uint64, r *Rule, now int64, cost uint64) (uint64, Decision) {
	switch r.alg {
	case TokenBucket:
		return TakeTokens(s, r, now, cost)
	case SlidingWindow:
		return TakeSliding(s, r, now, cost)
	}
	return TakeWindow(s, r, now, cost)
}

// Refund rolls back an allowed Take of cost that left the state after,
// given the state s as it is at now, the time of the rollback (read after
// every take the rollback might undo, so that no concurrent take used a
// later instant). Other takes may have changed the state since. It never
// leaves more capacity than the state would have without that take.
func Refund(s, after uint64, r *Rule, now int64, cost uint64) uint64 {
	switch r.alg {
	case TokenBucket:
		return refundTokens(s, after, r, now, cost)
	case SlidingWindow:
		return refundSliding(s, after, r, cost)
	}
	return refundWindow(s, after, r, cost)
}

// Saturate is Take for a hit that is charged even when denied: if cost
// does not fit, it consumes what is left (up to cost) and reports the
// denial as seen from the drained state.
func Saturate(s uint64, r *Rule, now int64, cost uint64) (uint64, Decision) {
	n, d := Take(s, r, now, cost)
	if d.Allowed {
		return n, d
	}
	switch r.alg {
	case TokenBucket:
		n = saturateTokens(s, r, now, cost)
	case SlidingWindow:
		n = saturateSliding(s, r, now, cost)
	default:
		n = saturateWindow(s, r, now, cost)
	}
	_, d = Take(n, r, now, cost)
	return n, d
}

// Fresh reports whether state s at now equals the fresh state: a lapsed
// or empty window, a full bucket. Dropping a fresh state changes no
// decision at now or later.
func Fresh(s uint64, r *Rule, now int64) bool {
	switch r.alg {
	case TokenBucket:
		return freshTokens(s, r, now)
	case SlidingWindow:
		return freshSliding(s, r, now)
	}
	return freshWindow(s, now)
}
