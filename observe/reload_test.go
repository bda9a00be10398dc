package observe_test

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
)

// allowed is an allowed decision of one hit, far from the limit.
var allowed = &limiter.Status{Code: limiter.OK, Limited: true, Hits: 1, Decision: store.Decision{Allowed: true, Limit: 1000, Remaining: 999}}

// ruleOf finds the rule of t with path.
func ruleOf(t testing.TB, tab *config.Table, domain, path string) *config.Rule {
	t.Helper()
	for _, r := range tab.Rules() {
		if r.Domain == domain && r.Path == path {
			return r
		}
	}
	t.Fatalf("no rule %s.%s", domain, path)
	return nil
}

// labelSets lists the label sets Snapshot reports, sorted, as
// "domain/rule/value".
func labelSets(r *observe.Rules) []string {
	var out []string
	for _, c := range r.Snapshot(nil) {
		out = append(out, c.Domain+"/"+c.Rule+"/"+c.Value)
	}
	slices.Sort(out)
	return out
}

// TestRules_ReloadDropsRulesThatLeft: a reload keeps the counts of the
// rules that stay (same domain and path) and drops the series of those
// that left: a plain rule, a detailed rule's values, a detailed rule
// made plain, the override counts of a domain that left.
func TestRules_ReloadDropsRulesThatLeft(t *testing.T) {
	const first = `
domain: web
descriptors:
  - {key: stays, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: leaves, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: det, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}
`
	const second = `
domain: web
descriptors:
  - {key: stays, rate_limit: {unit: hour, requests_per_unit: 5}}
  - {key: det, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: added, rate_limit: {unit: minute, requests_per_unit: 10}}
`
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dir := writeConfig(t, first)
	if err := os.WriteFile(filepath.Join(dir, "old.yaml"), []byte("domain: old\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 10}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t1, err := config.Load(dir, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(t1)
	for _, p := range []string{"stays", "stays", "leaves"} {
		rules.Observe("web", nil, ruleOf(t, t1, "web", p), allowed)
	}
	rules.Observe("web", []config.Entry{{Key: "det", Value: "a"}}, ruleOf(t, t1, "web", "det"), allowed)
	rules.Observe("web", nil, nil, allowed) // an override
	rules.Observe("old", nil, nil, allowed)
	if got := strings.Join(labelSets(rules), " "); got != "old/_override/ old/k/ web/_override/ web/det/_other web/det/det_a web/leaves/ web/stays/" {
		t.Fatalf("before the reload: %s", got)
	}

	t2 := loadTable(t, second)
	rules.SetTable(t2)
	if got := strings.Join(labelSets(rules), " "); got != "web/_override/ web/added/ web/det/ web/stays/" {
		t.Errorf("after the reload: %s, want the second table's rules and web's overrides", got)
	}
	rules.Observe("web", nil, ruleOf(t, t2, "web", "stays"), allowed)
	fams := scrape(t, reg)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"rule": "stays"}, 3)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"rule": observe.OverrideRule, "domain": "web"}, 1)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"rule": "det", "value": ""}, 0)
	if n := len(fams["sluice_rule_hits_total"].GetMetric()); n != 4 {
		t.Errorf("/metrics has %d series of sluice_rule_hits_total, want 4", n)
	}
}

// TestRules_DetailedCapSurvivesReload: the cap on a detailed rule's
// values is the rule's (domain and path), not its table's: a reload
// neither starts it over nor forgets the values counted.
func TestRules_DetailedCapSurvivesReload(t *testing.T) {
	const body = "domain: web\ndescriptors:\n  - {key: user, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}\n"
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{MaxValuesPerRule: 2})
	if err != nil {
		t.Fatal(err)
	}
	hit := func(tab *config.Table, v string) {
		rules.Observe("web", []config.Entry{{Key: "user", Value: v}}, tab.Rules()[0], allowed)
	}
	var tab *config.Table
	for i := range 5 {
		tab = loadTable(t, body+fmt.Sprintf("# generation %d\n", i))
		rules.SetTable(tab)
		hit(tab, "a")
		hit(tab, fmt.Sprintf("v%d", i))
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"value": "user_a"}, 5)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"value": "user_v0"}, 1)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"value": observe.OtherValue}, 4)
	if n := len(fams["sluice_rule_hits_total"].GetMetric()); n != 3 {
		t.Errorf("%d series after 5 reloads, want 3 (2 values and _other)", n)
	}
}

// switchTables is a limiter.Tables the test switches.
type switchTables struct{ t atomic.Pointer[config.Table] }

func (s *switchTables) Current() *config.Table { return s.t.Load() }

// TestRules_HitsAcrossTheSwap: a request that matched the table before a
// reload counts with the live rule of the same path, or not at all if
// the rule left (no series comes back); one that matched the new table
// before SetTable ran (the reload hook) is counted, its series made.
func TestRules_HitsAcrossTheSwap(t *testing.T) {
	const first = "domain: web\ndescriptors:\n  - {key: stays, rate_limit: {unit: minute, requests_per_unit: 10}}\n" +
		"  - {key: leaves, rate_limit: {unit: minute, requests_per_unit: 10}}\n" +
		"  - {key: det, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}\n"
	const second = "domain: web\ndescriptors:\n  - {key: stays, rate_limit: {unit: minute, requests_per_unit: 10}}\n" +
		"  - {key: added, rate_limit: {unit: minute, requests_per_unit: 10}}\n"
	var tables switchTables
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{Tables: &tables})
	if err != nil {
		t.Fatal(err)
	}
	t1, t2 := loadTable(t, first), loadTable(t, second)
	tables.t.Store(t1)
	rules.SetTable(t1)

	// The reloader swapped in t2; its hook has not run yet.
	tables.t.Store(t2)
	rules.Observe("web", nil, ruleOf(t, t2, "web", "added"), allowed)
	rules.Observe("web", nil, ruleOf(t, t1, "web", "stays"), allowed)
	rules.SetTable(t2) // the hook
	// Requests that matched t1, answered after the reload.
	rules.Observe("web", nil, ruleOf(t, t1, "web", "stays"), allowed)
	rules.Observe("web", nil, ruleOf(t, t1, "web", "leaves"), allowed)
	rules.Observe("web", []config.Entry{{Key: "det", Value: "x"}}, ruleOf(t, t1, "web", "det"), allowed)
	rules.Observe("web", nil, ruleOf(t, t2, "web", "stays"), allowed)

	if got := strings.Join(labelSets(rules), " "); got != "web/added/ web/stays/" {
		t.Errorf("label sets %s, want the second table's only", got)
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"rule": "added"}, 1)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"rule": "stays"}, 3)
}

// TestRules_ReloadRace: requests holding rules of every table so far
// count while tables are swapped in and set: under -race nothing races
// or panics; a rule present in every table (plain or detailed) loses no
// hit; once the last table is set, only its label sets are left, and
// hits on rules of earlier tables bring none back; counter resets
// (Rules.Reset) alongside lose none either and leave no series of a
// rule that left.
func TestRules_ReloadRace(t *testing.T) {
	body := func(gen int) string {
		return fmt.Sprintf(`domain: web
descriptors:
  - {key: stable, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: det, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: g%d, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: g%d_det, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}
`, gen, gen)
	}
	const gens, workers, perWorker = 40, 4, 2000
	tabs := make([]*config.Table, gens)
	for i := range tabs {
		tabs[i] = loadTable(t, body(i))
	}
	var tables switchTables
	tables.t.Store(tabs[0])
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{Tables: &tables, MaxValuesPerRule: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(tabs[0])
	var newest, done atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				// The table in force, or one before it.
				tab := tabs[max(int(newest.Load())-i%3, 0)]
				for _, r := range tab.Rules() {
					rules.Observe("web", []config.Entry{{Key: r.Path, Value: fmt.Sprint(w*perWorker + i)}}, r, allowed)
					rules.Reset("web", r)
				}
				rules.Observe("web", nil, nil, allowed)
				rules.Reset("web", nil)
				done.Add(1)
			}
		})
	}
	wg.Go(func() {
		for g := 1; g < gens; g++ {
			for done.Load() < int64(g*workers*perWorker/gens) { // swaps spread over the run
				runtime.Gosched()
			}
			tables.t.Store(tabs[g])
			newest.Store(int64(g))
			rules.SetTable(tabs[g])
			rules.Snapshot(nil)
		}
	})
	wg.Wait()
	for _, tab := range tabs { // late requests on earlier tables
		for _, r := range tab.Rules() {
			rules.Observe("web", []config.Entry{{Key: r.Path, Value: "late"}}, r, allowed)
		}
	}

	var stable, det, overrides uint64
	for _, c := range rules.Snapshot(nil) {
		switch {
		case c.Rule == "stable" && c.Value == "":
			stable = c.Within
		case c.Rule == "det":
			det += c.Within
		case c.Rule == observe.OverrideRule:
			overrides = c.Within
		}
		if c.Rule != "stable" && c.Rule != "det" && c.Rule != observe.OverrideRule && !strings.HasPrefix(c.Rule, fmt.Sprintf("g%d", gens-1)) {
			t.Errorf("label set %s/%s/%s of a rule that left", c.Domain, c.Rule, c.Value)
		}
	}
	want := uint64(workers*perWorker + gens)
	if stable != want || det != want || overrides != workers*perWorker {
		t.Errorf("stable %d, det %d, overrides %d hits; want %d, %d, %d: a rule that stays loses no hit",
			stable, det, overrides, want, want, workers*perWorker)
	}
	for _, m := range gather(t, reg)["sluice_counter_resets_total"].GetMetric() {
		var rule string
		for _, l := range m.GetLabel() {
			if l.GetName() == "rule" {
				rule = l.GetValue()
			}
		}
		switch n := m.GetCounter().GetValue(); {
		case rule == "stable" || rule == "det" || rule == observe.ResetOverride:
			if n != workers*perWorker {
				t.Errorf("resets of %s: %v, want %d: a rule that stays loses no reset", rule, n, workers*perWorker)
			}
		case !strings.HasPrefix(rule, fmt.Sprintf("g%d", gens-1)):
			t.Errorf("resets of %s, a rule that left, still exported", rule)
		}
	}
}

// TestRules_DetailedRuleLeavesUnderLoad: a detailed rule leaves the
// config while requests that matched it add new values: once the reload
// is done and the requests in flight have returned, no value of it is
// left (one added after the drop would be exported until the next
// reload, which may never come).
func TestRules_DetailedRuleLeavesUnderLoad(t *testing.T) {
	t1 := loadTable(t, "domain: web\ndescriptors:\n  - {key: det, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}\n")
	t2 := loadTable(t, "domain: web\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 10}}\n")
	rule := t1.Rules()[0]
	const workers = 4
	for round := range 50 {
		rules, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{MaxValuesPerRule: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		rules.SetTable(t1)
		var hits atomic.Int64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					rules.Observe("web", []config.Entry{{Key: "det", Value: fmt.Sprint(w, "-", i)}}, rule, allowed)
					hits.Add(1)
				}
			})
		}
		for hits.Load() < 2000 {
			runtime.Gosched()
		}
		rules.SetTable(t2)
		close(stop)
		wg.Wait()
		if got := strings.Join(labelSets(rules), " "); got != "web/k/" {
			t.Fatalf("round %d: label sets after the detailed rule left: %.200s, want web/k/ only", round, got)
		}
	}
}

// gather reads reg's families by name.
func gather(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		m[f.GetName()] = f
	}
	return m
}

// TestRefStats_ForgetsRulesThatLeft: the reference's stats follow the
// config in force: a rule that left is forgotten by the sinks (the
// in-process exporter drops its series within a second), a rule that
// stays goes on counting, and a rule that comes back starts from its
// new counts.
func TestRefStats_ForgetsRulesThatLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// "a:b" leaves and "a_b" stays: their stats have one name.
		t1 := loadTable(t, "domain: web\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 100}}\n"+
			"  - {key: gone, rate_limit: {unit: minute, requests_per_unit: 100}}\n"+
			"  - {key: det, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 100}}\n"+
			"  - {key: 'a:b', rate_limit: {unit: minute, requests_per_unit: 100}}\n  - {key: a_b, rate_limit: {unit: minute, requests_per_unit: 100}}\n")
		t2 := loadTable(t, "domain: web\ndescriptors:\n  - {key: k, rate_limit: {unit: minute, requests_per_unit: 100}}\n"+
			"  - {key: a_b, rate_limit: {unit: minute, requests_per_unit: 100}}\n")
		rules, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{})
		if err != nil {
			t.Fatal(err)
		}
		rs := observe.NewRefStats(rules, nil, nil, observe.RefStatsOptions{})
		reg := prometheus.NewRegistry()
		mapped, err := observe.NewMappedSink(reg, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		mapped.Start()
		defer mapped.Close()
		rec := &recordSink{}
		flush := func() {
			t.Helper()
			if err := rs.Flush(rec, mapped); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond) // the exporter's second
			synctest.Wait()
		}
		hit := func(tab *config.Table, path, value string, n int) {
			for range n {
				rules.Observe("web", []config.Entry{{Key: path, Value: value}}, ruleOf(t, tab, "web", path), allowed)
			}
		}
		hits := func(key1 string) (float64, bool) {
			return value(gather(t, reg), "ratelimit_service_rate_limit_total_hits", map[string]string{"domain": "web", "key1": key1})
		}

		rules.SetTable(t1)
		hit(t1, "k", "", 2)
		hit(t1, "gone", "", 1)
		hit(t1, "det", "a", 1)
		flush()
		for _, key1 := range []string{"k", "gone", "det_a"} {
			if _, ok := hits(key1); !ok {
				t.Fatalf("no series of %s after the first flush", key1)
			}
		}

		rules.SetTable(t2)
		hit(t2, "k", "", 1)
		flush()
		const rl = "ratelimit.service.rate_limit.web."
		for _, name := range []string{rl + "gone.total_hits", rl + "det_a.within_limit", rl + "det._other.over_limit"} {
			if !slices.Contains(rec.forgot, name) {
				t.Errorf("%s not forgotten: %q", name, rec.forgot)
			}
		}
		if slices.ContainsFunc(rec.forgot, func(n string) bool { return strings.HasPrefix(n, rl+"k.") || strings.HasPrefix(n, rl+"a_b.") }) {
			t.Errorf("k or a_b, which stay, forgotten: %q", rec.forgot)
		}
		if v, _ := hits("k"); v != 3 {
			t.Errorf("k: %v hits, want 3", v)
		}
		for _, key1 := range []string{"gone", "det_a"} {
			if _, ok := hits(key1); ok {
				t.Errorf("the series of %s, which left, is still served", key1)
			}
		}

		rules.SetTable(t1) // gone comes back, its counts new
		hit(t1, "gone", "", 1)
		flush()
		if v, _ := hits("gone"); v != 1 {
			t.Errorf("gone, back: %v hits, want 1", v)
		}
	})
}

// TestMappedSink_SharedSeries: a series fed by several stat names (the
// default mapping keeps two parts of a longer key) stays until every
// name is forgotten; one fed again before it was dropped stays.
func TestMappedSink_SharedSeries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		sink, err := observe.NewMappedSink(reg, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		sink.Start()
		defer sink.Close()
		const a, b = "ratelimit.service.rate_limit.web.x.y.a.total_hits", "ratelimit.service.rate_limit.web.x.y.b.total_hits"
		served := func(step string, want float64) {
			t.Helper()
			if err := sink.Flush(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1500 * time.Millisecond)
			synctest.Wait()
			got, ok := value(gather(t, reg), "ratelimit_service_rate_limit_total_hits", map[string]string{"key1": "x", "key2": "y"})
			switch {
			case want == 0 && ok:
				t.Errorf("%s: the series is served (%v), want it dropped", step, got)
			case want != 0 && got != want:
				t.Errorf("%s: %v (served %v), want %v", step, got, ok, want)
			}
		}
		sink.Counter(a, 1)
		sink.Counter(b, 2)
		served("fed by a and b", 3)
		sink.Forget([]string{a})
		served("a forgotten", 3)
		sink.Forget([]string{b, "never.sent"})
		sink.Counter(b, 4) // fed again before the exporter's second
		served("b forgotten and fed again", 7)
		sink.Forget([]string{b})
		served("both forgotten", 0)
	})
}

// TestRules_ResetsDroppedWithTheRule: sluice_counter_resets_total has a
// series per rule (and per domain's overrides) once reset; a reload keeps
// the count of a rule that stays and drops the series of a rule, or a
// domain, that left; a reset of a rule of the earlier table that left
// counts nowhere.
func TestRules_ResetsDroppedWithTheRule(t *testing.T) {
	const first = `
domain: web
descriptors:
  - {key: stays, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: leaves, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: user, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 10}}
`
	const gone = `
domain: gone
descriptors:
  - {key: k, rate_limit: {unit: minute, requests_per_unit: 10}}
`
	const second = `
domain: web
descriptors:
  - {key: stays, rate_limit: {unit: minute, requests_per_unit: 10}}
`
	dir := t.TempDir()
	for name, body := range map[string]string{"web.yaml": first, "gone.yaml": gone} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t1, err := config.Load(dir, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.SetTable(t1)
	resets := func() map[string]float64 {
		got := map[string]float64{}
		for _, m := range gather(t, reg)["sluice_counter_resets_total"].GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got[l["domain"]+"/"+l["rule"]] = m.GetCounter().GetValue()
		}
		return got
	}
	if got := resets(); len(got) != 0 {
		t.Errorf("before any reset: %v, want no series", got)
	}
	leaves := ruleOf(t, t1, "web", "leaves")
	r.Reset("web", ruleOf(t, t1, "web", "stays"))
	r.Reset("web", ruleOf(t, t1, "web", "stays"))
	r.Reset("web", leaves)
	r.Reset("web", ruleOf(t, t1, "web", "user"))
	r.Reset("gone", ruleOf(t, t1, "gone", "k"))
	r.Reset("web", nil)
	r.Reset("gone", nil)
	r.Reset("unknown", nil) // a domain the config does not define
	want := map[string]float64{"web/stays": 2, "web/leaves": 1, "web/user": 1, "gone/k": 1, "web/override": 1, "gone/override": 1}
	if got := resets(); !maps.Equal(got, want) {
		t.Errorf("after resets: %v, want %v", got, want)
	}

	if err := os.WriteFile(filepath.Join(dir, "web.yaml"), []byte(second), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "gone.yaml"))
	t2, err := config.Load(dir, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.SetTable(t2)
	r.Reset("web", leaves) // a late reset of the earlier table's rule
	r.Reset("web", ruleOf(t, t2, "web", "stays"))
	want = map[string]float64{"web/stays": 3, "web/override": 1}
	if got := resets(); !maps.Equal(got, want) {
		t.Errorf("after the reload: %v, want %v (the rules and domain that left dropped)", got, want)
	}
}
