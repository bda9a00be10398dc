package config

// envoyproxy/ratelimit's cache keys (src/limiter/cache_key.go,
// GenerateCacheKey) are the key prefix, the domain, "_", then for each of
// the request's entries its key, "_", its value (or, for an entry matched
// by a share_threshold wildcard, the wildcard value as written) and "_",
// then the window's start in Unix seconds. PlainKey builds them up to the
// window start; the stores add the prefix and the start (store.PlainKeys).
// Nothing is escaped, so keys are ambiguous where a domain, key or value
// holds "_" (docs/MIGRATION.md): those counters are shared with every
// request whose parts join to the same bytes, as in the reference.

// Plainable reports whether the reference's keys can count the rule
// (store.Hit.Plain): a fixed window of one unit, not a calendar's, narrow
// (at most store.MaxFixedWindowLimit), the only limit of its descriptor.
// Every other rule keeps Sluice's keys.
func (r *Rule) Plainable() bool {
	return r.Limit != nil && r.Limit.Plainable() && r.UnitMultiplier <= 1 && !r.Calendar && len(r.Limits()) == 1
}

// PlainKey appends the reference's cache key, up to its window start, for
// the rule Match found for entries in domainName: entries must be ones
// Match matched. Values matched by a share_threshold wildcard are written
// as the wildcard.
func (t *Table) PlainKey(dst []byte, domainName string, entries []Entry) []byte {
	d := t.domains[domainName]
	if d == nil || !d.shares {
		return PlainOverrideKey(dst, domainName, entries)
	}
	dst = append(append(dst, domainName...), '_')
	lv := d.root
	for _, e := range entries {
		v := e.Value
		if lv != nil {
			n := lv.pick(e)
			if n != nil && n.share != "" {
				v = n.share
			}
			lv = nil
			if n != nil {
				lv = n.children
			}
		}
		dst = append(append(dst, e.Key...), '_')
		dst = append(append(dst, v...), '_')
	}
	return dst
}

// PlainOverrideKey appends the reference's cache key, up to its window
// start, for a descriptor's limit override: the domain and the entries as
// sent (no wildcard applies).
func PlainOverrideKey(dst []byte, domainName string, entries []Entry) []byte {
	dst = append(append(dst, domainName...), '_')
	for _, e := range entries {
		dst = append(append(dst, e.Key...), '_')
		dst = append(append(dst, e.Value...), '_')
	}
	return dst
}

// PlainFits reports whether the reference's key can hold entries: no key
// or value longer than the table's MaxValueBytes. The reference writes
// them raw; past that bound a hit keeps Sluice's key, where they are
// hashed, so that no caller makes a counter key of its value's size (such
// counters are not shared with the reference's pods: docs/MIGRATION.md).
// The domain is bounded by the limiter (Options.MaxDomainBytes).
func (t *Table) PlainFits(entries []Entry) bool {
	for _, e := range entries {
		if len(e.Key) > t.max || len(e.Value) > t.max {
			return false
		}
	}
	return true
}
