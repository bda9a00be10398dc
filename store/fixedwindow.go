package store

import "time"

// Fixed-window state: the window's end in Unix seconds in the high 32 bits
// of Word, the count of that window in its low 32 bits and, for a wide
// rule, the count's higher bits in High. Zero is the fresh state (a window
// that ended in 1970). The end is compared modulo 2^32, which is exact
// until 2106-02-07. A narrow rule's count never exceeds 2^32-2, so its low
// half is never all ones (see Tombstone) and High stays 0; a wide rule's
// never exceeds MaxLimit.
//
// Charges go past the limit: the count then holds the overshoot until the
// window ends, saturating at the rule's bound (2^32-2 for a narrow rule,
// past any narrow limit; MaxLimit for a wide one). A saturated count is no
// longer exact, so rollbacks and refunds leave it alone (it denies until
// the window ends either way). At a limit of exactly MaxLimit nothing
// past the limit is kept: the count stops there and stays exact.

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
func currentWindow(s State, r *Rule, now uint64) uint64 {
	// Stored ends are window ends, and windows tile time: one after now
	// is now's window or a later one, found without dividing.
	if end := s.Word >> 32; end > now/nsPerSec {
		return end
	}
	return windowEnd(r, now)
}

// windowCount is the count s holds for the window ending at end.
func windowCount(s State, end uint64) uint64 {
	if uint32(s.Word>>32) != uint32(end) {
		return 0
	}
	return s.High<<32 | s.Word&0xffffffff
}

func packWindow(end, count uint64) State {
	return State{Word: end<<32 | count&0xffffffff, High: count >> 32}
}

// countBound is the most a count of r's windows holds: 2^32-2 for a
// narrow rule, MaxLimit for a wide one.
func countBound(r *Rule) uint64 {
	if r.wide {
		return MaxLimit
	}
	return MaxFixedWindowLimit + 1
}

// saturated reports whether count, of r's windows, is at the bound past
// the limit, and so no longer exact.
func saturated(count uint64, r *Rule) bool {
	b := countBound(r)
	return count >= b && b > r.limit
}

// TakeWindow applies cost at now (Unix nanoseconds) to the fixed window
// whose state is s, returning the new state and the decision.
//
// The hit is allowed iff the window's count plus cost is at most the
// limit; cost 0 checks, and is allowed iff the count is at most the limit
// (envoyproxy/ratelimit's rule: a check at the limit, or of a limit of 0
// before anything is counted, is allowed; Check of 1 asks whether one
// more request fits). An allowed hit adds cost to the count;
// a denied hit consumes nothing. ResetAfter is the time until the window
// ends, never 0; a denied hit may retry when the window ends, or Never if
// cost exceeds the limit. If the clock steps back into an earlier window,
// hits keep counting in the later window the state holds.
func TakeWindow(s State, r *Rule, now int64, cost uint64) (State, Decision) {
	t := clampNow(now)
	end := currentWindow(s, r, t)
	count := windowCount(s, end)
	d := Decision{Limit: r.limit, ResetAfter: time.Duration(end*nsPerSec - t)}
	switch {
	case count <= r.limit && cost <= r.limit-count:
		d.Allowed = true
		if cost > 0 {
			count += cost
			s = packWindow(end, count)
		}
	case cost > r.limit:
		d.RetryAfter = Never
	default:
		d.RetryAfter = d.ResetAfter
	}
	if count < r.limit {
		d.Remaining = r.limit - count
	}
	return s, d
}

// chargeWindow adds cost to the count of the window holding now (or the
// later one s holds), past the limit, up to the rule's bound.
func chargeWindow(s State, r *Rule, now int64, cost uint64) State {
	end := currentWindow(s, r, clampNow(now))
	count := windowCount(s, end)
	if b := countBound(r); count < b && cost > 0 {
		return packWindow(end, count+min(cost, b-count))
	}
	return s
}

// refundWindow takes cost off the count of the window holding now (or
// the later one s holds), down to 0; a saturated count stays.
func refundWindow(s State, r *Rule, now int64, cost uint64) State {
	end := currentWindow(s, r, clampNow(now))
	count := windowCount(s, end)
	if count == 0 || saturated(count, r) {
		return s
	}
	return packWindow(end, count-min(cost, count))
}

// rollbackWindow rolls back an allowed take of cost that left the state
// after: the count drops by cost if s still holds the window the take
// counted in. If the window has turned since, the take no longer counts
// anywhere and nothing changes. Counts are sums, so taking cost away again
// leaves exactly the count the other hits of that window made: never more
// capacity than without the take (a saturated count stays).
func rollbackWindow(s, after State, r *Rule, cost uint64) State {
	end := after.Word >> 32
	count := s.High<<32 | s.Word&0xffffffff
	if s.Word>>32 != end || cost > r.limit || saturated(count, r) {
		return s
	}
	return packWindow(end, count-min(cost, count))
}

// saturateWindow consumes what is left of the window, up to cost.
func saturateWindow(s State, r *Rule, now int64, cost uint64) State {
	end := currentWindow(s, r, clampNow(now))
	count := windowCount(s, end)
	if count >= r.limit || cost == 0 {
		return s
	}
	return packWindow(end, count+min(cost, r.limit-count))
}

// freshWindow reports whether s holds no count for a window still open at
// now (or later).
func freshWindow(s State, now int64) bool {
	nowSec := clampNow(now) / nsPerSec
	return s.Word&0xffffffff == 0 && s.High == 0 || uint64(uint32(s.Word>>32)) <= uint64(uint32(nowSec))
}
