package observe_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/observe"
)

// TestRules_LabelSetsGauge: sluice_rule_label_sets is the number of
// series of each sluice_rule_* family, at every reload of renamed rules:
// the live rules', a detailed rule's capped values and _other, and the
// override counts of a live domain; it does not grow with the reloads.
func TestRules_LabelSetsGauge(t *testing.T) {
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{MaxValuesPerRule: 3})
	if err != nil {
		t.Fatal(err)
	}
	if got := rules.LabelSets(); got != 0 {
		t.Fatalf("before a table: %d label sets, want 0", got)
	}
	const renamed = 20
	for gen := range 10 {
		var b strings.Builder
		b.WriteString("domain: web\ndescriptors:\n")
		b.WriteString("  - {key: user, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}\n")
		for i := range renamed {
			fmt.Fprintf(&b, "  - {key: route-%d-g%d, rate_limit: {unit: minute, requests_per_unit: 10}}\n", i, gen)
		}
		tab := loadTable(t, b.String())
		rules.SetTable(tab)
		for v := range 5 { // past the cap of 3
			rules.Observe("web", []config.Entry{{Key: "user", Value: fmt.Sprintf("g%d-%d", gen, v)}}, ruleOf(t, tab, "web", "user"), allowed)
		}
		rules.Observe("web", nil, ruleOf(t, tab, "web", fmt.Sprintf("route-0-g%d", gen)), allowed)
		rules.Observe("web", nil, nil, allowed) // an override

		fams := scrape(t, reg)
		const want = renamed + 3 + 1 + 1 // the routes, 3 values and _other, web's overrides
		check(t, fams, "sluice_rule_label_sets", nil, want)
		for _, name := range []string{"sluice_rule_hits_total", "sluice_rule_within_limit_total", "sluice_rule_over_limit_total"} {
			if n := len(fams[name].GetMetric()); n != want {
				t.Errorf("generation %d: %d series of %s, want %d (the gauge's)", gen, n, name, want)
			}
		}
		if got := rules.LabelSets(); got != want {
			t.Errorf("generation %d: LabelSets() = %d, want %d", gen, got, want)
		}
	}
}
