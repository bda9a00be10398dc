package server

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

func TestAppendSFString(t *testing.T) {
	for in, want := range map[string]string{
		"per_day":     `"per_day"`,
		`a"b\c`:       `"a\"b\\c"`,
		"caf\u00e9\t": `"caf???"`,
		"":            `""`,
	} {
		if got := string(appendSFString(nil, in)); got != want {
			t.Errorf("appendSFString(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestIETFFields_Override: an override is the policy "override" with its
// own window (unit × multiplier); a denied limit has r=0; a partial
// second of reset rounds up.
func TestIETFFields_Override(t *testing.T) {
	r := &limiter.Response{Statuses: []limiter.Status{
		{Limited: true, RequestsPerUnit: 5, Unit: config.Minute, UnitMultiplier: 2,
			Decision: store.Decision{Allowed: false, Remaining: 3, ResetAfter: 1500 * time.Millisecond}},
		{}, // no rule: not listed
	}}
	policy, limits := ietfFields(r)
	if string(policy) != `"override";q=5;w=120` || string(limits) != `"override";r=0;t=2` {
		t.Errorf("override: RateLimit-Policy %s, RateLimit %s", policy, limits)
	}
	if p, l := ietfFields(&limiter.Response{Statuses: []limiter.Status{{}}}); len(p) != 0 || len(l) != 0 {
		t.Errorf("no limit: %q %q, want nothing", p, l)
	}
}
