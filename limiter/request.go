package limiter

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// Request is one rate-limit question in protocol-neutral form. Adapters
// fill it from their wire messages; a Request may be reused after Reset.
type Request struct {
	Domain      string
	Descriptors []Descriptor
	// HitsAddend is the cost of every descriptor that has no cost of its
	// own. Zero means 1, as in Envoy's RateLimitRequest.
	HitsAddend uint64
}

// Reset empties r for reuse, keeping its descriptors' capacity.
func (r *Request) Reset() {
	for i := range r.Descriptors {
		e := r.Descriptors[i].Entries
		clear(e) // drop references to the last request's strings
		r.Descriptors[i] = Descriptor{Entries: e[:0]}
	}
	r.Domain, r.Descriptors, r.HitsAddend = "", r.Descriptors[:0], 0
}

// AddDescriptor appends an empty descriptor and returns it. The
// descriptor's Entries keep the capacity of an earlier use of r.
func (r *Request) AddDescriptor() *Descriptor {
	if len(r.Descriptors) < cap(r.Descriptors) {
		r.Descriptors = r.Descriptors[:len(r.Descriptors)+1]
	} else {
		r.Descriptors = append(r.Descriptors, Descriptor{})
	}
	d := &r.Descriptors[len(r.Descriptors)-1]
	d.Entries = d.Entries[:0]
	return d
}

// Descriptor is an ordered list of entries with an optional cost and an
// optional limit override.
type Descriptor struct {
	Entries []config.Entry
	// Cost, when HasCost, replaces the request's HitsAddend for this
	// descriptor; zero checks without consuming.
	Cost    uint64
	HasCost bool
	// Kind says how the cost counts: the request's own hits (the zero
	// value), a charge or a refund.
	Kind Kind
	// Override, when set (Unit != 0), replaces the matched rule by a
	// fixed window of RequestsPerUnit per Unit.
	Override Override
}

// Kind says how a descriptor's cost counts.
type Kind uint8

const (
	// Hits are the request's own: consumed only if the whole request is
	// allowed (all or nothing; --denied-hits saturate consumes what is
	// left of a denied one). A cost of 0 (a peek) checks without
	// consuming: over only past the limit, or with Options.StrictPeeks
	// unless one more unit fits.
	Hits Kind = iota
	// Charge is usage that already happened (Envoy's per-descriptor
	// hits_addend: Envoy Gateway's cost, apply_on_stream_done): recorded
	// whole, past the limit too and whatever the request's outcome. It
	// reports over the limit, and denies the request, when it did not
	// fit.
	Charge
	// Refund gives usage back (Envoy's is_negative_hits): never below
	// empty, never above the limit's capacity, whatever the request's
	// outcome. It is never over the limit.
	Refund
)

// String returns "hits", "charge" or "refund".
func (k Kind) String() string {
	switch k {
	case Charge:
		return "charge"
	case Refund:
		return "refund"
	}
	return "hits"
}

// Override is a limit carried by the request itself (Envoy's
// RateLimitDescriptor.limit).
type Override struct {
	RequestsPerUnit uint32
	Unit            config.Unit
	// UnitMultiplier makes the window that many units long; 0 means 1.
	UnitMultiplier uint32
}

// window is the override's window length, or 0 when it has no valid
// unit or is longer than a fixed window can be.
func (o Override) window() time.Duration {
	secs := uint64(o.Unit.Duration() / time.Second)
	if o.UnitMultiplier > 1 {
		secs *= uint64(o.UnitMultiplier)
	}
	if secs > math.MaxUint32 {
		return 0
	}
	return time.Duration(secs) * time.Second
}

// Code is a descriptor's or a request's outcome. Its values equal Envoy's
// RateLimitResponse.Code; there is no UNKNOWN.
type Code int32

const (
	OK        Code = 1
	OverLimit Code = 2
)

// String returns "OK" or "OVER_LIMIT".
func (c Code) String() string {
	if c == OverLimit {
		return "OVER_LIMIT"
	}
	return "OK"
}

// Status is the outcome for one descriptor. For a descriptor with several
// limits (rate_limits) it describes the limit that decided: among the
// enforced (non-shadow) ones if there are any, a denied one (the longest
// retry first), else the one with the least remaining (the longest reset
// first), so that Envoy's X-RateLimit-* headers stay meaningful.
type Status struct {
	Code Code
	// Rule is the matched rule, nil when none applied (no match, unknown
	// domain, replaced) or when an override applied.
	Rule *config.Rule
	// Limited reports that a limit was counted (a rule or an override),
	// so Decision, RequestsPerUnit and Unit are meaningful.
	Limited bool
	// Unlimited reports a rule with `unlimited: true`.
	Unlimited bool
	// Name, RequestsPerUnit and Unit describe the limit in Envoy's terms:
	// for a token bucket RequestsPerUnit is the refill per Unit. It is
	// exact (up to 2^53); Envoy's field holds at most 4294967295.
	Name            string
	RequestsPerUnit uint64
	Unit            config.Unit
	// UnitMultiplier is the override's or the rule's (rate_limit's
	// unit_multiplier): the window is that many Units; 0 or 1 means one.
	UnitMultiplier uint32
	// Hits is the descriptor's cost, its own hits_addend or the
	// request's (0 there meaning 1), whenever a rule (unlimited included)
	// or an override applied; 0 for a check without consuming and when
	// nothing applied. Per-rule metrics count it, as the reference's
	// stats add hits_addend.
	Hits uint64
	// Kind is how Hits counted: the request's own, a charge or a refund.
	Kind Kind
	// Decision is the store's answer. For a rule in shadow mode it keeps
	// Allowed=false when the rule was exceeded although Code is OK.
	Decision store.Decision
}

// Remaining is Envoy's limit_remaining: requests or whole tokens left,
// saturated to uint32 (4294967295 for more); 0 when the descriptor's hit
// was denied (shadow mode included) or had no limit, as in
// envoyproxy/ratelimit; 4294967295 for an unlimited rule. ExactRemaining
// is the same, not saturated.
func (s *Status) Remaining() uint32 {
	return uint32(min(s.ExactRemaining(), math.MaxUint32))
}

// ExactRemaining is Remaining up to 2^53: requests or whole tokens left,
// 0 when denied or without a limit, 4294967295 for an unlimited rule.
// Decision.Remaining keeps what is left even when denied.
func (s *Status) ExactRemaining() uint64 {
	switch {
	case s.Unlimited:
		return math.MaxUint32
	case !s.Decision.Allowed:
		return 0
	}
	return s.Decision.Remaining
}

// EnvoyRequestsPerUnit is RequestsPerUnit as Envoy's uint32
// current_limit.requests_per_unit holds it: 4294967295 for more.
func (s *Status) EnvoyRequestsPerUnit() uint32 {
	return uint32(min(s.RequestsPerUnit, math.MaxUint32))
}

// ResetAfter is Envoy's duration_until_reset: the time until the window
// ends or the bucket is full, rounded up to whole seconds (so at least 1 s
// whenever it is not zero).
func (s *Status) ResetAfter() time.Duration {
	return ceilSecond(s.Decision.ResetAfter)
}

// RetryAfter is the time, rounded up to whole seconds, until a denied
// descriptor's cost could succeed; 0 when allowed; store.Never when no
// wait helps.
func (s *Status) RetryAfter() time.Duration {
	if s.Decision.RetryAfter == store.Never {
		return store.Never
	}
	return ceilSecond(s.Decision.RetryAfter)
}

func ceilSecond(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if r := d % time.Second; r != 0 {
		d += time.Second - r
	}
	return d
}

// Response is the outcome of a request: the overall code and one status
// per descriptor, in order. A Response may be reused across Check calls.
type Response struct {
	Overall  Code
	Statuses []Status
	// Limits lists the limits of the descriptors that have several (a
	// rate_limits list), in descriptor order, each with its own outcome;
	// the descriptor's status reports the one that decided. A descriptor
	// with one limit is described by its status alone. EachLimit walks
	// both.
	Limits []Limit
}

// EachLimit calls fn for every limit the request was counted against, in
// descriptor order: each limit of a matched rule (rate_limits gives
// several) and each override, with its rule (nil for an override, which
// the status describes) and its decision.
func (r *Response) EachLimit(fn func(desc int, rule *config.Rule, d *store.Decision)) {
	k := 0
	for i := range r.Statuses {
		st := &r.Statuses[i]
		if !st.Limited {
			continue
		}
		if k < len(r.Limits) && r.Limits[k].Descriptor == i {
			for ; k < len(r.Limits) && r.Limits[k].Descriptor == i; k++ {
				fn(i, r.Limits[k].Rule, &r.Limits[k].Decision)
			}
			continue
		}
		fn(i, st.Rule, &st.Decision)
	}
}

// Limit is the outcome of one limit of a descriptor.
type Limit struct {
	// Descriptor is the index of the descriptor in the request.
	Descriptor int
	// Rule is the limit's rule; nil for an override (the descriptor's
	// status then describes it).
	Rule     *config.Rule
	Decision store.Decision
}

// MostRestrictive returns the index of the limited status with the least
// remaining (the longest reset breaks ties), or -1 when no descriptor was
// limited. Response headers describe that descriptor.
func (r *Response) MostRestrictive() int {
	best := -1
	for i := range r.Statuses {
		s := &r.Statuses[i]
		if !s.Limited {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &r.Statuses[best]
		if s.Decision.Remaining < b.Decision.Remaining ||
			s.Decision.Remaining == b.Decision.Remaining && s.Decision.ResetAfter > b.Decision.ResetAfter {
			best = i
		}
	}
	return best
}

// RetryAfter is the time until a denied request could succeed: the
// longest RetryAfter of its over-limit descriptors, rounded up to whole
// seconds; store.Never when one of them can never succeed; 0 when the
// request was allowed.
func (r *Response) RetryAfter() time.Duration {
	if r.Overall != OverLimit {
		return 0
	}
	var longest time.Duration
	for i := range r.Statuses {
		s := &r.Statuses[i]
		if s.Code == OverLimit {
			longest = max(longest, s.RetryAfter())
		}
	}
	return longest
}
