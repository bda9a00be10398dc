package loadgen

import (
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// Fallback is what a simulated proxy does for a bucket without a usable
// assignment: Envoy's no_assignment_behavior and
// expired_assignment_behavior.
type Fallback uint8

// The behaviours the simulator knows.
const (
	// FallbackAllow allows every request (blanket ALLOW_ALL, Envoy's
	// default).
	FallbackAllow Fallback = iota
	// FallbackDeny denies every request (blanket DENY_ALL).
	FallbackDeny
	// FallbackReuse keeps enforcing the expired assignment
	// (expired_assignment_behavior.reuse_last_assignment); as a
	// no-assignment behaviour it means allow.
	FallbackReuse
)

// localBucket enforces one bucket's assignment as Envoy's
// rate_limit_quota filter does: a blanket rule, a token bucket (rebuilt
// full when the assignment changes, kept when the same one is re-sent),
// or requests per time unit (a fixed window aligned to the unit, which
// Envoy itself does not implement yet). Not safe for concurrent use.
type localBucket struct {
	has     bool
	strat   *typepb.RateLimitStrategy
	expires time.Time // zero: never

	tokens   float64
	maxTok   float64
	perNanos float64 // tokens per nanosecond
	last     time.Time

	window    int64 // the window's start in units
	winCount  uint64
	noAssign  Fallback
	onExpired Fallback
}

// apply takes a quota_assignment_action received at now; abandoned is
// reported by the caller dropping the bucket.
func (b *localBucket) apply(now time.Time, a *rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction) {
	s := a.GetRateLimitStrategy()
	same := b.has && sameStrategy(b.strat, s)
	b.has, b.strat = true, s
	b.expires = time.Time{}
	if ttl := a.GetAssignmentTimeToLive(); ttl != nil {
		b.expires = now.Add(ttl.AsDuration())
	}
	if tb := s.GetTokenBucket(); tb != nil && !same {
		fill := tb.GetFillInterval().AsDuration()
		per := float64(tb.GetTokensPerFill().GetValue())
		if tb.GetTokensPerFill() == nil {
			per = 1
		}
		b.maxTok = float64(tb.GetMaxTokens())
		b.tokens = b.maxTok
		b.perNanos = 0
		if fill > 0 {
			b.perNanos = per / float64(fill)
		}
		b.last = now
	}
}

func sameStrategy(a, b *typepb.RateLimitStrategy) bool {
	ta, tb := a.GetTokenBucket(), b.GetTokenBucket()
	if ta == nil || tb == nil {
		return false
	}
	return ta.GetMaxTokens() == tb.GetMaxTokens() && ta.GetTokensPerFill().GetValue() == tb.GetTokensPerFill().GetValue() &&
		ta.GetFillInterval().AsDuration() == tb.GetFillInterval().AsDuration()
}

var unitNanos = map[typepb.RateLimitUnit]int64{
	typepb.RateLimitUnit_SECOND: int64(time.Second), typepb.RateLimitUnit_MINUTE: int64(time.Minute),
	typepb.RateLimitUnit_HOUR: int64(time.Hour), typepb.RateLimitUnit_DAY: int64(24 * time.Hour),
	typepb.RateLimitUnit_MONTH: int64(30 * 24 * time.Hour), typepb.RateLimitUnit_YEAR: int64(365 * 24 * time.Hour),
}

// allow decides one request at now.
func (b *localBucket) allow(now time.Time) bool {
	if !b.has {
		return b.noAssign != FallbackDeny
	}
	if !b.expires.IsZero() && !now.Before(b.expires) {
		switch b.onExpired {
		case FallbackAllow:
			return true
		case FallbackDeny:
			return false
		}
	}
	s := b.strat
	if tb := s.GetTokenBucket(); tb != nil {
		if el := now.Sub(b.last); el > 0 {
			b.tokens = min(b.maxTok, b.tokens+float64(el)*b.perNanos)
			b.last = now
		}
		if b.tokens >= 1 {
			b.tokens--
			return true
		}
		return false
	}
	if r := s.GetRequestsPerTimeUnit(); r != nil {
		unit := unitNanos[r.GetTimeUnit()]
		if unit == 0 {
			return true
		}
		if w := now.UnixNano() / unit; w != b.window {
			b.window, b.winCount = w, 0
		}
		if b.winCount < r.GetRequestsPerTimeUnit() {
			b.winCount++
			return true
		}
		return false
	}
	return s.GetBlanketRule() != typepb.RateLimitStrategy_DENY_ALL
}
