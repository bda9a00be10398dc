package observe_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// TestRules_SeveralLimits: each limit of a rate_limits list has its own
// series, named path[i], counting its own outcome.
func TestRules_SeveralLimits(t *testing.T) {
	tab := loadTable(t, `
domain: web
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 2}
      - {unit: hour, requests_per_unit: 10}
      - {unit: hour, requests_per_unit: 1, shadow_mode: true}
`)
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(tab)
	lim := limiter.New(tables{tab}, memory.New(memory.Options{}), limiter.Options{Observer: rules, Clock: storetest.NewClock(t0)})
	for range 3 {
		var resp limiter.Response
		req := &limiter.Request{Domain: "web", Descriptors: []limiter.Descriptor{{Entries: []config.Entry{{Key: "user", Value: "u"}}}}}
		if err := lim.Check(context.Background(), req, &resp); err != nil {
			t.Fatal(err)
		}
	}
	fams := scrape(t, reg)
	for _, s := range []struct {
		rule                       string
		within, over, near, shadow float64
	}{
		// The third request is denied by the minute limit: the hour
		// limit reports it within (nothing consumed), the shadow limit
		// over (it had room for one).
		{"user[0]", 2, 1, 1, 0},
		{"user[1]", 3, 0, 0, 0},
		{"user[2]", 1, 2, 1, 2},
	} {
		l := map[string]string{"domain": "web", "rule": s.rule, "value": ""}
		check(t, fams, "sluice_rule_within_limit_total", l, s.within)
		check(t, fams, "sluice_rule_over_limit_total", l, s.over)
		check(t, fams, "sluice_rule_near_limit_total", l, s.near)
		check(t, fams, "sluice_rule_shadow_mode_total", l, s.shadow)
	}
}
