package redis

import (
	"strings"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/store"
)

// overCache remembers keys known to be over their limit, like the
// reference's local cache: a batch whose every key is in it and that the
// cached states deny is answered without a Redis call. The cached state
// can only be behind Redis (other instances only add to it), so a local
// denial is never wrong; its Remaining and RetryAfter may be slightly
// optimistic. Safe for concurrent use.
type overCache struct {
	m *xsync.Map[string, overEntry]
	// hold bounds the life (ns) of an entry of a Plain hit, or on Cluster
	// (all) of every entry: a state read may hold another instance's
	// takes of a request that is then denied (on Cluster by another slot;
	// for Plain hits, runIncr's increments), until that instance's refund
	// lands, at most hold after.
	hold int64
	all  bool
}

type overEntry struct {
	rule  *store.Rule // the entry serves hits of this rule only
	state store.State // as the store package holds it
	until int64       // Unix ns after which a cost of 1 may fit again
}

func newOverCache(hold time.Duration, all bool) *overCache {
	return &overCache{m: xsync.NewMap[string, overEntry](), hold: int64(hold), all: all}
}

// answer decides the batch locally if it can: every hit's key is cached
// for its rule and still over at now, no hit saturates, and the batch is
// denied. It reports whether out was written.
func (c *overCache) answer(s *Store, sc *scratch, now int64, hits []store.Hit, keys []string, out []store.Decision) bool {
	var buf [8]store.State
	orig := buf[:0]
	for i, h := range hits {
		if h.Always() && h.Cost > 0 {
			return false
		}
		e, ok := c.m.Load(keys[i])
		if !ok || e.rule != h.Rule || now >= e.until {
			return false
		}
		orig = append(orig, e.state)
	}
	if committed, _ := s.decide(sc, now, nil, hits, keys, orig, out); committed {
		return false
	}
	for i := range out {
		out[i].Local = true
	}
	return true
}

// update caches the keys of the batch that are now over their limit, from
// the batch's final states, and forgets the others. With the server clock
// token buckets are not cached: their time is Redis's, not the caller's.
func (c *overCache) update(now int64, tbNow []int64, hits []store.Hit, keys []string, final []store.State) {
	for i, h := range hits {
		tb := h.Rule.Algorithm() == store.TokenBucket
		if tb && tbNow != nil {
			continue
		}
		_, d := store.Take(final[i], h.Rule, now, 1)
		if d.Allowed {
			c.m.Delete(keys[i])
			continue
		}
		wait := d.RetryAfter
		if wait == store.Never {
			wait = d.ResetAfter
		}
		if c.all || h.Plain {
			wait = min(wait, time.Duration(c.hold))
		}
		// (a clone: keys[i] shares its memory with the whole call's)
		c.m.Store(strings.Clone(keys[i]), overEntry{rule: h.Rule, state: final[i], until: now + int64(wait)})
	}
}

// sweep drops the entries that lapsed before now.
func (c *overCache) sweep(now int64) {
	c.m.DeleteMatching(func(_ string, e overEntry) (bool, bool) { return e.until <= now, false })
}
