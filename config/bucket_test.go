package config

import (
	"strings"
	"testing"
)

// bucket builds a quota bucket id from "k=v" pairs.
func bucket(pairs ...string) map[string]string {
	m := make(map[string]string, len(pairs))
	for _, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		m[k] = v
	}
	return m
}

func TestMatchBucket(t *testing.T) {
	tbl := mustCompile(t, `
domain: q
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: tenant
    value: "ac*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 2}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 4}
  - key: path
    value: /api
    descriptors:
      - key: tenant
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: route
    value: "api/*"
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 6, algorithm: token_bucket, burst: 12}
  - key: deep
    descriptors:
      - key: er
        descriptors:
          - key: est
            rate_limit: {unit: hour, requests_per_unit: 7}
`)
	cases := []struct {
		bucket map[string]string
		limit  uint64 // 0: no rule
		key    string
	}{
		{bucket("tenant=acme"), 2, "q|tenant=acme|fw:1s"},
		{bucket("tenant=acorn"), 3, "q|tenant=acorn|fw:1s"},
		{bucket("tenant=zeta"), 1, "q|tenant=zeta|fw:1s"},
		// Two orders match; tenant=acme then path has one exact value,
		// path=/api then tenant has one too, and the tie goes to the
		// first key in byte order ("path").
		{bucket("tenant=acme", "path=/api"), 5, "q|path=/api|tenant=acme|fw:60s"},
		// Only tenant → path matches: path=/x finds no /api descriptor.
		{bucket("path=/x", "tenant=acme"), 4, "q|tenant=acme|path=/x|fw:60s"},
		// share_threshold: the pattern stands in for the route.
		{bucket("user=bob", "route=api/v1"), 6, "q|route=api/*|user=bob|tb:6/60s:12"},
		{bucket("est=1", "deep=2", "er=3"), 7, "q|deep=2|er=3|est=1|fw:3600s"},
		// Keys must be exactly the path's keys.
		{bucket("deep=2", "er=3"), 0, ""},
		{bucket("tenant=acme", "extra=1"), 0, ""},
		{bucket("route=api/v1"), 0, ""},
		{bucket(), 0, ""},
		{bucket("a=1", "b=2", "c=3", "d=4", "e=5", "f=6", "g=7", "h=8", "i=9"), 0, ""},
	}
	for i, c := range cases {
		for range 5 { // map order varies between runs; the answer must not
			rule, key := tbl.MatchBucket("q", c.bucket, []byte("p:"))
			if c.limit == 0 {
				if rule != nil || string(key) != "p:" {
					t.Fatalf("case %d: MatchBucket(%v) = %v, %q; want no rule", i, c.bucket, rule, key)
				}
				continue
			}
			if rule == nil || rule.RequestsPerUnit != c.limit {
				t.Fatalf("case %d: MatchBucket(%v) = %v, want the rule of %d", i, c.bucket, rule, c.limit)
			}
			if string(key) != "p:"+c.key {
				t.Fatalf("case %d: MatchBucket(%v) key %q, want %q", i, c.bucket, key, "p:"+c.key)
			}
		}
	}
	if rule, _ := tbl.MatchBucket("nope", bucket("tenant=acme"), nil); rule != nil {
		t.Errorf("unknown domain matched %v", rule)
	}
}

// FuzzMatchBucket checks MatchBucket against trying every order of the
// bucket's entries with Match: it finds a rule exactly when some order
// does, that rule is one of theirs, and its key is that order's key.
func FuzzMatchBucket(f *testing.F) {
	var b strings.Builder
	b.WriteString("domain: fz\ndescriptors:\n")
	specYAML(&b, fuzzSpecs, "  ")
	tbl := mustCompile(f, b.String())
	f.Add(uint8(1), "a", "x", "", "", "", "")
	f.Add(uint8(2), "c", "1", "b", "", "", "")
	f.Add(uint8(3), "d", "z", "c", "z", "b", "q")
	f.Add(uint8(2), "u", "me", "s", "f/1", "", "")
	f.Fuzz(func(t *testing.T, n uint8, k1, v1, k2, v2, k3, v3 string) {
		m := map[string]string{}
		for _, e := range []Entry{{k1, v1}, {k2, v2}, {k3, v3}}[:n%4] {
			m[e.Key] = e.Value
		}
		rule, key := tbl.MatchBucket("fz", m, []byte("pre"))
		var es []Entry
		for k, v := range m {
			es = append(es, Entry{k, v})
		}
		found := false
		permute(es, 0, func(order []Entry) {
			r, k := tbl.Match("fz", order, []byte("pre"))
			if r != nil && r == rule && string(k) == string(key) {
				found = true
			}
			if r != nil && rule == nil {
				t.Fatalf("MatchBucket(%q) = nil, but order %q matches %s", m, order, r)
			}
		})
		if rule != nil && !found {
			t.Fatalf("MatchBucket(%q) = %s, %q: no order of the entries gives that", m, rule, key)
		}
	})
}

func permute(es []Entry, i int, fn func([]Entry)) {
	if i == len(es) {
		fn(es)
		return
	}
	for j := i; j < len(es); j++ {
		es[i], es[j] = es[j], es[i]
		permute(es, i+1, fn)
		es[i], es[j] = es[j], es[i]
	}
}
