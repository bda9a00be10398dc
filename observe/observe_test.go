package observe_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const limits = `
domain: web
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: det
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: free
    rate_limit: {unlimited: true}
  - key: idle
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: path
    descriptors:
      - key: method
        value: GET
        rate_limit: {unit: second, requests_per_unit: 3}
`

// t0 is a minute boundary.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

// writeConfig writes body as the only limits file of a new directory.
func writeConfig(t testing.TB, body string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func loadTable(t testing.TB, body string) *config.Table {
	t.Helper()
	tab, err := config.Load(writeConfig(t, body), config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return tab
}

type tables struct{ t *config.Table }

func (t tables) Current() *config.Table { return t.t }

// scrape serves reg's metrics over HTTP and parses the answer with the
// Prometheus text parser.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(observe.Handler(reg))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("scrape does not parse: %v", err)
	}
	return fams
}

// value finds the sample of family name whose labels include want, and
// reports whether there is one.
func value(fams map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		got := map[string]string{}
		for _, l := range m.Label {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		case m.Untyped != nil:
			return m.Untyped.GetValue(), true
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount()), true
		}
	}
	return 0, false
}

func check(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := value(fams, name, labels)
	if !ok {
		t.Errorf("%s%v: no such series", name, labels)
	} else if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}

func desc(kv ...string) limiter.Descriptor {
	var d limiter.Descriptor
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func TestRules_CountsPerRule(t *testing.T) {
	tab := loadTable(t, limits)
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{MaxValuesPerRule: 2})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(tab)
	lim := limiter.New(tables{tab}, memory.New(memory.Options{}), limiter.Options{Observer: rules, Clock: storetest.NewClock(t0)})
	ctx := context.Background()
	send := func(n int, d limiter.Descriptor) {
		t.Helper()
		for range n {
			var resp limiter.Response
			if err := lim.Check(ctx, &limiter.Request{Domain: "web", Descriptors: []limiter.Descriptor{d}}, &resp); err != nil {
				t.Fatal(err)
			}
		}
	}
	send(12, desc("k", "a"))
	send(3, desc("shadow", "x"))
	send(2, desc("det", "a"))
	send(1, desc("det", "b"))
	send(4, desc("det", "c")) // past the cap of 2 values
	send(2, desc("free", ""))
	send(1, desc("path", "/", "method", "GET"))
	send(1, desc("nomatch", "x"))
	over := desc("custom", "v")
	over.Override = limiter.Override{RequestsPerUnit: 1, Unit: config.Minute}
	send(2, over)

	fams := scrape(t, reg)
	type series struct {
		rule, value                      string
		hits, within, over, near, shadow float64
	}
	for _, s := range []series{
		// 10 per minute, near at 0.8: the 8th, 9th and 10th hits are near.
		{"k", "", 12, 10, 2, 3, 0},
		{"shadow", "", 3, 1, 2, 1, 2},
		{"det", "det_a", 2, 2, 0, 0, 0},
		{"det", "det_b", 1, 1, 0, 0, 0},
		{"det", observe.OtherValue, 4, 4, 0, 0, 0},
		{"free", "", 2, 2, 0, 0, 0},
		{"path.method_GET", "", 1, 1, 0, 0, 0},
		{"idle", "", 0, 0, 0, 0, 0}, // exported before its first hit
		{observe.OverrideRule, "", 2, 1, 1, 1, 0},
	} {
		l := map[string]string{"domain": "web", "rule": s.rule, "value": s.value}
		check(t, fams, "sluice_rule_hits_total", l, s.hits)
		check(t, fams, "sluice_rule_within_limit_total", l, s.within)
		check(t, fams, "sluice_rule_over_limit_total", l, s.over)
		check(t, fams, "sluice_rule_near_limit_total", l, s.near)
		check(t, fams, "sluice_rule_shadow_mode_total", l, s.shadow)
	}
	if _, ok := value(fams, "sluice_rule_hits_total", map[string]string{"value": "det_c"}); ok {
		t.Error("a value past the cap has its own series")
	}
	if n := len(fams["sluice_rule_hits_total"].Metric); n != 9 {
		t.Errorf("sluice_rule_hits_total has %d series, want 9 (6 rules, 2 values + _other, 1 override)", n)
	}

	// Snapshot reads the same counters /metrics exports.
	snap := rules.Snapshot(nil)
	if len(snap) != 9 {
		t.Errorf("Snapshot has %d label sets, want 9", len(snap))
	}
	for _, c := range snap {
		l := map[string]string{"domain": c.Domain, "rule": c.Rule, "value": c.Value}
		check(t, fams, "sluice_rule_within_limit_total", l, float64(c.Within))
		check(t, fams, "sluice_rule_over_limit_total", l, float64(c.Over))
		check(t, fams, "sluice_rule_near_limit_total", l, float64(c.Near))
		check(t, fams, "sluice_rule_shadow_mode_total", l, float64(c.Shadow))
	}
}

// TestRules_CountsHitsAddend: every counter adds the descriptor's
// hits_addend, like the reference's stats; a check (0) adds nothing.
func TestRules_CountsHitsAddend(t *testing.T) {
	tab := loadTable(t, limits)
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(tab)
	lim := limiter.New(tables{tab}, memory.New(memory.Options{}), limiter.Options{Observer: rules, Clock: storetest.NewClock(t0)})
	send := func(hits uint64, d limiter.Descriptor) {
		t.Helper()
		req := &limiter.Request{Domain: "web", HitsAddend: hits, Descriptors: []limiter.Descriptor{d}}
		if err := lim.Check(context.Background(), req, new(limiter.Response)); err != nil {
			t.Fatal(err)
		}
	}
	check0 := desc("k", "a")
	check0.Cost, check0.HasCost = 0, true
	over := desc("custom", "v")
	over.Override = limiter.Override{RequestsPerUnit: 1, Unit: config.Minute}
	// k: 10 per minute, near from the 8th hit on.
	send(3, desc("k", "a")) // 3 used
	send(4, desc("k", "a")) // 7
	send(2, desc("k", "a")) // 9: the 8th and 9th are near
	send(5, desc("k", "a")) // denied: 5 over
	send(9, check0)         // a check: nothing
	send(1, desc("k", "a")) // 10: near
	send(3, desc("shadow", "x"))
	send(7, desc("free", ""))
	send(2, over)

	fams := scrape(t, reg)
	for _, s := range []struct {
		rule                             string
		hits, within, over, near, shadow float64
	}{
		{"k", 15, 10, 5, 3, 0},
		{"shadow", 3, 0, 3, 0, 3},
		{"free", 7, 7, 0, 0, 0},
		{observe.OverrideRule, 2, 0, 2, 0, 0},
	} {
		l := map[string]string{"domain": "web", "rule": s.rule, "value": ""}
		check(t, fams, "sluice_rule_hits_total", l, s.hits)
		check(t, fams, "sluice_rule_within_limit_total", l, s.within)
		check(t, fams, "sluice_rule_over_limit_total", l, s.over)
		check(t, fams, "sluice_rule_near_limit_total", l, s.near)
		check(t, fams, "sluice_rule_shadow_mode_total", l, s.shadow)
	}
}

// TestRules_CountsCharges: charges count as hits and as charged, those
// that did not fit as charged over the limit (the overspend); refunds
// count as refunded only.
func TestRules_CountsCharges(t *testing.T) {
	tab := loadTable(t, limits)
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(tab)
	lim := limiter.New(tables{tab}, memory.New(memory.Options{}), limiter.Options{Observer: rules, Clock: storetest.NewClock(t0)})
	send := func(kind limiter.Kind, cost uint64) {
		t.Helper()
		d := desc("k", "a")
		d.Cost, d.HasCost, d.Kind = cost, true, kind
		if err := lim.Check(context.Background(), &limiter.Request{Domain: "web", Descriptors: []limiter.Descriptor{d}}, new(limiter.Response)); err != nil {
			t.Fatal(err)
		}
	}
	send(limiter.Hits, 0)    // a peek: nothing
	send(limiter.Charge, 8)  // 8 of 10
	send(limiter.Charge, 30) // past the limit: 38 counted
	send(limiter.Hits, 1)    // denied
	send(limiter.Refund, 35) // 3 counted
	send(limiter.Hits, 2)    // within
	fams := scrape(t, reg)
	l := map[string]string{"domain": "web", "rule": "k", "value": ""}
	check(t, fams, "sluice_rule_hits_total", l, 41)
	check(t, fams, "sluice_rule_within_limit_total", l, 10)
	check(t, fams, "sluice_rule_over_limit_total", l, 31)
	check(t, fams, "sluice_rule_charged_total", l, 38)
	check(t, fams, "sluice_rule_charged_over_limit_total", l, 30)
	check(t, fams, "sluice_rule_refunded_total", l, 35)
	var got observe.Counts
	for _, c := range rules.Snapshot(nil) {
		if c.Rule == "k" {
			got = c.Counts
		}
	}
	if want := (observe.Counts{Within: 10, Over: 31, Near: 1, Charged: 38, ChargedOver: 30, Refunded: 35}); got != want {
		t.Errorf("Snapshot: %+v, want %+v", got, want)
	}
}

func TestRules_ReloadKeepsSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st := &limiter.Status{Code: limiter.OK, Limited: true, Hits: 1, Decision: store.Decision{Allowed: true, Limit: 10, Remaining: 9}}
	first := loadTable(t, limits)
	// Not passed to SetTable: resolved on first hit.
	rules.Observe("web", []config.Entry{{Key: "k", Value: "a"}}, first.Rules()[0], st)
	second := loadTable(t, limits+"  - key: extra\n    rate_limit: {unit: hour, requests_per_unit: 1}\n")
	rules.SetTable(second)
	rules.Observe("web", []config.Entry{{Key: "k", Value: "a"}}, second.Rules()[0], st)
	fams := scrape(t, reg)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"rule": "k"}, 2)
	check(t, fams, "sluice_rule_hits_total", map[string]string{"rule": "extra"}, 0)
}

func TestRules_NearLimitRatio(t *testing.T) {
	for _, c := range []struct {
		ratio     float64
		remaining uint64
		hits      uint64
		near      float64
	}{
		{0.5, 5, 1, 1}, {0.5, 6, 1, 0}, {0.9, 1, 1, 1}, {0.9, 2, 1, 0}, {1, 0, 1, 1}, {1, 1, 1, 0},
		// Of several hits only those that reached the threshold are near:
		// 5 → 9 used of 10 at 0.8 counts the 8th and 9th.
		{0.8, 1, 4, 2}, {0.8, 1, 2, 2}, {0.8, 3, 3, 0}, {0.5, 0, 10, 6},
		{0.8, 0, 0, 0}, // a check counts nothing
	} {
		reg := prometheus.NewRegistry()
		rules, err := observe.NewRules(reg, observe.Options{NearLimitRatio: c.ratio})
		if err != nil {
			t.Fatal(err)
		}
		tab := loadTable(t, limits)
		rules.Observe("web", nil, tab.Rules()[0], &limiter.Status{Code: limiter.OK, Limited: true, Hits: c.hits,
			Decision: store.Decision{Allowed: true, Limit: 10, Remaining: c.remaining}})
		got, _ := value(scrape(t, reg), "sluice_rule_near_limit_total", map[string]string{"rule": "k"})
		if got != c.near {
			t.Errorf("ratio %v, %d hits leaving 10 - %d used: near = %v, want %v", c.ratio, c.hits, c.remaining, got, c.near)
		}
	}
	if _, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{NearLimitRatio: 1.5}); err == nil {
		t.Error("ratio 1.5: no error")
	}
}

// Denials answered from a local over-limit cache count apart, per rule.
func TestRules_LocalCacheAnswers(t *testing.T) {
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rule := loadTable(t, limits).Rules()[0]
	for _, local := range []bool{true, true, false} {
		rules.Observe("web", nil, rule, &limiter.Status{Code: limiter.OverLimit, Limited: true, Hits: 2,
			Decision: store.Decision{Limit: 10, Local: local}})
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_rule_over_limit_total", map[string]string{"rule": "k"}, 6)
	check(t, fams, "sluice_rule_over_limit_local_cache_total", map[string]string{"rule": "k"}, 4)
}

// failStore fails every Take with err.
type failStore struct{ err error }

func (f failStore) Take(context.Context, int64, []store.Hit, []store.Decision) error { return f.err }

func TestRules_StoreFailures(t *testing.T) {
	tab := loadTable(t, limits)
	reg := prometheus.NewRegistry()
	rules, err := observe.NewRules(reg, observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err  error
		mode limiter.FailureMode
	}{{context.DeadlineExceeded, limiter.FailError}, {context.DeadlineExceeded, limiter.FailError}, {os.ErrClosed, limiter.FailAllow}} {
		lim := limiter.New(tables{tab}, failStore{c.err}, limiter.Options{Observer: rules, FailureMode: c.mode})
		lim.Check(context.Background(), &limiter.Request{Domain: "web", Descriptors: []limiter.Descriptor{desc("k", "a")}}, new(limiter.Response))
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_store_failures_total", map[string]string{"kind": "timeout", "mode": "error"}, 2)
	check(t, fams, "sluice_store_failures_total", map[string]string{"kind": "error", "mode": "allow"}, 1)
}

func TestRules_ObserveAllocsNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	rules, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tab := loadTable(t, limits)
	rules.SetTable(tab)
	rule, entries := tab.Rules()[0], []config.Entry{{Key: "k", Value: "a"}}
	st := &limiter.Status{Code: limiter.OK, Limited: true, Hits: 3, Decision: store.Decision{Allowed: true, Limit: 10, Remaining: 1}}
	if n := testing.AllocsPerRun(1000, func() { rules.Observe("web", entries, rule, st) }); n != 0 {
		t.Errorf("Observe allocates %v times per call, want 0", n)
	}
}

func TestConfigMetrics(t *testing.T) {
	dir := writeConfig(t, limits)
	r, err := config.NewReloader(dir, config.Options{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := observe.RegisterConfig(reg, r); err != nil {
		t.Fatal(err)
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_config_reloads_total", map[string]string{"result": "success"}, 1)
	check(t, fams, "sluice_config_reloads_total", map[string]string{"result": "failure"}, 0)
	check(t, fams, "sluice_config_last_reload_successful", nil, 1)
	check(t, fams, "sluice_config_info", map[string]string{"hash": r.Current().Hash()}, 1)
	if ts, _ := value(fams, "sluice_config_last_reload_success_timestamp_seconds", nil); ts < float64(time.Now().Add(-time.Minute).Unix()) {
		t.Errorf("last success timestamp %v is not recent", ts)
	}

	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"), []byte("domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Fatal("a bad config reloaded without error")
	}
	fams = scrape(t, reg)
	check(t, fams, "sluice_config_reloads_total", map[string]string{"result": "failure"}, 1)
	check(t, fams, "sluice_config_last_reload_successful", nil, 0)
	check(t, fams, "sluice_config_info", map[string]string{"hash": r.Current().Hash()}, 1)
}

func TestMemoryAndProcessMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := memory.New(memory.Options{})
	if err := observe.RegisterMemory(reg, st); err != nil {
		t.Fatal(err)
	}
	if err := observe.RegisterProcess(reg, observe.Build{Version: "v9.9.9", Commit: "abc"}); err != nil {
		t.Fatal(err)
	}
	rule, err := store.NewFixedWindow(5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]store.Decision, 1)
	for _, k := range []string{"a", "b", "c", "a"} {
		if err := st.Take(context.Background(), t0, []store.Hit{{Key: k, Rule: rule, Cost: 1, Veto: true}}, out); err != nil {
			t.Fatal(err)
		}
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_memory_keys", nil, 3)
	check(t, fams, "sluice_memory_inserts_total", nil, 3)
	check(t, fams, "sluice_memory_evictions_total", nil, 0)
	check(t, fams, "sluice_memory_swept_total", nil, 0)
	check(t, fams, "sluice_build_info", map[string]string{"version": "v9.9.9", "commit": "abc"}, 1)
	for _, name := range []string{"go_goroutines", "process_cpu_seconds_total"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
}

func TestInstrumentHTTP(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, err := observe.InstrumentHTTP(reg, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/over" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/ok", "/over", "/over"} {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, p, nil))
	}
	fams := scrape(t, reg)
	check(t, fams, "sluice_http_requests_total", map[string]string{"method": "post", "code": "200"}, 1)
	check(t, fams, "sluice_http_requests_total", map[string]string{"method": "post", "code": "429"}, 2)
	check(t, fams, "sluice_http_request_duration_seconds", map[string]string{"code": "429"}, 2)
	if b := fams["sluice_http_request_duration_seconds"].Metric[0].Histogram.Bucket; b[0].GetUpperBound() >= 0.001 {
		t.Errorf("first latency bucket %v s, want sub-millisecond", b[0].GetUpperBound())
	}
	if !strings.HasPrefix(fams["sluice_http_requests_total"].GetHelp(), "HTTP requests") {
		t.Errorf("help %q", fams["sluice_http_requests_total"].GetHelp())
	}
}
