package config

import (
	"reflect"
	"testing"
)

const severalYAML = `
domain: api
descriptors:
  - key: user
    metadata:
      tier: gold
      seats: 3
      ratio: 0.5
      flags: [yes, off, "yes", ~]
      nested: {when: 2026-01-02, big: 0x10}
      <<: {tier: silver, merged: true}
    rate_limits:
      - {unit: second, requests_per_unit: 10, name: per_second}
      - {unit: day, requests_per_unit: 1000, name: per_day}
      - {unit: day, requests_per_unit: 500, shadow_mode: true}
      - {unit: minute, requests_per_unit: 100, algorithm: token_bucket, burst: 20}
  - key: single
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`

func TestLoad_RateLimits(t *testing.T) {
	tbl, err := compile([]source{{name: "f.yaml", data: []byte(severalYAML)}}, Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rule, key := tbl.Match("api", entries("user=bob"), nil)
	if rule == nil {
		t.Fatal("no rule for user=bob")
	}
	limits := rule.Limits()
	want := []struct {
		path, name, suffix string
		shadow             bool
	}{
		{"user[0]", "per_second", "|fw:1s", false},
		{"user[1]", "per_day", "|fw:86400s", false},
		// Same window as per_day: a counter of its own.
		{"user[2]", "", "|fw:86400s|2", true},
		{"user[3]", "", "|tb:100/60s:20", false},
	}
	if len(limits) != len(want) || rule != limits[0] {
		t.Fatalf("Limits() = %v, want %d limits starting with the matched rule", limits, len(want))
	}
	for i, w := range want {
		r := limits[i]
		if r.Path != w.path || r.Name != w.name || r.KeySuffix() != w.suffix || r.ShadowMode != w.shadow || r.Index != i {
			t.Errorf("limit %d: path %q name %q suffix %q shadow %v index %d; want %+v", i, r.Path, r.Name, r.KeySuffix(), r.ShadowMode, r.Index, w)
		}
		if &r.Limits()[0] != &limits[0] {
			t.Errorf("limit %d: Limits() is not the shared group", i)
		}
	}
	if got := string(key); got != "api|user=bob|fw:1s" {
		t.Errorf("key %q", got)
	}
	wantMeta := map[string]any{
		"tier": "gold", "seats": 3.0, "ratio": 0.5,
		"flags":  []any{true, false, "yes", nil},
		"nested": map[string]any{"when": "2026-01-02", "big": 16.0},
		"merged": true,
	}
	for _, r := range limits {
		if !reflect.DeepEqual(r.Metadata, wantMeta) {
			t.Errorf("%s metadata %#v, want %#v", r.Path, r.Metadata, wantMeta)
		}
	}
	// A single rate_limit keeps its path and key, and is its own group.
	single, key := tbl.Match("api", entries("single=x"), nil)
	if single.Path != "single" || string(key) != "api|single=x|fw:60s" || len(single.Limits()) != 1 || single.Metadata != nil {
		t.Errorf("single rule: path %q key %q limits %d metadata %v", single.Path, key, len(single.Limits()), single.Metadata)
	}
	if n := len(tbl.Rules()); n != 5 {
		t.Errorf("Rules() has %d, want 5 (every limit)", n)
	}
}
