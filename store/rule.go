package store

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Algorithm selects how a rule counts.
type Algorithm uint8

const (
	// FixedWindow counts requests in windows aligned to the Unix epoch,
	// like envoyproxy/ratelimit.
	FixedWindow Algorithm = iota + 1
	// TokenBucket refills Rate tokens per Period up to Burst.
	TokenBucket
)

// String returns the config spelling: "fixed_window" or "token_bucket".
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed_window"
	case TokenBucket:
		return "token_bucket"
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// MaxFixedWindowLimit is the largest requests-per-window a fixed window
// holds. The count shares a 64-bit word with the window's end.
const MaxFixedWindowLimit = math.MaxUint32 - 1

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

	// token bucket only
	k   uint64 // quanta per token
	rk  uint64 // rate * k: quanta per period (≤ period in ns)
	tol uint64 // burst * k: capacity in quanta
}

// NewFixedWindow returns a fixed-window rule of limit requests per window.
// The window is a whole number of seconds; windows start at multiples of it
// since the Unix epoch. A limit of 0 denies every request.
func NewFixedWindow(limit uint64, window time.Duration) (*Rule, error) {
	if window < time.Second || window%time.Second != 0 {
		return nil, fmt.Errorf("store: fixed window of %v: must be a whole number of seconds", window)
	}
	if window/time.Second > math.MaxUint32 {
		return nil, fmt.Errorf("store: fixed window of %v is too long", window)
	}
	if limit > MaxFixedWindowLimit {
		return nil, fmt.Errorf("store: fixed window limit %d exceeds %d", limit, uint64(MaxFixedWindowLimit))
	}
	return &Rule{alg: FixedWindow, limit: limit, period: window}, nil
}

// NewTokenBucket returns a token bucket holding up to burst tokens that
// gains rate tokens per period, exactly (no rounding of the rate). It
// starts full. It is an error if rate exceeds one token per nanosecond or
// if burst is so large that the bucket's capacity in time cannot be held.
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
	}
	// Finest quanta that keep time counts within an int64: k quanta per
	// token, rate*k ≤ period in nanoseconds. Coarser when the capacity
	// would not fit.
	k := uint64(period) / rate
	if max := uint64(maxTolerance) / burst; k > max {
		k = max
	}
	if k == 0 {
		return nil, fmt.Errorf("store: token bucket burst %d is too large", burst)
	}
	return &Rule{alg: TokenBucket, limit: rate, period: period, burst: burst,
		k: k, rk: rate * k, tol: burst * k}, nil
}

// Algorithm reports how the rule counts.
func (r *Rule) Algorithm() Algorithm { return r.alg }

// Limit is requests per window (fixed window) or tokens added per Period
// (token bucket).
func (r *Rule) Limit() uint64 { return r.limit }

// Period is the window length or the refill period.
func (r *Rule) Period() time.Duration { return r.period }

// Burst is a token bucket's capacity; for a fixed window it equals Limit.
func (r *Rule) Burst() uint64 {
	if r.alg == FixedWindow {
		return r.limit
	}
	return r.burst
}

// Capacity is the most a single hit can ever take: Limit for a fixed
// window, Burst for a token bucket.
func (r *Rule) Capacity() uint64 { return r.Burst() }

// Quanta describes a token bucket's time base, for stores that run the
// algorithm elsewhere (Redis scripts): one token is perToken quanta, one
// Period is perPeriod quanta, the capacity is capacity quanta.
func (r *Rule) Quanta() (perToken, perPeriod, capacity uint64) { return r.k, r.rk, r.tol }

// String describes the rule for logs and errors.
func (r *Rule) String() string {
	if r.alg == TokenBucket {
		return fmt.Sprintf("token_bucket %d per %v burst %d", r.limit, r.period, r.burst)
	}
	return fmt.Sprintf("fixed_window %d per %v", r.limit, r.period)
}
