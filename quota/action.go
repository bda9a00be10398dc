package quota

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// Kind is the strategy an Action assigns.
type Kind uint8

// The strategies of Envoy's RateLimitStrategy, and abandoning a bucket.
const (
	AllowAll Kind = iota + 1
	DenyAll
	// RequestsPerUnit allows Requests per Unit (Envoy's
	// requests_per_time_unit); fixed-window rules get it.
	RequestsPerUnit
	// TokenBucket holds up to MaxTokens, adding TokensPerFill every
	// FillInterval; token-bucket rules, and fixed windows whose unit Envoy
	// cannot name (week), get it.
	TokenBucket
	// Abandon tells the proxy to drop the bucket; a later request makes it
	// report (and subscribe) again.
	Abandon
)

// String names the kind for metrics and logs.
func (k Kind) String() string {
	switch k {
	case AllowAll:
		return "allow_all"
	case DenyAll:
		return "deny_all"
	case RequestsPerUnit:
		return "requests_per_time_unit"
	case TokenBucket:
		return "token_bucket"
	case Abandon:
		return "abandon"
	}
	return "unknown"
}

// Action is one bucket's answer to a stream. It is plain data.
type Action struct {
	// Bucket is the bucket id as the proxy reported it. Do not modify.
	Bucket map[string]string
	Kind   Kind
	// Requests and Unit are RequestsPerUnit's.
	Requests uint64
	Unit     config.Unit
	// MaxTokens, TokensPerFill and FillInterval are TokenBucket's.
	MaxTokens     uint32
	TokensPerFill uint32
	FillInterval  time.Duration
	// TTL is how long the proxy may use the assignment (not for Abandon).
	TTL time.Duration
}

// same reports whether a and b assign the same strategy (TTL aside).
func (a *Action) same(b *Action) bool {
	return a.Kind == b.Kind && a.Requests == b.Requests && a.Unit == b.Unit &&
		a.MaxTokens == b.MaxTokens && a.TokensPerFill == b.TokensPerFill && a.FillInterval == b.FillInterval
}

// A fixed-window rule's token bucket holds share/fixedWindowBurstDivisor
// tokens, and at least fixedWindowMinBurst (or the whole share if less),
// enough to absorb the jitter of arrivals at a small share.
const (
	fixedWindowBurstDivisor = 10
	fixedWindowMinBurst     = 10
)

// minFill is the shortest token-bucket fill interval assigned: finer fills
// cost the proxy timer wake-ups for nothing.
const minFill = time.Millisecond

// assign returns the strategy that grants share requests per period of r.
// A share of 0 denies everything. Fixed-window rules get RequestsPerUnit
// unless fwAsTB, or their period is one Envoy cannot name (a week, a
// unit_multiplier, or a calendar period); other rules get a token bucket,
// a calendar rule's at its nominal period (a month of 30 days).
func assign(r *config.Rule, share uint64, fwAsTB bool) Action {
	lim := r.Limit
	if share == 0 {
		return Action{Kind: DenyAll}
	}
	if lim.Algorithm() == store.FixedWindow && r.Unit != config.Week && r.UnitMultiplier <= 1 && !r.Calendar && !fwAsTB {
		return Action{Kind: RequestsPerUnit, Requests: share, Unit: r.Unit}
	}
	period := lim.Period()
	// q tokens every ceil(period·q/share): never faster than share per
	// period, and never more often than every minFill.
	q := uint64(1)
	if per := uint64(period) / share; per < uint64(minFill) {
		q = share * uint64(minFill) / uint64(period)
		if q == 0 {
			q = 1
		}
	}
	q = min(q, math.MaxUint32)
	fill := mulDivCeil(uint64(period), q, share)
	// The proxy's burst is its share of the rule's burst, at least one
	// fill. A fixed window has no burst of its own: the bucket holds a
	// tenth of the share (at least 10), because Envoy rebuilds a changed
	// bucket full and every push would otherwise grant a whole window.
	burst := mulDivCeil(lim.Burst(), share, max(lim.Limit(), 1))
	if lim.Algorithm() == store.FixedWindow {
		burst = max(mulDivCeil(share, 1, fixedWindowBurstDivisor), min(share, fixedWindowMinBurst))
	}
	burst = min(max(burst, q), math.MaxUint32)
	return Action{Kind: TokenBucket, MaxTokens: uint32(burst), TokensPerFill: uint32(q), FillInterval: time.Duration(fill)}
}

// mulDivCeil is ceil(a·b/c) without overflow for the values assign uses
// (saturating at MaxInt64).
func mulDivCeil(a, b, c uint64) uint64 {
	v := math.Ceil(float64(a) * float64(b) / float64(c))
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return uint64(v)
}
