package store

import (
	"math"
	"math/bits"
	"time"
)

// Token-bucket state: Word is the theoretical arrival time (TAT) in
// quanta since the Unix epoch, GCRA style: the instant at which the bucket
// is full again. Zero (and any TAT at or before now) is a full bucket. A
// take of n tokens moves the TAT n*k quanta later, starting from now if
// the bucket was full; the bucket holds burst tokens' worth of debt, tol
// quanta. A charge may move the TAT further: past tol, the overshoot is
// debt that refills repay before a token is granted again.
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
// Bounds. nowCeil ≤ now < 2^63. An allowed take leaves TAT ≤ nowCeil +
// tol ≤ 2^63 + 2^62; a charge leaves TAT ≤ nowCeil + tol + MaxDebt <
// 2^63 + 2^62 + 2^61, far from 2^64, so no sum wraps (the tests compare
// TAT − nowFloor against tol − cost*k, never form TAT + cost*k) and no
// state reaches Tombstone. MaxDebt quanta are at least 73 years of refill
// (a quantum is at least a nanosecond): debt beyond it is forgiven.

// MaxDebt bounds the debt a charge leaves a token bucket beyond its
// capacity, in quanta: at least 73 years of refill.
const MaxDebt = 1 << 61

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
// for a bucket not full, the debt after the take is at most the capacity;
// cost 0 checks, and is allowed iff the bucket is not in debt past empty
// (an empty bucket allows it; Check of 1 asks for a token). An allowed hit
// consumes cost tokens; a denied hit consumes nothing. RetryAfter is the
// exact time until cost tokens exist (for a check, until the bucket is no
// longer past empty), or Never if cost exceeds the burst. A clock that steps back makes the bucket look
// emptier for a while: the TAT is never lowered.
func TakeTokens(s State, r *Rule, now int64, cost uint64) (State, Decision) {
	t := clampNow(now)
	nowF, nowC := quanta(r, t)
	d := Decision{Limit: r.burst}
	tat := s.Word
	switch {
	case cost > r.burst:
		d.RetryAfter = Never
	case tat <= nowF:
		// cost*k ≤ tol: the take fits in a full bucket. Anchoring at
		// nowCeil keeps the refill from starting before now.
		d.Allowed = true
		if cost > 0 {
			tat = nowC + cost*r.k
		}
	case tat-nowF <= r.tol-cost*r.k:
		d.Allowed = true
		tat += cost * r.k
	default:
		// The earliest quantum q with tat + cost*k - q ≤ tol; q > nowF,
		// so RetryAfter ≥ 1ns.
		d.RetryAfter = until(r, t, tat-(r.tol-cost*r.k))
	}
	fillTokens(&d, tat, r, t, nowF)
	return State{Word: tat}, d
}

// fillTokens sets the Remaining and ResetAfter of the bucket whose TAT is
// tat.
func fillTokens(d *Decision, tat uint64, r *Rule, now, nowF uint64) {
	if tat <= nowF {
		d.Remaining = r.burst
		return
	}
	if debt := tat - nowF; debt < r.tol {
		d.Remaining = (r.tol - debt) / r.k
	}
	d.ResetAfter = until(r, now, tat)
}

// costQuanta is cost tokens in quanta, saturating at the capacity plus
// MaxDebt.
func costQuanta(r *Rule, cost uint64) uint64 {
	hi, lo := bits.Mul64(cost, r.k)
	if hi != 0 || lo > r.tol+MaxDebt {
		return r.tol + MaxDebt
	}
	return lo
}

// chargeTokens takes cost tokens whatever the bucket holds: the TAT moves
// cost*k later (from nowCeil if the bucket was full), at most to nowCeil
// + tol + MaxDebt, and never earlier than it was.
func chargeTokens(s State, r *Rule, now int64, cost uint64) State {
	nowF, nowC := quanta(r, clampNow(now))
	base := s.Word
	if base <= nowF {
		base = nowC
	}
	if bound := nowC + r.tol + MaxDebt; base < bound {
		return State{Word: base + min(costQuanta(r, cost), bound-base)}
	}
	return s
}

// refundTokens puts cost tokens back: the TAT moves cost*k earlier, and a
// bucket that would hold more than its burst is full (the fresh state).
func refundTokens(s State, r *Rule, now int64, cost uint64) State {
	nowF, _ := quanta(r, clampNow(now))
	if s.Word <= nowF {
		return s // full already
	}
	if hi, q := bits.Mul64(cost, r.k); hi == 0 && q < s.Word-nowF {
		return State{Word: s.Word - q}
	}
	return State{}
}

// rollbackTokens rolls back an allowed take of cost that left the TAT at
// after, at now, the time of the rollback. Only what the take still owes
// goes back: the part of its cost*k quanta that lies after now. The tokens
// of that take that have refilled since were available to everyone in the
// meantime; returning them too would grant them twice (a caller that took
// from a bucket refilled past this take, or stacked behind it, would find
// its own debt erased). Reading now late only shrinks the refund.
//
// Other hits only move the TAT later (or re-anchor it past after, when
// the bucket had refilled entirely, in which case nothing is owed), so
// the result is never earlier than the state before the take. (A refund
// in between may have moved it earlier: then the rollback gives back at
// most what is owed after now, never below a full bucket.)
func rollbackTokens(s, after State, r *Rule, now int64, cost uint64) State {
	if cost > r.burst {
		return s // never taken
	}
	_, nowC := quanta(r, clampNow(now))
	if after.Word <= nowC {
		return s // all of it has refilled
	}
	if owed := min(cost*r.k, after.Word-nowC); owed < s.Word {
		return State{Word: s.Word - owed}
	}
	return State{}
}

// saturateTokens consumes what is left of the bucket, up to cost: the TAT
// moves cost*k later, but never beyond a debt of the full capacity at
// nowCeil, and never earlier than it was.
func saturateTokens(s State, r *Rule, now int64, cost uint64) State {
	nowF, nowC := quanta(r, clampNow(now))
	base := s.Word
	if base <= nowF {
		base = nowC
	}
	if bound := nowC + r.tol; base < bound {
		return State{Word: base + min(costQuanta(r, min(cost, r.burst)), bound-base)}
	}
	return s
}

// freshTokens reports whether the bucket in state s is full at now.
func freshTokens(s State, r *Rule, now int64) bool {
	nowF, _ := quanta(r, clampNow(now))
	return s.Word <= nowF
}
