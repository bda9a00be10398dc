package store

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"time"
)

// Algorithm selects how a rule counts.
type Algorithm uint8

const (
	// FixedWindow counts requests in windows aligned to the Unix epoch,
	// like envoyproxy/ratelimit, or in calendar periods
	// (NewCalendarWindow).
	FixedWindow Algorithm = iota + 1
	// TokenBucket refills Rate tokens per Period up to Burst.
	TokenBucket
	// SlidingWindow admits at most Limit in any window of length Period
	// ending now, counted in buckets of Period/G (see TakeSliding), or
	// over calendar periods (NewCalendarSliding).
	SlidingWindow
)

// String returns the config spelling: "fixed_window", "token_bucket" or
// "sliding_window".
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed_window"
	case TokenBucket:
		return "token_bucket"
	case SlidingWindow:
		return "sliding_window"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// MaxLimit is the largest limit (requests per window, tokens per period)
// and burst a rule holds: 2^53, the largest integer up to which Redis's
// Lua numbers (doubles) count exactly.
const MaxLimit = 1 << 53

// MaxFixedWindowLimit is the largest requests-per-window of a narrow fixed
// window, whose state is one 64-bit word: the window's end and a count of
// 32 bits, which goes one past the limit (2^32-2) when charged past it. A
// larger limit, up to MaxLimit, makes a wide rule (Rule.Wide), whose state
// takes two words.
const MaxFixedWindowLimit = math.MaxUint32 - 2

// maxTolerance bounds a token bucket's capacity measured in time quanta,
// leaving headroom so that state + cost arithmetic never wraps.
const maxTolerance = 1 << 62

// Rule is a compiled limit. It is immutable and safe to share.
//
// A token bucket measures time in quanta of Period/(Rate*k) where k is the
// number of quanta per token, chosen so that one token is exactly k quanta
// (no rounding of the refill rate) and a quantum is at least a nanosecond
// (so a quantum count since the epoch fits in an int64 until 2262).
type Rule struct {
	alg    Algorithm
	limit  uint64        // requests per window, or tokens per period
	period time.Duration // window length, or refill period
	burst  uint64        // token bucket capacity
	wide   bool          // fixed window above MaxFixedWindowLimit: two-word state

	// token bucket only
	k   uint64 // quanta per token
	rk  uint64 // rate * k: quanta per period (≤ period in ns)
	tol uint64 // burst * k: capacity in quanta

	// sliding window only
	g      uint64 // buckets per window (G); the state counts G+1
	bw     uint64 // bits per bucket's count
	bucket uint64 // bucket length in ns: period/G exactly
	mask   uint64 // the (G+1)*bw bits of the counts

	// cal aligns a fixed or sliding window to a calendar; nil for windows
	// aligned to the Unix epoch. period is then its nominal length.
	cal *Calendar
}

// NewFixedWindow returns a fixed-window rule of limit requests per window,
// at most MaxLimit. The window is a whole number of seconds; windows start
// at multiples of it since the Unix epoch. A limit of 0 denies every
// request of a cost above 0; a peek (PeekWithin) until a charge counts. A limit above MaxFixedWindowLimit makes a wide rule.
func NewFixedWindow(limit uint64, window time.Duration) (*Rule, error) {
	if window < time.Second || window%time.Second != 0 {
		return nil, fmt.Errorf("store: fixed window of %v: must be a whole number of seconds", window)
	}
	if window/time.Second > math.MaxUint32 {
		return nil, fmt.Errorf("store: fixed window of %v is too long", window)
	}
	if limit > MaxLimit {
		return nil, fmt.Errorf("store: fixed window limit %d exceeds %d", limit, uint64(MaxLimit))
	}
	return &Rule{alg: FixedWindow, limit: limit, period: window, wide: limit > MaxFixedWindowLimit}, nil
}

// NewTokenBucket returns a token bucket holding up to burst tokens that
// gains rate tokens per period, exactly (no rounding of the rate). It
// starts full. It is an error if rate exceeds one token per nanosecond or
// if rate or burst exceed MaxLimit.
func NewTokenBucket(rate uint64, period time.Duration, burst uint64) (*Rule, error) {
	switch {
	case rate == 0:
		return nil, errors.New("store: token bucket rate must be at least 1 token per period")
	case period <= 0:
		return nil, fmt.Errorf("store: token bucket period %v must be positive", period)
	case burst == 0:
		return nil, errors.New("store: token bucket burst must be at least 1")
	case rate > uint64(period):
		return nil, fmt.Errorf("store: token bucket rate %d per %v is faster than one token per nanosecond", rate, period)
	case rate > MaxLimit || burst > MaxLimit:
		return nil, fmt.Errorf("store: token bucket rate %d or burst %d exceeds %d", rate, burst, uint64(MaxLimit))
	}
	// Finest quanta that keep time counts within an int64: k quanta per
	// token, rate*k ≤ period in nanoseconds. Coarser when the capacity
	// would not fit.
	k := uint64(period) / rate
	if max := uint64(maxTolerance) / burst; k > max {
		k = max
	}
	return &Rule{alg: TokenBucket, limit: rate, period: period, burst: burst,
		k: k, rk: rate * k, tol: burst * k}, nil
}

// maxSlidingBuckets bounds G: a take sums G+1 counts.
const maxSlidingBuckets = 8

// NewSlidingWindow returns a sliding-window rule: at most limit requests
// in any window of length window ending now. The window is a whole number
// of seconds; it is counted in G buckets of window/G, the most (up to 8)
// whose G+1 counts of limit's width fit in 32 bits and that divide the
// window into whole nanoseconds: G = 8 up to 7 requests, 5 (6 for windows
// of a multiple of 3 s) up to 15, 5 up to 31, 4 up to 63, 2 (3 for windows
// of a multiple of 3 s) up to 255, 2 up to 1023, 1 up to
// MaxSlidingWindowLimit. A hit stays counted for at most window/G longer
// than the window. A limit of 0 denies every request of a cost above 0;
// a peek (PeekWithin) until a charge counts.
func NewSlidingWindow(limit uint64, window time.Duration) (*Rule, error) {
	if window < time.Second || window%time.Second != 0 {
		return nil, fmt.Errorf("store: sliding window of %v: must be a whole number of seconds", window)
	}
	if window/time.Second > math.MaxUint32 {
		return nil, fmt.Errorf("store: sliding window of %v is too long", window)
	}
	if limit > MaxSlidingWindowLimit {
		return nil, fmt.Errorf("store: sliding window limit %d exceeds %d", limit, MaxSlidingWindowLimit)
	}
	bw := uint64(max(bits.Len64(limit), 1))
	g := min(32/bw-1, maxSlidingBuckets)
	for uint64(window)%g != 0 {
		g--
	}
	return &Rule{alg: SlidingWindow, limit: limit, period: window,
		g: g, bw: bw, bucket: uint64(window) / g, mask: 1<<((g+1)*bw) - 1}, nil
}

// NewCalendarWindow returns a fixed-window rule of limit requests per
// period of c: each window is one calendar period (see Calendar), so
// windows are not all of one length. Otherwise it is NewFixedWindow's.
func NewCalendarWindow(limit uint64, c *Calendar) (*Rule, error) {
	r, err := NewFixedWindow(limit, c.Nominal())
	if err != nil {
		return nil, err
	}
	r.cal = c
	return r, nil
}

// NewCalendarSliding returns a sliding-window rule of at most limit
// requests per period of c. Each calendar period is counted in G buckets
// (as many as NewSlidingWindow gives the nominal period) of equal shares
// of that period's length: bucket j of a period of length L starts
// ceil(j·L/G) nanoseconds after the period. A take counts the G+1 newest
// buckets, so it counts everything since the same share of the previous
// period: no span as long as the shorter of the two periods ever holds
// more than limit.
func NewCalendarSliding(limit uint64, c *Calendar) (*Rule, error) {
	r, err := NewSlidingWindow(limit, c.Nominal())
	if err != nil {
		return nil, err
	}
	r.cal = c
	return r, nil
}

// Algorithm reports how the rule counts.
func (r *Rule) Algorithm() Algorithm { return r.alg }

// Wide reports whether the rule's state takes two words: a fixed window
// of more than MaxFixedWindowLimit requests (State.High may be non-zero).
// Every other rule's state is State.Word alone.
func (r *Rule) Wide() bool { return r.wide }

// Limit is requests per window (fixed window) or tokens added per Period
// (token bucket).
func (r *Rule) Limit() uint64 { return r.limit }

// Period is the window length or the refill period; for a calendar rule
// the calendar's nominal period (a month of 30 days).
func (r *Rule) Period() time.Duration { return r.period }

// Calendar is the calendar a window is aligned to; nil for windows aligned
// to the Unix epoch.
func (r *Rule) Calendar() *Calendar { return r.cal }

// Burst is a token bucket's capacity; for a window it equals Limit.
func (r *Rule) Burst() uint64 {
	if r.alg != TokenBucket {
		return r.limit
	}
	return r.burst
}

// Capacity is the most a single hit can ever take: Limit for a window,
// Burst for a token bucket.
func (r *Rule) Capacity() uint64 { return r.Burst() }

// Quanta describes a token bucket's time base, for stores that run the
// algorithm elsewhere (Redis scripts): one token is perToken quanta, one
// Period is perPeriod quanta, the capacity is capacity quanta.
func (r *Rule) Quanta() (perToken, perPeriod, capacity uint64) { return r.k, r.rk, r.tol }

// Buckets describes a sliding window's counting, for stores that run the
// algorithm elsewhere (Redis scripts): the window is g buckets of length
// bucket, and the state holds g+1 counts of bits bits each. A calendar
// rule's buckets are shares of each period (see NewCalendarSliding);
// bucket is then the nominal period's share.
func (r *Rule) Buckets() (g uint64, bucket time.Duration, bits uint64) {
	return r.g, time.Duration(r.bucket), r.bw
}

// String describes the rule for logs and errors.
func (r *Rule) String() string {
	switch {
	case r.alg == TokenBucket:
		return fmt.Sprintf("token_bucket %d per %v burst %d", r.limit, r.period, r.burst)
	case r.cal != nil:
		return fmt.Sprintf("%s %d per %s", r.alg, r.limit, r.cal)
	case r.alg == SlidingWindow:
		return fmt.Sprintf("sliding_window %d per %v", r.limit, r.period)
	}
	return fmt.Sprintf("fixed_window %d per %v", r.limit, r.period)
}
