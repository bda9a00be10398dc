package store

import (
	"math"
	"math/bits"
	"time"
)

// Token-bucket state: the theoretical arrival time (TAT) in quanta since
// the Unix epoch, GCRA style: the instant at which the bucket is full
// again. Zero (and any TAT at or before now) is a full bucket. A take of n
// tokens moves the TAT n*k quanta later, starting from now if the bucket
// was full; the bucket holds burst tokens' worth of debt, tol quanta.
//
// Rounding. The quantum is Period/(Rate*k) ns exactly, so token amounts
// are exact; only the instant now falls between two quanta. nowFloor and
// nowCeil are the quanta at or before and at or after now. A full bucket
// anchors the new TAT at nowCeil (the refill starts no earlier than the
// take); the debt test uses nowFloor (a TAT integer is within tol of the
// real now iff it is within tol of nowFloor, so this test is exact);
// times are converted back to nanoseconds rounding up. So rounding never
// favours the caller.
//
// Bounds. nowCeil ≤ now < 2^63 and an allowed take leaves TAT ≤ nowCeil +
// tol ≤ 2^63 + 2^62, so TAT + cost*k (cost ≤ burst, cost*k ≤ tol ≤ 2^62)
// never wraps and no state reaches Tombstone.

// quanta converts now (ns) to quanta: floor and ceil of now*rk/period.
// now*rk < 2^63*period, so the 128-bit quotient fits in 64 bits.
func quanta(r *Rule, now uint64) (floor, ceil uint64) {
	if r.rk == uint64(r.period) {
		return now, now // quanta are nanoseconds
	}
	hi, lo := bits.Mul64(now, r.rk)
	q, rem := bits.Div64(hi, lo, uint64(r.period))
	if rem != 0 {
		return q, q + 1
	}
	return q, q
}

// nanos converts quanta to nanoseconds since the epoch, rounding up and
// saturating at MaxUint64.
func nanos(r *Rule, q uint64) uint64 {
	if r.rk == uint64(r.period) {
		return q
	}
	hi, lo := bits.Mul64(q, uint64(r.period))
	if hi >= r.rk {
		return math.MaxUint64
	}
	t, rem := bits.Div64(hi, lo, r.rk)
	if rem != 0 && t < math.MaxUint64 {
		t++
	}
	return t
}

// until is the time from now (ns) until quantum q, at least 0, saturating
// at Never (292 years).
func until(r *Rule, now, q uint64) time.Duration {
	t := nanos(r, q)
	switch {
	case t <= now:
		return 0
	case t-now >= uint64(Never):
		return Never
	}
	return time.Duration(t - now)
}

// TakeTokens applies cost at now (Unix nanoseconds) to the token bucket
// whose state is s, returning the new state and the decision.
//
// The hit is allowed iff cost tokens are in the bucket: cost ≤ burst and,
// for a bucket not full, the debt after the take is at most the capacity.
// An allowed hit consumes cost tokens; a denied hit consumes nothing; cost
// 0 checks without consuming. RetryAfter is the exact time until cost
// tokens exist, or Never if cost exceeds the burst. A clock that steps back
// makes the bucket look emptier for a while: the TAT is never lowered.
func TakeTokens(s uint64, r *Rule, now int64, cost uint64) (uint64, Decision) {
	t := clampNow(now)
	nowF, nowC := quanta(r, t)
	d := Decision{Limit: r.burst}
	full := s <= nowF
	switch {
	case cost > r.burst:
		d.RetryAfter = Never
	case full:
		// cost*k ≤ tol: the take fits in a full bucket. Anchoring at
		// nowCeil keeps the refill from starting before now.
		d.Allowed = true
		if cost > 0 {
			s = nowC + cost*r.k
		}
	case s+cost*r.k-nowF <= r.tol:
		d.Allowed = true
		s += cost * r.k
	default:
		// The earliest quantum q with s + cost*k - q ≤ tol; q > nowF,
		// so RetryAfter ≥ 1ns.
		d.RetryAfter = until(r, t, s+cost*r.k-r.tol)
	}
	fillTokens(&d, s, r, t, nowF)
	return s, d
}

// fillTokens sets the Remaining and ResetAfter of the bucket in state s.
func fillTokens(d *Decision, s uint64, r *Rule, now, nowF uint64) {
	if s <= nowF {
		d.Remaining = r.burst
		return
	}
	if debt := s - nowF; debt < r.tol {
		d.Remaining = (r.tol - debt) / r.k
	}
	d.ResetAfter = until(r, now, s)
}

// refundTokens rolls back an allowed take of cost that left the TAT at
// after, at now, the time of the rollback. Only what the take still owes
// goes back: the part of its cost*k quanta that lies after now. The tokens
// of that take that have refilled since were available to everyone in the
// meantime; returning them too would grant them twice (a caller that took
// from a bucket refilled past this take, or stacked behind it, would find
// its own debt erased). Reading now late only shrinks the refund.
//
// Other takes only move the TAT later (or re-anchor it past after, when
// the bucket had refilled entirely, in which case nothing is owed), so
// the result is never earlier than the state before the take.
func refundTokens(s, after uint64, r *Rule, now int64, cost uint64) uint64 {
	if cost > r.burst {
		return s // never taken
	}
	_, nowC := quanta(r, clampNow(now))
	if after <= nowC {
		return s // all of it has refilled
	}
	if owed := min(cost*r.k, after-nowC); owed < s {
		return s - owed
	}
	return 0
}

// saturateTokens consumes what is left of the bucket, up to cost: the TAT
// moves cost*k later, but never beyond a debt of the full capacity at
// nowCeil, and never earlier than it was.
func saturateTokens(s uint64, r *Rule, now int64, cost uint64) uint64 {
	nowF, nowC := quanta(r, clampNow(now))
	base := s
	if s <= nowF {
		base = nowC
	}
	n := min(base+min(cost, r.burst)*r.k, nowC+r.tol)
	return max(s, n)
}

// freshTokens reports whether the bucket in state s is full at now.
func freshTokens(s uint64, r *Rule, now int64) bool {
	nowF, _ := quanta(r, clampNow(now))
	return s <= nowF
}
