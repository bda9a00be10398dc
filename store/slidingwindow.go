package store

import (
	"math"
	"math/bits"
	"time"
)

// Sliding-window state: "at most limit in any window of length T ending
// now", counted conservatively in G buckets of T/G aligned to the Unix
// epoch. The state keeps the counts of the G+1 newest buckets: the newest
// bucket's index since the epoch modulo 2^32 in the high 32 bits (compared
// modulo 2^32, as a fixed window's end), and in the low 32 bits one field
// of bw bits per bucket, the newest in the lowest bits. A take at bucket n
// counts every hit of buckets n-G..n; the window (now-T, now] lies within
// them, so no window of length T ever holds more than limit. The price is
// that a hit stays counted until its bucket has left the window entirely:
// between T and T+T/G after it was taken. Zero (no count) is the fresh
// state. Every allowed state holds at most limit in total, so no field
// overflows and no state is all ones (see Tombstone).

// MaxSlidingWindowLimit is the largest limit a sliding window holds: its
// counts share a 64-bit word with the newest bucket's index.
const MaxSlidingWindowLimit = 1<<16 - 1

// slidingView returns the absolute index of the newest bucket a take at t
// counts in (now's bucket, or the later one s holds if the clock stepped
// back, even with no count left after a refund) and the counts of s
// shifted to it.
func slidingView(s uint64, r *Rule, t uint64) (n, c uint64) {
	j := r.bucketOf(t)
	if s == 0 {
		return j, 0
	}
	c = s & 0xffffffff
	d := int32(uint32(j) - uint32(s>>32))
	switch {
	case d < 0:
		return j + uint64(-int64(d)), c
	case uint64(d) > r.g:
		return j, 0
	}
	return j, c << (uint64(d) * r.bw) & r.mask
}

// slidingSum is the total of the counts c.
func slidingSum(c uint64, r *Rule) uint64 {
	m := uint64(1)<<r.bw - 1
	sum := uint64(0)
	for ; c != 0; c >>= r.bw {
		sum += c & m
	}
	return sum
}

// bucketOf returns the index of the bucket holding t: since the epoch, or
// for a calendar rule G per period since the calendar's first.
func (r *Rule) bucketOf(t uint64) uint64 {
	if r.cal == nil {
		return t / r.bucket
	}
	p := r.cal.span(int64(t))
	return uint64(p.k)*r.g + (t-uint64(p.b0))*r.g/uint64(p.length)
}

// bucketStart returns the Unix nanoseconds at which bucket i starts, for a
// bucket after t's; false if that is past 2^64-1 ns (or, for a calendar
// rule, past 2262).
func (r *Rule) bucketStart(i, t uint64) (uint64, bool) {
	if r.cal == nil {
		hi, lo := bits.Mul64(i, r.bucket)
		return lo, hi == 0
	}
	p := r.cal.span(int64(t))
	k, j := int64(i/r.g), i%r.g
	var b0, l int64
	switch k - p.k {
	case 0:
		b0, l = p.b0, p.length
	case 1:
		b0, l = p.b1, p.length1
	case 2:
		if j == 0 { // where a take's last bucket leaves the window
			return uint64(p.b2), p.b2 != math.MaxInt64
		}
		fallthrough
	default:
		b0 = r.cal.start(k)
		b1 := r.cal.start(k + 1)
		if b1 == math.MaxInt64 {
			return 0, false
		}
		l = b1 - b0
	}
	if b0+l == math.MaxInt64 {
		return 0, false
	}
	// ceil(j·L/G): a bucket holds every t with floor((t-b0)·G/L) = j.
	return uint64(b0 + int64((j*uint64(l)+r.g-1)/r.g)), true
}

// SlidingBucket returns the index of the bucket a take at now (Unix
// nanoseconds; earlier instants count as the epoch) counts in, and the
// time from now until that bucket leaves the window (saturating at
// Never): for stores that run the algorithm elsewhere.
func (r *Rule) SlidingBucket(now int64) (index uint64, leaves time.Duration) {
	t := clampNow(now)
	index = r.bucketOf(t)
	return index, slidingAt(r, index+r.g+1, t)
}

// slidingAt is the time from t until bucket i starts (i is after t's
// bucket), saturating at Never.
func slidingAt(r *Rule, i, t uint64) time.Duration {
	start, ok := r.bucketStart(i, t)
	switch {
	case !ok || start > t && start-t >= uint64(Never):
		return Never
	case start <= t:
		return 0
	}
	return time.Duration(start - t)
}

// TakeSliding applies cost at now (Unix nanoseconds) to the sliding window
// whose state is s, returning the new state and the decision.
//
// The hit is allowed iff the counts of the last G+1 buckets plus cost are
// at most the limit (a limit of 0 denies everything, checks included). An
// allowed hit adds cost to now's bucket; a denied hit consumes nothing;
// cost 0 checks without consuming. ResetAfter is the time until the
// oldest bucket still counting leaves the window (when Remaining next
// grows), 0 when nothing counts. A denied hit may retry when enough
// buckets have left for cost to fit (exact to the bucket), or Never if
// cost exceeds the limit. If the clock steps back, hits keep counting in
// the later bucket the state holds.
func TakeSliding(s uint64, r *Rule, now int64, cost uint64) (uint64, Decision) {
	t := clampNow(now)
	n, c := slidingView(s, r, t)
	used := slidingSum(c, r)
	d := Decision{Limit: r.limit}
	switch {
	case r.limit > 0 && used <= r.limit && cost <= r.limit-used:
		d.Allowed = true
		if cost > 0 {
			c += cost
			used += cost
			s = uint64(uint32(n))<<32 | c
		}
	case r.limit == 0 || cost > r.limit:
		d.RetryAfter = Never
	default:
		// The first bucket boundary after which the buckets still in
		// the window leave room for cost.
		m := uint64(1)
		for left := used; ; m++ {
			left -= c >> ((r.g + 1 - m) * r.bw) & (1<<r.bw - 1)
			if left+cost <= r.limit {
				break
			}
		}
		d.RetryAfter = slidingAt(r, n+m, t)
	}
	if used < r.limit {
		d.Remaining = r.limit - used
	}
	if c != 0 {
		// The oldest bucket that counts leaves G+1 buckets after it.
		oldest := uint64(bits.Len64(c)-1) / r.bw
		d.ResetAfter = slidingAt(r, n+r.g+1-oldest, t)
	}
	return s, d
}

// refundSliding rolls back an allowed take of cost that left the state
// after: its bucket's count drops by cost (at most to 0) while that bucket
// is still in the window s holds. Counts are sums: never more capacity
// than without the take.
func refundSliding(s, after uint64, r *Rule, cost uint64) uint64 {
	d := int32(uint32(s>>32) - uint32(after>>32))
	if cost > r.limit || s&0xffffffff == 0 || d < 0 || uint64(d) > r.g {
		return s
	}
	shift := uint64(d) * r.bw
	v := s >> shift & (1<<r.bw - 1)
	return s - min(cost, v)<<shift
}

// saturateSliding consumes what is left of the window, up to cost.
func saturateSliding(s uint64, r *Rule, now int64, cost uint64) uint64 {
	n, c := slidingView(s, r, clampNow(now))
	used := slidingSum(c, r)
	if used >= r.limit || cost == 0 {
		return s
	}
	return uint64(uint32(n))<<32 | (c + min(cost, r.limit-used))
}

// freshSliding reports whether s holds no count still in the window at
// now (or later) and no bucket after now's (which a backwards clock would
// keep counting in).
func freshSliding(s uint64, r *Rule, now int64) bool {
	d := int32(uint32(r.bucketOf(clampNow(now))) - uint32(s>>32))
	return s == 0 || d >= 0 && (s&0xffffffff == 0 || uint64(d) > r.g)
}
