package store

import "time"

// Fixed-window state: the window's end in Unix seconds in the high 32 bits,
// the count of that window in the low 32 bits. Zero is the fresh state (a
// window that ended in 1970). The end is compared modulo 2^32, which is
// exact until 2106-02-07, and the count never exceeds MaxFixedWindowLimit,
// so the low half is never all ones (see Tombstone).

const nsPerSec = uint64(time.Second)

// windowEnd returns the end, in Unix seconds, of the window holding now:
// a multiple of the window since the epoch, or the end of the calendar
// period (always a whole second).
func windowEnd(r *Rule, now uint64) uint64 {
	if r.cal != nil {
		return uint64(r.cal.span(int64(now)).b1) / nsPerSec
	}
	w := uint64(r.period / time.Second)
	return (now/nsPerSec/w + 1) * w
}

// WindowEnd returns the end, in Unix seconds, of the fixed window holding
// now (Unix nanoseconds; earlier instants count as the epoch), as
// TakeWindow counts it: for stores that run the algorithm elsewhere.
func (r *Rule) WindowEnd(now int64) uint64 { return windowEnd(r, clampNow(now)) }

// currentWindow returns the end of the window a take at now counts in:
// the window holding now, or the later window s holds if the clock has
// stepped back since (so a backwards step never reopens an older window
// and forgets the newer one's count).
func currentWindow(s uint64, r *Rule, now uint64) uint64 {
	// Stored ends are window ends, and windows tile time: one after now
	// is now's window or a later one, found without dividing.
	if end := s >> 32; end > now/nsPerSec {
		return end
	}
	return windowEnd(r, now)
}

// windowCount is the count s holds for the window ending at end.
func windowCount(s, end uint64) uint64 {
	if uint32(s>>32) != uint32(end) {
		return 0
	}
	return s & 0xffffffff
}

func packWindow(end, count uint64) uint64 { return end<<32 | count }

// TakeWindow applies cost at now (Unix nanoseconds) to the fixed window
// whose state is s, returning the new state and the decision.
//
// The hit is allowed iff the window's count plus cost is at most the
// limit (a limit of 0 denies everything, checks included). An allowed hit
// adds cost to the count; a denied hit consumes nothing. Cost 0 checks
// without consuming. ResetAfter is the time until the window ends, never
// 0; a denied hit may retry when the window ends, or Never if cost exceeds
// the limit. If the clock steps back into an earlier window, hits keep
// counting in the later window the state holds.
func TakeWindow(s uint64, r *Rule, now int64, cost uint64) (uint64, Decision) {
	t := clampNow(now)
	end := currentWindow(s, r, t)
	count := windowCount(s, end)
	d := Decision{Limit: r.limit, ResetAfter: time.Duration(end*nsPerSec - t)}
	switch {
	case r.limit > 0 && count <= r.limit && cost <= r.limit-count:
		d.Allowed = true
		if cost > 0 {
			count += cost
			s = packWindow(end, count)
		}
	case r.limit == 0 || cost > r.limit:
		d.RetryAfter = Never
	default:
		d.RetryAfter = d.ResetAfter
	}
	if count < r.limit {
		d.Remaining = r.limit - count
	}
	return s, d
}

// refundWindow rolls back an allowed take of cost that left the state
// after: the count drops by cost if s still holds the window the take
// counted in. If the window has turned since, the take no longer counts
// anywhere and nothing changes. Counts are sums, so taking cost away again
// leaves exactly the count the other hits of that window made: never more
// capacity than without the take.
func refundWindow(s, after uint64, r *Rule, cost uint64) uint64 {
	end := after >> 32
	if s>>32 != end || cost > r.limit {
		return s
	}
	count := s & 0xffffffff
	if cost >= count {
		return packWindow(end, 0)
	}
	return packWindow(end, count-cost)
}

// saturateWindow consumes what is left of the window, up to cost.
func saturateWindow(s uint64, r *Rule, now int64, cost uint64) uint64 {
	end := currentWindow(s, r, clampNow(now))
	count := windowCount(s, end)
	if count >= r.limit || cost == 0 {
		return s
	}
	return packWindow(end, count+min(cost, r.limit-count))
}

// freshWindow reports whether s holds no count for a window still open at
// now (or later).
func freshWindow(s uint64, now int64) bool {
	nowSec := clampNow(now) / nsPerSec
	return s&0xffffffff == 0 || uint64(uint32(s>>32)) <= uint64(uint32(nowSec))
}
