package store

import (
	"math"
	"math/bits"
	"time"
)

// Sliding-window state: "at most limit in any window of length T ending
// now", counted conservatively in G buckets of T/G aligned to the Unix
// epoch. Word has two forms, told apart by its top bit:
//
//   - Counts (top bit clear): the newest bucket's index since the epoch
//     modulo 2^31 in bits 62–32 (compared modulo 2^31: exact for gaps
//     under 2^30 buckets, 4.25 years at the shortest bucket), and in the
//     low 32 bits one field of bw bits per bucket for the G+1 newest
//     buckets, the newest in the lowest bits. A take at bucket n counts
//     every hit of buckets n-G..n; the window (now-T, now] lies within
//     them, so no window of length T ever holds more than limit. The
//     price is that a hit stays counted until its bucket has left the
//     window entirely: between T and T+T/G after it was taken. Every
//     counts state holds at most limit in total, so no field overflows
//     and the low half is never all ones (see Tombstone); except at a
//     limit of 0, whose charges mark their buckets (a field of one bit
//     each: G+1 = 9 bits, never all of the low half).
//   - Debt (top bit set), left by a charge past the limit: bits 62–32
//     hold the index of a bucket b modulo 2^31, the low 32 bits a debt
//     D ≥ 1. The window counts its whole limit N, all in bucket b (a
//     charge that overflows moves what the window held into its own
//     bucket: conservative, it frees no earlier than the exact counts
//     would), and D more units wait. Each time the window's N leave (G+1
//     buckets later), min(D, N) of the debt enters in their place, so
//     nothing is granted until the debt is repaid, and the window never
//     admits more than N per T + T/G. D is bounded (slidingDebtBound) so
//     that its repayment ends within 2^30 buckets, where indexes modulo
//     2^31 are still exact.
//
// Zero (no count) is the fresh state. High is 0.

// MaxSlidingWindowLimit is the largest limit a sliding window holds: its
// counts share a 64-bit word with the newest bucket's index.
const MaxSlidingWindowLimit = 1<<16 - 1

const (
	debtBit  = 1 << 63
	indexMod = 1 << 31 // bucket indexes are kept modulo indexMod
	lowMask  = 1<<32 - 1
	// maxSlidingDebt bounds a sliding window's debt below 2^32-1, so a
	// debt state's low half is never all ones.
	maxSlidingDebt = 1<<32 - 2
)

// slidingDebtBound is the most debt r's states hold: maxSlidingDebt, or
// less when the limit is so small that the repayment would not end within
// 2^30 buckets (a debt is repaid N per G+1 buckets). It is at least 2^26
// times the limit: years of repayment.
func slidingDebtBound(r *Rule) uint64 {
	return min(maxSlidingDebt, r.limit*((indexMod/2-1)/(r.g+1)-1))
}

// bucketIndex returns the absolute bucket index whose value modulo
// indexMod is x, the nearest to j (within 2^30 buckets before or after).
func bucketIndex(x, j uint64) uint64 {
	d := int64((j-x)<<33) >> 33 // j - x as a signed 31-bit number
	return j - uint64(d)
}

func packCounts(n, c uint64) uint64 { return n%indexMod<<32 | c }

func packDebt(b, debt uint64) uint64 { return debtBit | b%indexMod<<32 | debt }

// slidingView returns the absolute index of the newest bucket a take at t
// counts in (now's bucket, or the later one counts state s holds if the
// clock stepped back, even with no count left after a refund) and the
// counts of s shifted to it.
func slidingView(s uint64, r *Rule, t uint64) (n, c uint64) {
	j := r.bucketOf(t)
	if s == 0 {
		return j, 0
	}
	x := bucketIndex(s>>32%indexMod, j)
	c = s & lowMask
	switch {
	case x > j:
		return x, c
	case j-x > r.g:
		return j, 0
	}
	return j, c << ((j - x) * r.bw) & r.mask
}

// settle returns state s as of t: a debt state whose debt the window's
// slides have repaid by t's bucket becomes the counts state the
// repayment left (the last part of the debt in the bucket it entered);
// the debt that is left otherwise, from the latest bucket it entered.
// Other states are returned as they are.
func settle(s uint64, r *Rule, t uint64) uint64 {
	if s&debtBit == 0 {
		return s
	}
	j := r.bucketOf(t)
	b := bucketIndex(s>>32%indexMod, j)
	if j < b+r.g+1 {
		return s
	}
	debt, n := s&lowMask, r.limit
	k := (j - b) / (r.g + 1) // slides since b: ≤ 2^30, so k*n < 2^47
	if debt > k*n {
		return packDebt(b+k*(r.g+1), debt-k*n)
	}
	k = (debt + n - 1) / n
	return packCounts(b+k*(r.g+1), debt-(k-1)*n)
}

// debtEnd returns, for a debt state, the bucket b0 in which the last of
// the debt enters the window and how much that is (1..N): from b0 the
// window holds only that, and from b0+G+1 nothing.
func debtEnd(s uint64, r *Rule, j uint64) (b0, last uint64) {
	b := bucketIndex(s>>32%indexMod, j)
	debt, n := s&lowMask, r.limit
	k := (debt + n - 1) / n
	return b + k*(r.g+1), debt - (k-1)*n
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
// at most the limit and no debt is owed; cost 0 checks, and is allowed
// iff no debt is owed and the counts are at most the limit (a full
// window, or a limit of 0 with nothing counted, allows it; Check of 1
// asks whether one more unit fits). An allowed hit adds cost to now's
// bucket; a denied hit consumes nothing.
// ResetAfter is the time until Remaining next grows: the oldest bucket
// still counting leaves the window, or the debt's last part enters it; 0
// when nothing counts. A denied hit may retry when enough buckets have
// left (and the debt has been repaid) for cost to fit, exact to the
// bucket, or Never if cost exceeds the limit. If the clock steps back,
// hits keep counting in the later bucket the state holds.
func TakeSliding(s State, r *Rule, now int64, cost uint64) (State, Decision) {
	t := clampNow(now)
	st := settle(s.Word, r, t)
	d := Decision{Limit: r.limit}
	if st&debtBit != 0 {
		b0, last := debtEnd(st, r, r.bucketOf(t))
		switch {
		case cost > r.limit:
			d.RetryAfter = Never
		case last+cost <= r.limit:
			d.RetryAfter = slidingAt(r, b0, t)
		default:
			d.RetryAfter = slidingAt(r, b0+r.g+1, t)
		}
		if last < r.limit {
			d.ResetAfter = slidingAt(r, b0, t)
		} else {
			d.ResetAfter = slidingAt(r, b0+r.g+1, t)
		}
		return s, d
	}
	n, c := slidingView(st, r, t)
	used := slidingSum(c, r)
	switch {
	case used <= r.limit && cost <= r.limit-used:
		d.Allowed = true
		if cost > 0 {
			c += cost
			used += cost
			s = State{Word: packCounts(n, c)}
		}
	case cost > r.limit:
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

// chargeSliding records cost that does not fit: the window becomes full
// in now's bucket and the rest is debt (added to a debt already owed), up
// to slidingDebtBound. A limit of 0, which never repays a debt, marks
// now's bucket as used instead (its count field is one bit wide).
func chargeSliding(s State, r *Rule, now int64, cost uint64) State {
	if cost == 0 {
		return s
	}
	t := clampNow(now)
	st := settle(s.Word, r, t)
	if r.limit == 0 {
		n, c := slidingView(st, r, t)
		return State{Word: packCounts(n, c|1)}
	}
	if st&debtBit != 0 {
		debt := st & lowMask
		return State{Word: st + min(cost, slidingDebtBound(r)-debt)}
	}
	// (Charge calls it when cost does not fit what is left.)
	n, c := slidingView(st, r, t)
	left := r.limit - slidingSum(c, r)
	return State{Word: packDebt(n, min(cost-left, slidingDebtBound(r)))}
}

// refundSliding gives cost back: off the debt first, then off the counts
// from the oldest bucket on (the refunded units were counted no later
// than that, so the window frees no earlier than it exactly would).
func refundSliding(s State, r *Rule, now int64, cost uint64) State {
	t := clampNow(now)
	st := settle(s.Word, r, t)
	if st&debtBit != 0 {
		debt := st & lowMask
		if cost < debt {
			return State{Word: st - cost}
		}
		// The window's N, in bucket b, less what the debt did not cover.
		b := bucketIndex(st>>32%indexMod, r.bucketOf(t))
		return State{Word: packCounts(b, r.limit-min(r.limit, cost-debt))}
	}
	n, c := slidingView(st, r, t)
	if c == 0 {
		return s
	}
	m := uint64(1)<<r.bw - 1
	for i := r.g + 1; i > 0 && cost > 0; i-- {
		shift := (i - 1) * r.bw
		x := min(c>>shift&m, cost)
		c -= x << shift
		cost -= x
	}
	return State{Word: packCounts(n, c)}
}

// rollbackSliding rolls back an allowed take of cost that left the state
// after: its bucket's count drops by cost (at most to 0) while that bucket
// is still in the window s holds. Counts are sums: never more capacity
// than without the take. A debt charged since is reduced instead, as a
// refund would (the take's units are among the window's N).
func rollbackSliding(s, after State, r *Rule, now int64, cost uint64) State {
	if cost > r.limit {
		return s
	}
	if s.Word&debtBit != 0 {
		return refundSliding(s, r, now, cost)
	}
	d := int64((s.Word>>32-after.Word>>32)<<33) >> 33 // buckets since the take's
	if s.Word&lowMask == 0 || d < 0 || uint64(d) > r.g {
		return s
	}
	shift := uint64(d) * r.bw
	v := s.Word >> shift & (1<<r.bw - 1)
	return State{Word: s.Word - min(cost, v)<<shift}
}

// saturateSliding consumes what is left of the window, up to cost.
func saturateSliding(s State, r *Rule, now int64, cost uint64) State {
	t := clampNow(now)
	st := settle(s.Word, r, t)
	if st&debtBit != 0 || cost == 0 {
		return s
	}
	n, c := slidingView(st, r, t)
	used := slidingSum(c, r)
	if used >= r.limit {
		return s
	}
	return State{Word: packCounts(n, c+min(cost, r.limit-used))}
}

// freshSliding reports whether s holds no count and no debt still in the
// window at now (or later), and no bucket after now's (which a backwards
// clock would keep counting in).
func freshSliding(s State, r *Rule, now int64) bool {
	t := clampNow(now)
	st := settle(s.Word, r, t)
	if st == 0 {
		return true
	}
	if st&debtBit != 0 {
		return false
	}
	j := r.bucketOf(t)
	x := bucketIndex(st>>32%indexMod, j)
	return x <= j && (st&lowMask == 0 || j-x > r.g)
}
