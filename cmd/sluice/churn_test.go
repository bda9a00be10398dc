package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/observe/ui"
)

// renamedLimits is push gen of a config whose rules Envoy Gateway renames
// on every policy change: a detailed rule that stays (key "user") and
// rules-1 rules whose keys carry the generation.
func renamedLimits(gen, rules int) *ratelimitpb.RateLimitConfig {
	cfg := &ratelimitpb.RateLimitConfig{Name: "churn", Domain: "churn", Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "user", DetailedMetric: true,
		RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: 1000000},
	}}}
	for i := 1; i < rules; i++ {
		cfg.Descriptors = append(cfg.Descriptors, &ratelimitpb.RateLimitDescriptor{Key: fmt.Sprintf("g%d_r%d", gen, i),
			RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: 100}})
	}
	return cfg
}

// getFamilies parses url's Prometheus text exposition.
func getFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("%s does not parse: %v", url, err)
	}
	return fams
}

// gauge is the value of the gauge name, without labels; -1 if /metrics
// lacks it.
func gauge(fams map[string]*dto.MetricFamily, name string) float64 {
	if m := fams[name].GetMetric(); len(m) == 1 {
		return m[0].GetGauge().GetValue()
	}
	return -1
}

// TestServe_XDSRenamedRulesBounded is issue 23's finding over xDS: 40
// pushes of renamed rules, each with traffic, leave /metrics with the
// series of the rules in force only, the detailed rule's values capped
// across the pushes, and the status page's traffic with live rules only.
func TestServe_XDSRenamedRulesBounded(t *testing.T) {
	const rules, pushes, node = 100, 40, "churn"
	xs := xdstest.Start(t, "127.0.0.1:0", nil)
	grpcAddr, httpAddr, _ := startServe(t, nil, "--config-source", "xds", "--xds-server", xs.Addr, "--xds-node-id", node,
		"--xds-backoff-initial", "10ms")
	rls, _ := dialRLS(t, grpcAddr)
	users := 0
	for gen := 0; gen <= pushes; gen++ {
		version := strconv.Itoa(gen)
		xs.Push(t, node, version, renamedLimits(gen, rules))
		for r := xs.Reply(t); r.GetVersionInfo() != version || r.GetErrorDetail() != nil; r = xs.Reply(t) {
			if r.GetErrorDetail() != nil {
				t.Fatalf("push %d NACKed: %v", gen, r.GetErrorDetail())
			}
		}
		for i := 1; i < rules; i += 10 {
			if _, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("churn", fmt.Sprintf("g%d_r%d", gen, i), "x")); err != nil {
				t.Fatal(err)
			}
		}
		for range 5 {
			if _, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("churn", "user", fmt.Sprint("u", users))); err != nil {
				t.Fatal(err)
			}
			users++
		}
	}

	fams := getFamilies(t, "http://"+httpAddr+"/metrics")
	live := fmt.Sprintf("g%d_", pushes) // the path prefix of the rules in force
	for _, name := range []string{"sluice_rule_hits_total", "sluice_rule_within_limit_total", "sluice_rule_over_limit_total",
		"sluice_rule_near_limit_total", "sluice_rule_shadow_mode_total", "sluice_rule_over_limit_local_cache_total"} {
		var pushed, user int
		for _, m := range fams[name].GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			switch {
			case l["rule"] == "user":
				user++
			case !strings.HasPrefix(l["rule"], live):
				t.Errorf("%s: a series of %s, a rule of an earlier push", name, l["rule"])
			default:
				pushed++
			}
		}
		// The detailed rule's 100 values (of 205 sent) and _other.
		if pushed != rules-1 || user != 101 {
			t.Errorf("%s: %d series of the pushed rules and %d of the detailed rule after %d pushes, want %d and 101",
				name, pushed, user, pushes, rules-1)
		}
	}

	// The gauges of what the per-rule counters and the status page hold
	// (the status page samples once a second: it may not have seen the
	// last push, and holds one push's rules at most).
	if g := gauge(fams, "sluice_rule_label_sets"); g != rules-1+101 {
		t.Errorf("sluice_rule_label_sets = %v, want %d (the series of each sluice_rule_* family)", g, rules-1+101)
	}
	if g := gauge(fams, "sluice_ui_traffic_rules"); g > rules {
		t.Errorf("sluice_ui_traffic_rules = %v, want at most %d (one push's rules)", g, rules)
	}
	if g := gauge(fams, "sluice_ui_traffic_bytes"); g <= 0 || g > 1<<20 {
		t.Errorf("sluice_ui_traffic_bytes = %v, want more than 0 and under 1 MiB (%d rules × 61 samples × 32 bytes is 195 KiB)", g, rules)
	}

	res, err := http.Get("http://" + httpAddr + "/ui/api/traffic")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var v ui.TrafficView
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	for _, r := range v.Rules {
		if r.Rule != "user" && !strings.HasPrefix(r.Rule, live) {
			t.Errorf("the status page's traffic lists %s, a rule of an earlier push", r.Rule)
		}
	}
}
