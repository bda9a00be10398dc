package config

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/store"
)

// DefaultMaxValueBytes is the longest key or value written into a counter
// key as is; longer ones are replaced by a hash.
const DefaultMaxValueBytes = 256

// Counter keys look like
//
//	domain|key=value|key2=value2|fw:60s
//	domain|key=value|tb:10/60s:20
//	domain|key=value|sw:10/60s
//	domain|key=value|fw:month@Europe/Berlin
//	domain|key=value|sw:10/3month@UTC
//
// The domain comes first, then one key=value part per descriptor entry, then
// the algorithm with its window (fw:<seconds>s; fw64:<seconds>s for a limit
// above store.MaxFixedWindowLimit, whose state takes two words, so a narrow
// and a wide rule never share a state) or, for a token bucket, its
// rate, period and burst (tb:<rate>/<seconds>s:<burst>), for a sliding
// window its limit and window (sw:<limit>/<seconds>s), because a bucket's
// or a sliding window's stored state is only meaningful for those
// parameters (a sliding window's buckets depend on the limit). A calendar
// window (fixed or sliding) has its unit, run of months and time zone
// instead of seconds. '%', '|', '=' and
// '#' inside the domain, keys and values are written as %25, %7C, %3D and
// %23, so a key splits back unambiguously. '{' and '}' are written as %7B
// and %7D, so that no part of a key is a Redis Cluster hash tag: the whole
// key chooses its hash slot, not a client's value (only the store's key
// prefix, the operator's, may hold a tag). A part longer than the maximum
// once escaped is written as '#' and the first 16 bytes of its SHA-256 in
// hex.

const hexDigits = "0123456789ABCDEF"

// appendPart appends s escaped, or its hash when it is longer than max
// escaped (a '|' takes three bytes), so that no part is longer than max.
func appendPart(dst []byte, s string, max int) []byte {
	if escapedLen(s) > max {
		// Hash in dst's own spare room: no allocation beyond growing dst.
		start := len(dst)
		dst = append(dst, s...)
		sum := sha256.Sum256(dst[start:])
		dst = append(dst[:start], '#')
		return hex.AppendEncode(dst, sum[:16])
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '%', '|', '=', '#', '{', '}':
			dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
		default:
			dst = append(dst, c)
		}
	}
	return dst
}

// escapedLen is the length of s escaped.
func escapedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%', '|', '=', '#', '{', '}':
			n += 2
		}
	}
	return n
}

func escapePart(s string, max int) string { return string(appendPart(nil, s, max)) }

// keySuffix is the part of a rule's counter key after its entries.
func keySuffix(r *Rule) string {
	if r.Unlimited {
		return "|unlimited"
	}
	per := strconv.FormatInt(int64(r.Limit.Period()/time.Second), 10) + "s"
	if r.Calendar {
		// The unit (with its run of months) and the zone, never a length
		// in seconds: a calendar key never equals a key of windows
		// aligned to the epoch, nor one of another zone.
		per = r.Unit.String() + "@" + escapePart(r.TimeZone.String(), math.MaxInt)
		if r.UnitMultiplier > 1 {
			per = strconv.FormatUint(uint64(r.UnitMultiplier), 10) + per
		}
	}
	switch r.Algorithm {
	case store.TokenBucket:
		return "|tb:" + strconv.FormatUint(r.Limit.Limit(), 10) + "/" + per + ":" +
			strconv.FormatUint(r.Limit.Burst(), 10)
	case store.SlidingWindow:
		return "|sw:" + strconv.FormatUint(r.Limit.Limit(), 10) + "/" + per
	}
	if r.Limit.Wide() {
		return "|fw64:" + per
	}
	return "|fw:" + per
}

// SplitKey splits a counter key into the part Table.KeyPrefix gives its
// domain and the part Rule.KeySuffix gives its limit (the algorithm and the
// numbers its state depends on), the inverse of how keys are built: the
// suffix is the last part, with the part before it when the last is a
// number, the "|k" of the k-th of a descriptor's limits that share one
// (rateLimits). ok is false when key has no separate domain and last part.
func SplitKey(key string) (prefix, suffix string, ok bool) {
	i, j := strings.IndexByte(key, '|'), strings.LastIndexByte(key, '|')
	if i < 0 || j <= i {
		return "", "", false
	}
	if isNumber(key[j+1:]) {
		if k := strings.LastIndexByte(key[:j], '|'); k > i {
			j = k
		}
	}
	return key[:i+1], key[j:], true
}

// isNumber reports whether s is a non-empty run of decimal digits. No
// other part of a key is: an entry's has '=', a limit's begins with its
// algorithm.
func isNumber(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// OverrideKey appends the counter key for a descriptor's limit override:
// the domain, the request's entries as sent and the override's unit, as a
// fixed window (wide when its limit exceeds store.MaxFixedWindowLimit). It
// is the key a rule matching the same entries exactly with the same unit
// uses, as in envoyproxy/ratelimit. Parts longer than the table's
// MaxValueBytes are hashed, as in rule keys.
func (t *Table) OverrideKey(dst []byte, domain string, entries []Entry, unit Unit, wide bool) []byte {
	dst = appendPart(dst, domain, t.max)
	for _, e := range entries {
		dst = append(dst, '|')
		dst = appendPart(dst, e.Key, t.max)
		dst = append(dst, '=')
		dst = appendPart(dst, e.Value, t.max)
	}
	if wide {
		dst = append(dst, "|fw64:"...)
	} else {
		dst = append(dst, "|fw:"...)
	}
	dst = strconv.AppendInt(dst, int64(unit.Duration()/time.Second), 10)
	return append(dst, 's')
}

// KeyPrefix is how the counter keys of domain begin: the domain as keys
// hold it, then the separator.
func (t *Table) KeyPrefix(domain string) string {
	return string(append(appendPart(nil, domain, t.max), '|'))
}

// glob is a compiled wildcard value: '*' matches any run of bytes,
// including none.
type glob struct {
	prefix, suffix string
	middle         []string
	min            int // the length of the literal parts
}

func compileGlob(pattern string) glob {
	parts := strings.Split(pattern, "*")
	g := glob{prefix: parts[0], suffix: parts[len(parts)-1], middle: parts[1 : len(parts)-1]}
	for _, p := range parts {
		g.min += len(p)
	}
	return g
}

// match reports whether s matches. Taking each middle part at its leftmost
// place is enough: '*' is the only metacharacter.
func (g *glob) match(s string) bool {
	if len(s) < g.min || !strings.HasPrefix(s, g.prefix) || !strings.HasSuffix(s, g.suffix) {
		return false
	}
	s = s[len(g.prefix) : len(s)-len(g.suffix)]
	for _, m := range g.middle {
		i := strings.Index(s, m)
		if i < 0 {
			return false
		}
		s = s[i+len(m):]
	}
	return true
}
