package store

import "math"

// Tombstone is a narrow rule's State.Word no algorithm produces: a narrow
// fixed window's count stays at or below MaxFixedWindowLimit (so the low
// 32 bits are never all ones), a sliding window's counts sum to at most
// its limit and its debt stays below 2^32-1 (so its low 32 bits are never
// all ones either), and a token bucket's TAT stays below 2^63 + 2^62 +
// 2^61. Stores use it to mark a one-word state as removed. (A wide rule's
// state is never kept in one word.)
const Tombstone uint64 = math.MaxUint64

// clampNow treats instants before the Unix epoch as the epoch.
func clampNow(now int64) uint64 {
	if now < 0 {
		return 0
	}
	return uint64(now)
}

// Apply applies a hit of cost in mode m at now (Unix nanoseconds) to
// state s by the rule's algorithm: Take, Saturate, Charge or Refund.
func Apply(s State, r *Rule, now int64, cost uint64, m Mode) (State, Decision) {
	switch m {
	case ModeSaturate:
		return Saturate(s, r, now, cost)
	case ModeCharge:
		return Charge(s, r, now, cost)
	case ModeRefund:
		return Refund(s, r, now, cost)
	}
	return Take(s, r, now, cost)
}

// Take applies cost at now (Unix nanoseconds) to state s by the rule's
// algorithm (TakeWindow, TakeTokens or TakeSliding): consumed if it fits,
// nothing otherwise. Cost 0 checks, consuming nothing: allowed unless the
// state is past its limit (PeekWithin; Check of 1 is PeekStrict's).
func Take(s State, r *Rule, now int64, cost uint64) (State, Decision) {
	switch r.alg {
	case TokenBucket:
		return TakeTokens(s, r, now, cost)
	case SlidingWindow:
		return TakeSliding(s, r, now, cost)
	}
	return TakeWindow(s, r, now, cost)
}

// View is what a check of state s at now reports as allowed: the limit,
// what remains and when it resets, with no retry. Stores report it for a
// hit that fitted but was not consumed (its batch was denied) and for a
// refund.
func View(s State, r *Rule, now int64) Decision {
	_, d := Take(s, r, now, 0)
	d.Allowed, d.RetryAfter = true, 0
	return d
}

// Check is what a take of cost at now reports from state s, consuming
// nothing: its denial, or when it fits what View reports. Check of 1 is a
// strict peek's decision (PeekStrict): allowed only when one more unit
// fits.
func Check(s State, r *Rule, now int64, cost uint64) Decision {
	if _, d := Take(s, r, now, cost); !d.Allowed {
		return d
	}
	return View(s, r, now)
}

// Rollback undoes an allowed Take of cost that left the state after,
// given the state s as it is at now, the time of the rollback (read after
// every take the rollback might undo, so that no concurrent take used a
// later instant). Other hits may have changed the state since. It never
// leaves more capacity than the state would have without that take.
func Rollback(s, after State, r *Rule, now int64, cost uint64) State {
	switch r.alg {
	case TokenBucket:
		return rollbackTokens(s, after, r, now, cost)
	case SlidingWindow:
		return rollbackSliding(s, after, r, now, cost)
	}
	return rollbackWindow(s, after, r, cost)
}

// Saturate is Take for a hit that is charged even when denied: if cost
// does not fit, it consumes what is left (up to cost) and reports the
// denial as seen from the drained state.
func Saturate(s State, r *Rule, now int64, cost uint64) (State, Decision) {
	return pastLimit(s, r, now, cost, ModeSaturate)
}

// Charge records cost, usage that already happened, whole: as Take when
// it fits; past the limit as the overshoot of a fixed window's count
// (until the window ends) or the debt of a token bucket or sliding window
// (repaid by refills before anything else is granted), bounded (see
// docs/STORE.md). A charge that does not fit is reported denied, with
// what Check of one unit on the charged state reports: no remaining, and
// the time until one unit fits again (a state charged past its limit fits
// no unit). On a rule with a limit of 0 a fixed window counts the charge;
// a sliding window marks the bucket holding now as used (it is counted
// until that bucket leaves the window: nothing past a limit of 0 is ever
// repaid, so a debt would never end).
func Charge(s State, r *Rule, now int64, cost uint64) (State, Decision) {
	return pastLimit(s, r, now, cost, ModeCharge)
}

// pastLimit is Take for a saturating hit or a charge: a hit that does not
// fit moves the state by the algorithm's saturate or charge, and reports
// what a take of cost (saturate) or of one unit (charge) on the result
// gets.
func pastLimit(s State, r *Rule, now int64, cost uint64, m Mode) (State, Decision) {
	n, d := Take(s, r, now, cost)
	if d.Allowed {
		return n, d
	}
	move, check := beyond[r.alg][0], cost
	if m == ModeCharge {
		move, check = beyond[r.alg][1], 1
	}
	n = move(s, r, now, cost)
	_, d = Take(n, r, now, check)
	return n, d
}

// beyond holds each algorithm's moves for a hit that does not fit:
// saturate, then charge.
var beyond = [...][2]func(State, *Rule, int64, uint64) State{
	FixedWindow:   {saturateWindow, chargeWindow},
	TokenBucket:   {saturateTokens, chargeTokens},
	SlidingWindow: {saturateSliding, chargeSliding},
}

// Refund gives cost back at now: a fixed window's count in the window
// holding now, a token bucket's tokens, a sliding window's debt and then
// its counts, oldest bucket first. It never goes below empty nor holds
// more than the capacity; a fixed window's count saturated at its bound
// (docs/STORE.md) is left alone, since its true value is unknown. The
// decision is View of the result: allowed.
func Refund(s State, r *Rule, now int64, cost uint64) (State, Decision) {
	n := s
	if cost > 0 {
		switch r.alg {
		case TokenBucket:
			n = refundTokens(s, r, now, cost)
		case SlidingWindow:
			n = refundSliding(s, r, now, cost)
		default:
			n = refundWindow(s, r, now, cost)
		}
	}
	return n, View(n, r, now)
}

// Fresh reports whether state s at now equals the fresh state: a lapsed
// or empty window, a full bucket. Dropping a fresh state changes no
// decision at now or later.
func Fresh(s State, r *Rule, now int64) bool {
	switch r.alg {
	case TokenBucket:
		return freshTokens(s, r, now)
	case SlidingWindow:
		return freshSliding(s, r, now)
	}
	return freshWindow(s, now)
}
