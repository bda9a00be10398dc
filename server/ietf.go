package server

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// The IETF httpapi draft's fields (draft-ietf-httpapi-ratelimit-headers,
// revision 10): RateLimit-Policy lists the quota policies, each a String
// item with q (quota) and w (window in seconds); RateLimit lists their
// current service limits, each with r (remaining) and t (seconds until
// more quota is available). Both are Structured Field Lists.
const (
	ietfPolicyHeader = "RateLimit-Policy"
	ietfHeader       = "RateLimit"
)

// appendIETFHeaders appends the draft's RateLimit-Policy and RateLimit
// fields to response_headers_to_add, one item per limit the request was
// counted against, and Retry-After when over the limit unless the
// RateLimit-* headers added it already.
func (s *RLS) appendIETFHeaders(b []byte, r *limiter.Response) []byte {
	policy, limits := ietfFields(r)
	if len(policy) == 0 {
		return b
	}
	b = appendHeader(b, ietfPolicyHeader, policy)
	b = appendHeader(b, ietfHeader, limits)
	if d := r.RetryAfter(); !s.opts.ResponseHeaders && d > 0 && d != store.Never {
		var num [20]byte
		b = appendHeader(b, "Retry-After", strconv.AppendInt(num[:0], seconds(d), 10))
	}
	return b
}

// ietfFields returns the values of RateLimit-Policy and RateLimit for r,
// empty when no limit applied. A policy is named by its rule's name, else
// its rule path; an override is "override". Its quota is the limit's
// requests per unit (a token bucket's refill) and its window the unit
// (times its multiplier) in seconds; remaining is 0 for a denied limit,
// and the reset is rounded up to whole seconds.
func ietfFields(r *limiter.Response) (policy, limits []byte) {
	r.EachLimit(func(desc int, rule *config.Rule, d *store.Decision) {
		name, q, window := "override", uint64(0), time.Duration(0)
		if rule != nil {
			name, q, window = rule.Name, rule.RequestsPerUnit, rule.Limit.Period()
			if name == "" {
				name = rule.Path
			}
		} else {
			st := &r.Statuses[desc]
			q, window = st.RequestsPerUnit, st.Unit.Duration()*time.Duration(max(1, st.UnitMultiplier))
		}
		remaining := d.Remaining
		if !d.Allowed {
			remaining = 0
		}
		if len(policy) > 0 {
			policy = append(policy, ", "...)
			limits = append(limits, ", "...)
		}
		policy = appendSFString(policy, name)
		policy = append(policy, ";q="...)
		policy = strconv.AppendUint(policy, min(q, maxSFInteger), 10)
		policy = append(policy, ";w="...)
		policy = strconv.AppendInt(policy, seconds(window), 10)
		limits = appendSFString(limits, name)
		limits = append(limits, ";r="...)
		limits = strconv.AppendUint(limits, min(remaining, maxSFInteger), 10)
		limits = append(limits, ";t="...)
		limits = strconv.AppendInt(limits, seconds(ceilSecond(d.ResetAfter)), 10)
	})
	return policy, limits
}

// ceilSecond rounds d up to whole seconds, as limiter.Status.ResetAfter.
func ceilSecond(d time.Duration) time.Duration {
	if r := d % time.Second; d > 0 && r != 0 {
		d += time.Second - r
	}
	return d
}

// maxSFInteger is the largest Structured Field Integer (15 digits).
const maxSFInteger = 999_999_999_999_999

// appendSFString appends s as a Structured Field String: quoted, with
// '"' and '\' escaped and bytes outside printable ASCII replaced by '?'.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
