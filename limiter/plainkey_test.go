package limiter_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// plainLimits has a rule of every unit, nested descriptors, values and a
// domain with '_', share_threshold wildcards and the rules the reference's
// keys cannot express.
const plainLimits = `
domain: api_v1
descriptors:
  - {key: s, rate_limit: {unit: second, requests_per_unit: 5}}
  - {key: m, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: h, rate_limit: {unit: hour, requests_per_unit: 5}}
  - {key: d, rate_limit: {unit: day, requests_per_unit: 5}}
  - {key: w, rate_limit: {unit: week, requests_per_unit: 5}}
  - {key: mo, rate_limit: {unit: month, requests_per_unit: 5}}
  - {key: y, rate_limit: {unit: year, requests_per_unit: 5}}
  - key: user_id
    descriptors:
      - key: path
        value: /a_b
        rate_limit: {unit: minute, requests_per_unit: 10}
  - key: path
    value: "files*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: tenant
    value: "t-*"
    share_threshold: true
    descriptors:
      - key: op
        rate_limit: {unit: day, requests_per_unit: 10}
  - {key: tb, rate_limit: {unit: minute, requests_per_unit: 5, algorithm: token_bucket}}
  - {key: sw, rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}}
  - {key: cal, rate_limit: {unit: month, requests_per_unit: 5, calendar: true}}
  - {key: mult, rate_limit: {unit: second, unit_multiplier: 60, requests_per_unit: 5}}
  - {key: wide, rate_limit: {unit: hour, requests_per_unit: 5000000000}}
  - key: two
    rate_limits:
      - {unit: minute, requests_per_unit: 5}
      - {unit: hour, requests_per_unit: 50}
`

// plainNow is 2026-11-29 05:27:13 UTC.
const plainNow = 1795930033

// hitRecorder is a store that allows everything and records the hits.
type hitRecorder struct {
	mu   sync.Mutex
	hits []store.Hit
}

func (h *hitRecorder) Take(_ context.Context, _ int64, hits []store.Hit, out []store.Decision) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, x := range hits {
		x.Key = strings.Clone(x.Key)
		h.hits = append(h.hits, x)
		out[i] = store.Decision{Allowed: true, Limit: x.Rule.Limit(), Remaining: x.Rule.Limit()}
	}
	return nil
}

// TestPlainKey_Golden pins the keys and expiries envoyproxy/ratelimit
// writes: its src/limiter/cache_key.go (GenerateCacheKey: prefix, domain,
// "_", key "_" value "_" per entry, the share_threshold wildcard in place
// of a value matched by it, then the window start), src/utils/utilities.go
// (UnitToDivider: the unit lengths; floor(now/unit)*unit),
// src/config/config_impl.go (GetLimit: ShareThresholdKeyPattern, the
// wildcard value as written), src/redis/fixed_cache_impl.go (DoLimit:
// EXPIRE of the unit plus jitter after each INCRBY; SECOND-unit keys to the
// per-second client) and src/memcached/cache_impl.go (increaseAsync: ADD
// with the same expiry).
func TestPlainKey_Golden(t *testing.T) {
	rec := &hitRecorder{}
	clock := &fakeClock{}
	clock.now.Store(plainNow * 1e9)
	lim := limiter.New(tables{loadTable(t, plainLimits)}, rec, limiter.Options{Clock: clock, ReferenceKeys: true})
	pk := store.PlainKeys{Prefix: "pre:"}
	for _, c := range []struct {
		name   string
		d      limiter.Descriptor
		key    string // "" when the reference's keys cannot express the rule
		ttl    int64
		perSec bool // goes to the per-second Redis (REDIS_PERSECOND)
	}{
		{"second", desc("s", "x"), "pre:api_v1_s_x_1795930033", 1, true},
		{"minute", desc("m", "x"), "pre:api_v1_m_x_1795930020", 60, false},
		{"hour", desc("h", "x"), "pre:api_v1_h_x_1795928400", 3600, false},
		{"day", desc("d", "x"), "pre:api_v1_d_x_1795910400", 86400, false},
		{"week", desc("w", "x"), "pre:api_v1_w_x_1795651200", 604800, false},
		{"month", desc("mo", "x"), "pre:api_v1_mo_x_1793664000", 2592000, false},
		{"year", desc("y", "x"), "pre:api_v1_y_x_1766016000", 31536000, false},
		{"nested with underscores", desc("user_id", "u_1", "path", "/a_b"), "pre:api_v1_user_id_u_1_path_/a_b_1795930020", 60, false},
		{"share_threshold", desc("path", "files/a.txt"), "pre:api_v1_path_files*_1795928400", 3600, false},
		{"share_threshold nested", desc("tenant", "t-42", "op", "read"), "pre:api_v1_tenant_t-*_op_read_1795910400", 86400, false},
		{"override", limiter.Descriptor{Entries: desc("m", "x").Entries, Override: limiter.Override{RequestsPerUnit: 3, Unit: config.Hour}},
			"pre:api_v1_m_x_1795928400", 3600, false},
		{"token bucket", desc("tb", "x"), "", 0, false},
		{"sliding window", desc("sw", "x"), "", 0, false},
		{"calendar", desc("cal", "x"), "", 0, false},
		{"unit multiplier", desc("mult", "x"), "", 0, false},
		{"wide", desc("wide", "x"), "", 0, false},
		{"rate_limits", desc("two", "x"), "", 0, false},
		// A value past --max-value-bytes (256): Sluice's hashed key, never a
		// key of the value's size.
		{"value too long", desc("m", strings.Repeat("v", 257)), "", 0, false},
		{"override of a value too long", limiter.Descriptor{Entries: desc("m", strings.Repeat("v", 257)).Entries,
			Override: limiter.Override{RequestsPerUnit: 3, Unit: config.Hour}}, "", 0, false},
		{"value at the bound", desc("m", strings.Repeat("v", 256)), "pre:api_v1_m_" + strings.Repeat("v", 256) + "_1795930020", 60, false},
		{"override with a multiplier", limiter.Descriptor{Entries: desc("m", "x").Entries,
			Override: limiter.Override{RequestsPerUnit: 3, Unit: config.Second, UnitMultiplier: 60}}, "", 0, false},
	} {
		rec.hits = nil
		var resp limiter.Response
		if err := lim.Check(context.Background(), &limiter.Request{Domain: "api_v1", Descriptors: []limiter.Descriptor{c.d}}, &resp); err != nil {
			t.Fatalf("%s: Check: %v", c.name, err)
		}
		if len(rec.hits) == 0 {
			t.Fatalf("%s: no hit", c.name)
		}
		for _, h := range rec.hits {
			if c.key == "" {
				if h.Plain || !strings.Contains(h.Key, "|") {
					t.Errorf("%s: hit %q plain %v, want Sluice's key", c.name, h.Key, h.Plain)
				}
				continue
			}
			if !h.Plain {
				t.Errorf("%s: hit %q is not plain", c.name, h.Key)
				continue
			}
			if got := string(pk.Append(nil, h.Key, h.Rule, plainNow*1e9)); got != c.key {
				t.Errorf("%s: key %q, want %q", c.name, got, c.key)
			}
			if got := pk.TTL(h.Rule); got != c.ttl {
				t.Errorf("%s: TTL %d, want %d", c.name, got, c.ttl)
			}
			if got := h.Rule.Period() < 60e9; got != c.perSec {
				t.Errorf("%s: per-second %v, want %v", c.name, got, c.perSec)
			}
		}
	}
	// The jitter: rand.Int63n(EXPIRATION_JITTER_MAX_SECONDS), 0 to max-1.
	r, _ := store.NewFixedWindow(5, 60e9)
	seen := map[int64]bool{}
	for range 2000 {
		ttl := store.PlainKeys{JitterMax: 3}.TTL(r)
		if ttl < 60 || ttl > 62 {
			t.Fatalf("TTL with jitter 3: %d, want 60 to 62", ttl)
		}
		seen[ttl] = true
	}
	if len(seen) != 3 {
		t.Errorf("TTLs with jitter 3: %v, want each of 60, 61, 62", seen)
	}
}

// TestPlainKey_Default: without ReferenceKeys every key is Sluice's.
func TestPlainKey_Default(t *testing.T) {
	rec := &hitRecorder{}
	lim := limiter.New(tables{loadTable(t, plainLimits)}, rec, limiter.Options{})
	var resp limiter.Response
	if err := lim.Check(context.Background(), &limiter.Request{Domain: "api_v1", Descriptors: []limiter.Descriptor{desc("m", "x")}}, &resp); err != nil {
		t.Fatal(err)
	}
	if h := rec.hits[0]; h.Plain || h.Key != "api_v1|m=x|fw:60s" {
		t.Errorf("hit %q plain %v, want Sluice's api_v1|m=x|fw:60s", h.Key, h.Plain)
	}
}
