package ui_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/observe/ui"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// churnLimits is generation gen of a config whose rules are renamed on
// every reload, as Envoy Gateway renames them when policies change: one
// detailed rule that stays (key "user"), and renamed-1 rules whose keys
// carry the generation.
func churnLimits(gen, rules int) string {
	var b strings.Builder
	b.WriteString("domain: churn\ndescriptors:\n")
	b.WriteString("  - {key: user, detailed_metric: true, rate_limit: {unit: hour, requests_per_unit: 1000000}}\n")
	for i := 1; i < rules; i++ {
		fmt.Fprintf(&b, "  - {key: g%d_r%d, rate_limit: {unit: minute, requests_per_unit: 100}}\n", gen, i)
	}
	return b.String()
}

// churn is the observability of a server fed by a real Reloader:
// per-rule counters told of every reload, a limiter, the traffic sampler.
type churn struct {
	dir     string
	reload  *config.Reloader
	reg     *prometheus.Registry
	rules   *observe.Rules
	lim     *limiter.Limiter
	traffic *ui.Traffic
	gen     int
	values  int // distinct values sent to the detailed rule
}

func newChurn(t testing.TB, rules int) *churn {
	t.Helper()
	c := &churn{dir: t.TempDir(), reg: prometheus.NewRegistry()}
	writeTB(t, c.dir, churnLimits(0, rules))
	var err error
	if c.reload, err = config.NewReloader(c.dir, config.Options{}, nil); err != nil {
		t.Fatal(err)
	}
	if c.rules, err = observe.NewRules(c.reg, observe.Options{}); err != nil {
		t.Fatal(err)
	}
	c.rules.SetTable(c.reload.Current())
	c.reload.OnReload(func(t *config.Table, _ error) { c.rules.SetTable(t) })
	c.lim = limiter.New(c.reload, memory.New(memory.Options{}), limiter.Options{Observer: c.rules, Clock: storetest.NewClock(t0)})
	c.traffic = ui.NewTraffic(c.rules, time.Second, ui.DefaultWindow)
	return c
}

// step sends traffic to some of the current rules and to ten new values
// of the detailed rule, samples, and loads the next generation.
func (c *churn) step(t testing.TB, rules int) {
	t.Helper()
	for i := 1; i < rules; i += 10 {
		c.send(t, fmt.Sprintf("g%d_r%d", c.gen, i), "x")
	}
	for range 10 {
		c.send(t, "user", fmt.Sprintf("u%d", c.values))
		c.values++
	}
	c.traffic.Sample(at(float64(c.gen)))
	c.gen++
	writeTB(t, c.dir, churnLimits(c.gen, rules))
	if err := c.reload.Reload(); err != nil {
		t.Fatal(err)
	}
}

func writeTB(t testing.TB, dir, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (c *churn) send(t testing.TB, key, value string) {
	t.Helper()
	req := &limiter.Request{Domain: "churn", Descriptors: []limiter.Descriptor{{Entries: []config.Entry{{Key: key, Value: value}}}}}
	if err := c.lim.Check(context.Background(), req, new(limiter.Response)); err != nil {
		t.Fatal(err)
	}
}

// scrape parses reg's /metrics, served over HTTP, from the text
// exposition.
func scrape(t testing.TB, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(observe.Handler(reg))
	defer srv.Close()
	res, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

func heapMB() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// TestChurn_BoundedByLiveConfig is issue 23's "Done means": after 40
// reloads of renamed rules through the real Reloader, /metrics holds the
// series of the live rules only, the detailed rule's 100 values (its cap
// held across reloads, the rest under _other), and the traffic JSON lists
// live rules only.
func TestChurn_BoundedByLiveConfig(t *testing.T) {
	const rules, reloads = 500, 40
	c := newChurn(t, rules)
	before := heapMB()
	for range reloads {
		c.step(t, rules)
	}
	c.traffic.Sample(at(float64(c.gen)))
	t.Logf("%d reloads of %d renamed rules: heap %.1f MB → %.1f MB", reloads, rules, before, heapMB())

	// Live: rules-1 plain rules, and the detailed rule's 100 values and
	// _other.
	want := rules - 1 + observe.DefaultMaxValuesPerRule + 1
	fams := scrape(t, c.reg)
	for _, name := range []string{"sluice_rule_hits_total", "sluice_rule_within_limit_total", "sluice_rule_over_limit_total",
		"sluice_rule_near_limit_total", "sluice_rule_shadow_mode_total", "sluice_rule_over_limit_local_cache_total"} {
		if got := len(fams[name].GetMetric()); got != want {
			t.Errorf("%s: %d series after %d reloads, want %d (the live rules')", name, got, reloads, want)
		}
	}
	var values, other float64
	for _, m := range fams["sluice_rule_hits_total"].GetMetric() {
		l := labels(m)
		switch {
		case l["rule"] != "user":
		case l["value"] == observe.OtherValue:
			other = m.GetCounter().GetValue()
		default:
			values++
		}
	}
	if values != observe.DefaultMaxValuesPerRule || other != float64(c.values-observe.DefaultMaxValuesPerRule) {
		t.Errorf("detailed rule: %v values and %v hits under _other, want %d and %d: the cap must hold across reloads",
			values, other, observe.DefaultMaxValuesPerRule, c.values-observe.DefaultMaxValuesPerRule)
	}

	live := map[string]bool{}
	for _, r := range c.reload.Current().Rules() {
		live[r.Path] = true
	}
	v := c.traffic.View()
	for _, r := range v.Rules {
		if !live[r.Rule] {
			t.Errorf("traffic lists %s, a rule that left the config", r.Rule)
		}
	}
}

func labels(m *dto.Metric) map[string]string {
	l := map[string]string{}
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// BenchmarkChurn_Sample measures the traffic sampler once 50 reloads of
// 2,000 renamed rules went through the real Reloader (issue 23's xDS
// case, in process): the sampler's cost each second with no traffic,
// and the heap then held (heap-MB).
func BenchmarkChurn_Sample(b *testing.B) {
	const rules, reloads = 2000, 50
	c := newChurn(b, rules)
	for range reloads {
		c.step(b, rules)
	}
	for range ui.DefaultWindow + 1 {
		c.gen++
		c.traffic.Sample(at(float64(c.gen)))
	}
	heap := heapMB()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		c.gen++
		c.traffic.Sample(at(float64(c.gen)))
	}
	b.ReportMetric(heap, "heap-MB")
}
