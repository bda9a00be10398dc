package store

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// PlainKeys is envoyproxy/ratelimit's layout of fixed-window counters, the
// key scheme Redis and memcached stores use for a Plain hit: the store's
// prefix, the hit's Key (the reference's cache key up to its window start,
// as config.Table.PlainKey builds it), then the start of the window
// holding now in Unix seconds, floor(now/unit)*unit (the reference's
// src/limiter/cache_key.go, GenerateCacheKey). The value is the window's
// count as a bare decimal integer, the reference's INCRBY counter, and the
// key expires the unit's length plus a random 0 to JitterMax-1 seconds
// after each write (src/redis/fixed_cache_impl.go, DoLimit: EXPIRE after
// every INCRBY; memcached: at its first ADD, src/memcached/cache_impl.go,
// increaseAsync). Safe for concurrent use.
type PlainKeys struct {
	// Prefix is the store's key prefix (the reference's CACHE_KEY_PREFIX).
	Prefix string
	// JitterMax is EXPIRATION_JITTER_MAX_SECONDS: each expiry gets a
	// random 0 to JitterMax-1 seconds more; 0 or less adds none.
	JitterMax int64
}

// PlainUnits are the window lengths, in seconds, of the reference's units
// (src/utils/utilities.go, UnitToDivider): second, minute, hour, day,
// week, month (30 days) and year (365 days).
var PlainUnits = [...]int64{1, 60, 3600, 86400, 7 * 86400, 30 * 86400, 365 * 86400}

// Plainable reports whether PlainKeys can hold r's state: a narrow fixed
// window aligned to the Unix epoch whose length is one of PlainUnits.
func (r *Rule) Plainable() bool {
	if r.alg != FixedWindow || r.wide || r.cal != nil {
		return false
	}
	for _, u := range PlainUnits {
		if r.period == time.Duration(u)*time.Second {
			return true
		}
	}
	return false
}

// WindowStart is the start, in Unix seconds, of the fixed window holding
// now (Unix nanoseconds; earlier instants count as the epoch).
func (r *Rule) WindowStart(now int64) uint64 {
	return r.WindowEnd(now) - uint64(r.period/time.Second)
}

// Append appends the store key of a Plain hit on key by r at now: the
// prefix, key and the window's start.
func (k PlainKeys) Append(dst []byte, key string, r *Rule, now int64) []byte {
	dst = append(append(dst, k.Prefix...), key...)
	return strconv.AppendUint(dst, r.WindowStart(now), 10)
}

// TTL is the expiry, in seconds from now, of a write of r's counter: the
// window's length plus the jitter.
func (k PlainKeys) TTL(r *Rule) int64 {
	ttl := int64(r.period / time.Second)
	if k.JitterMax > 0 {
		ttl += rand.Int64N(k.JitterMax)
	}
	return ttl
}
