package config

import (
	"slices"
	"strings"
)

// MaxBucketKeys is the most keys a quota bucket id may have and still match
// a rule; a longer id matches none.
const MaxBucketKeys = 8

// MatchBucket finds the rule for an Envoy rate-limit-quota bucket id (a
// map, so without order) and appends its counter key to dst, as Match does
// for a descriptor. A rule matches a bucket whose keys are exactly the keys
// of the rule's descriptor path, in any order; each value is matched as in
// Match (the same value, else the first matching wildcard, else the key
// alone). When several paths match, the most specific wins: the one with
// more exact values, then more wildcard values; a remaining tie goes to
// the path whose keys come first in byte order. The counter key is the one
// Match gives for the bucket's entries in the winning path's order, so a
// bucket and a descriptor naming the same values share a counter.
//
// rule is nil (and dst is returned unchanged) for an unknown domain, an
// empty bucket, one with more than MaxBucketKeys keys, or no match.
func (t *Table) MatchBucket(domainName string, bucket map[string]string, dst []byte) (rule *Rule, key []byte) {
	d := t.domains[domainName]
	if d == nil || len(bucket) == 0 || len(bucket) > MaxBucketKeys {
		return nil, dst
	}
	var buf [MaxBucketKeys]Entry
	es := buf[:0]
	for k, v := range bucket {
		es = append(es, Entry{Key: k, Value: v})
	}
	slices.SortFunc(es, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	s := bucketSearch{rest: es}
	s.walk(d.root, 0, score{})
	if s.best == nil {
		return nil, dst
	}
	return t.Match(domainName, s.order[:len(es)], dst)
}

// score ranks a matched path: more exact values first, then more wildcards.
type score struct{ exact, wild int }

func (a score) better(b score) bool {
	if a.exact != b.exact {
		return a.exact > b.exact
	}
	return a.wild > b.wild
}

// bucketSearch tries every order of a bucket's keys that the config tree
// allows. Each level offers only the keys it has, and a path is at most
// MaxBucketKeys deep, so the search is bounded by the config's shape.
type bucketSearch struct {
	rest      []Entry // the entries not placed yet (order kept)
	path      [MaxBucketKeys]Entry
	order     [MaxBucketKeys]Entry // the best path found
	best      *Rule
	bestScore score
}

func (s *bucketSearch) walk(lv *level, depth int, sc score) {
	for i, e := range s.rest {
		kn := lv.keys[e.Key]
		if kn == nil {
			continue
		}
		n := lv.pick(e)
		if n == nil {
			continue
		}
		next := sc
		switch {
		case kn.exact[e.Value] == n:
			next.exact++
		case n != kn.def:
			next.wild++
		}
		s.path[depth] = e
		if len(s.rest) == 1 {
			if n.rule != nil && (s.best == nil || next.better(s.bestScore)) {
				s.best, s.bestScore = n.rule, next
				copy(s.order[:], s.path[:depth+1])
			}
			continue
		}
		if n.children == nil {
			continue
		}
		// The deeper levels place the other entries.
		all := s.rest
		s.rest = slices.Delete(slices.Clone(all), i, i+1)
		s.walk(n.children, depth+1, next)
		s.rest = all
	}
}
