package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/observe/ui"
	"github.com/sluicehq/sluice/store/memory"
)

const limits = `
domain: web
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: api_key
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: upload
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, algorithm: token_bucket, burst: 3, name: uploads}
  - key: health
    rate_limit: {unlimited: true}
`

// rig is a page over a real limiter, its per-rule counters and a config
// directory, served on a loopback listener.
type rig struct {
	dir     string
	reload  *config.Reloader
	lim     *limiter.Limiter
	traffic *ui.Traffic
	url     string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{dir: t.TempDir()}
	write(t, r.dir, "limits.yaml", limits)
	var err error
	if r.reload, err = config.NewReloader(r.dir, config.Options{}, nil); err != nil {
		t.Fatal(err)
	}
	rules, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rules.SetTable(r.reload.Current())
	st := memory.New(memory.Options{})
	r.lim = limiter.New(r.reload, st, limiter.Options{Observer: rules})
	r.traffic = ui.NewTraffic(rules, time.Second, 60)
	page, err := ui.New(ui.Options{Tables: r.reload, Reload: r.reload, Traffic: r.traffic, Store: ui.MemoryStatus(st),
		Source: func() ui.Source { return ui.Source{Kind: "file", Location: r.dir} },
		Build:  observe.Build{Version: "v1.2.3", Commit: "abc"}, Started: time.Now().Add(-time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(page.Handler())
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return r
}

func write(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) send(t *testing.T, key, value string) {
	t.Helper()
	var resp limiter.Response
	req := &limiter.Request{Domain: "web", Descriptors: []limiter.Descriptor{{Entries: []config.Entry{{Key: key, Value: value}}}}}
	if err := r.lim.Check(context.Background(), req, &resp); err != nil {
		t.Fatal(err)
	}
}

func get(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func getJSON(t *testing.T, url string, v any) string {
	t.Helper()
	res, body := get(t, url)
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET %s: %s %s", url, res.Status, res.Header.Get("Content-Type"))
	}
	if err := json.Unmarshal([]byte(body), v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return body
}

func TestOverview(t *testing.T) {
	r := newRig(t)
	var o ui.Overview
	getJSON(t, r.url+"/ui/api/overview", &o)
	c := o.Config
	if o.Version != "v1.2.3" || !o.Serving || o.UptimeS < 60 || o.Store.Kind != "memory" || !o.Store.Healthy ||
		c.Source == nil || c.Source.Location != r.dir || !c.Loaded || !c.LastOK || c.Rules != 4 || c.Domains != 1 ||
		c.Files != 1 || fmt.Sprint(c.FileNames) != "["+filepath.Join(r.dir, "limits.yaml")+"]" || c.Hash == "" || c.LastSuccess == nil || c.LastError != nil {
		t.Fatalf("overview %+v, config %+v", o, c)
	}

	// A failed reload: the old config stays, the problems have file:line.
	write(t, r.dir, "limits.yaml", "domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	if err := r.reload.Reload(); err == nil {
		t.Fatal("reload of a bad config succeeded")
	}
	getJSON(t, r.url+"/ui/api/overview", &o)
	c = o.Config
	if !c.Loaded || c.LastOK || c.Failures != 1 || c.Rules != 4 || c.LastError == nil || len(c.LastError.Problems) != 1 {
		t.Fatalf("after a failed reload: %+v", c)
	}
	if p := c.LastError.Problems[0]; p.File != filepath.Join(r.dir, "limits.yaml") || p.Line != 4 || !strings.Contains(p.Msg, "fortnight") {
		t.Errorf("problem %+v, want limits.yaml:4 and the unit", p)
	}
}

// TestOverview_ProblemsBounded: a config with very many problems lists
// MaxProblems of them and counts the rest.
func TestOverview_ProblemsBounded(t *testing.T) {
	r := newRig(t)
	var b strings.Builder
	b.WriteString("domain: web\ndescriptors:\n")
	for i := range ui.MaxProblems + 7 {
		fmt.Fprintf(&b, "  - key: k%d\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", i)
	}
	write(t, r.dir, "limits.yaml", b.String())
	r.reload.Reload()
	var o ui.Overview
	body := getJSON(t, r.url+"/ui/api/overview", &o)
	if e := o.Config.LastError; e == nil || len(e.Problems) != ui.MaxProblems || e.More != 7 {
		t.Fatalf("last error %+v, want %d problems and 7 more", e, ui.MaxProblems)
	}
	if len(body) > 16<<10 {
		t.Errorf("overview is %d bytes", len(body))
	}
}

func TestLimits(t *testing.T) {
	r := newRig(t)
	var v ui.LimitsView
	getJSON(t, r.url+"/ui/api/limits", &v)
	if v.Total != 4 || len(v.Rules) != 4 || v.Truncated || v.Hash == "" || fmt.Sprint(v.Domains) != "[web]" {
		t.Fatalf("limits %+v", v)
	}
	want := []ui.RuleInfo{
		{Domain: "web", Path: "remote_address", Limit: "2 per minute", Algorithm: "fixed_window", Unit: "minute", RequestsPerUnit: 2},
		{Domain: "web", Path: "api_key", Limit: "100 per minute", Algorithm: "fixed_window", Unit: "minute", RequestsPerUnit: 100, Flags: []string{"detailed_metric"}},
		{Domain: "web", Path: "upload", Name: "uploads", Limit: "1 per minute, burst 3", Algorithm: "token_bucket", Unit: "minute", RequestsPerUnit: 1, Burst: 3, Shadow: true},
		{Domain: "web", Path: "health", Limit: "unlimited", Unlimited: true},
	}
	for i, w := range want {
		g := v.Rules[i]
		g.File, g.Line = "", 0
		if fmt.Sprintf("%+v", g) != fmt.Sprintf("%+v", w) {
			t.Errorf("rule %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	if v.Rules[0].File == "" || v.Rules[0].Line != 4 {
		t.Errorf("rule 0 at %s:%d, want limits.yaml:4", v.Rules[0].File, v.Rules[0].Line)
	}
}

func TestLimits_Bounded(t *testing.T) {
	r := newRig(t)
	var b strings.Builder
	b.WriteString("domain: web\ndescriptors:\n")
	for i := range ui.MaxRules + 3 {
		fmt.Fprintf(&b, "  - {key: k%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	write(t, r.dir, "limits.yaml", b.String())
	if err := r.reload.Reload(); err != nil {
		t.Fatal(err)
	}
	var v ui.LimitsView
	getJSON(t, r.url+"/ui/api/limits", &v)
	if v.Total != ui.MaxRules+3 || len(v.Rules) != ui.MaxRules || !v.Truncated {
		t.Fatalf("total %d, %d listed, truncated %v", v.Total, len(v.Rules), v.Truncated)
	}
}

// TestTraffic_NoValuesLeak: descriptor values of real traffic appear in
// no answer of the page, except the values of a detailed_metric rule in
// the traffic JSON.
func TestTraffic_NoValuesLeak(t *testing.T) {
	r := newRig(t)
	r.traffic.Sample(time.Now().UnixNano())
	for range 3 {
		r.send(t, "remote_address", "198.51.100.23")
		r.send(t, "upload", "secret-upload-token")
	}
	r.send(t, "health", "secret-health-probe")
	r.send(t, "api_key", "detailed-key-1")
	r.traffic.Sample(time.Now().UnixNano() + 1)

	var v ui.TrafficView
	body := getJSON(t, r.url+"/ui/api/traffic", &v)
	got := map[string]ui.RuleTraffic{}
	for _, rt := range v.Rules {
		got[rt.Rule] = rt
	}
	if ra := got["remote_address"]; ra.Total.Within != 2 || ra.Total.Over != 1 || ra.Window.Over != 1 || ra.Values != nil {
		t.Errorf("remote_address %+v: want 2 within, 1 over, no values", ra)
	}
	if up := got["upload"]; up.Total.Shadow != 0 || up.Total.Within != 3 {
		t.Errorf("upload %+v", up)
	}
	if ak := got["api_key"]; len(ak.Values) != 1 || ak.Values[0].Value != "api_key_detailed-key-1" {
		t.Errorf("api_key values %+v, want its one detailed value", ak.Values)
	}
	bodies := body
	for _, p := range []string{"/", "/ui/api/overview", "/ui/api/limits", "/ui/api/demo"} {
		_, b := get(t, r.url+p)
		bodies += b
	}
	for _, secret := range []string{"198.51.100.23", "secret-upload-token", "secret-health-probe"} {
		if strings.Contains(bodies, secret) {
			t.Errorf("a page answer holds the descriptor value %q", secret)
		}
	}
}

// TestPage: the page and its assets, with relative URLs only, small, and
// read-only.
func TestPage(t *testing.T) {
	r := newRig(t)
	res, page := get(t, r.url+"/")
	if res.StatusCode != 200 || !strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") ||
		!strings.Contains(res.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("GET /: %s %v", res.Status, res.Header)
	}
	total := len(page)
	refs := regexp.MustCompile(`(?:href|src)="([^"#]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 3 {
		t.Fatalf("page references %v", refs)
	}
	for _, m := range refs {
		if strings.HasPrefix(m[1], "/") || strings.Contains(m[1], "://") {
			t.Errorf("page reference %q is not relative to the page", m[1])
			continue
		}
		res, body := get(t, r.url+"/"+m[1])
		if res.StatusCode != 200 {
			t.Errorf("GET %s: %s", m[1], res.Status)
		}
		total += len(body)
		if strings.HasSuffix(m[1], ".js") && regexp.MustCompile(`fetch\('/|getJSON\('/`).MatchString(body) {
			t.Errorf("%s fetches an absolute path", m[1])
		}
	}
	if total > 64<<10 {
		t.Errorf("page and assets: %d bytes, want a few tens of KB", total)
	}
	t.Logf("page and assets: %d bytes", total)

	// Cached assets revalidate with their ETag.
	req, _ := http.NewRequest("GET", r.url+"/ui/assets/app.js", nil)
	res, _ = get(t, r.url+"/ui/assets/app.js")
	req.Header.Set("If-None-Match", res.Header.Get("ETag"))
	if res2, err := http.DefaultClient.Do(req); err != nil || res2.StatusCode != http.StatusNotModified {
		t.Errorf("revalidation: %v %v", res2.Status, err)
	} else {
		res2.Body.Close()
	}

	for _, c := range []struct{ method, path string }{
		{"POST", "/ui/api/overview"}, {"DELETE", "/"}, {"GET", "/ui/assets/nope.js"}, {"GET", "/ui/assets/index.html"},
		{"GET", "/ui/demo/healthcheck"}, {"POST", "/ui/demo/json"}, {"GET", "/v1/check"},
	} {
		req, _ := http.NewRequest(c.method, r.url+c.path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 404 && res.StatusCode != 405 {
			t.Errorf("%s %s: %s, want 404 or 405", c.method, c.path, res.Status)
		}
	}
}

// TestDemo: the demo's 5-token bucket answers 429 with a Retry-After on
// the sixth request, through server.HTTP's /v1/check; another visitor and
// the fixed window count apart; the real limiter counted nothing.
func TestDemo(t *testing.T) {
	r := newRig(t)
	var d ui.LimitsView
	getJSON(t, r.url+"/ui/api/demo", &d)
	if len(d.Rules) != 2 || d.Rules[0].Burst != 5 || d.Rules[1].RequestsPerUnit != 5 {
		t.Fatalf("demo rules %+v", d.Rules)
	}
	check := func(alg, visitor string) (*http.Response, map[string]any) {
		body := fmt.Sprintf(`{"domain":"demo","descriptors":[{"entries":[{"key":"algorithm","value":%q},{"key":"visitor","value":%q}]}]}`, alg, visitor)
		res, err := http.Post(r.url+"/ui/demo/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(res.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return res, out
	}
	for i := 1; i <= 6; i++ {
		res, out := check("token_bucket", "v1")
		if i <= 5 && (res.StatusCode != 200 || res.Header.Get("RateLimit-Remaining") != fmt.Sprint(5-i)) {
			t.Fatalf("request %d: %s remaining %s", i, res.Status, res.Header.Get("RateLimit-Remaining"))
		}
		if i == 6 && (res.StatusCode != 429 || res.Header.Get("Retry-After") == "" || out["retry_after"] == nil) {
			t.Fatalf("request 6: %s Retry-After %q, body %v; want 429 with a retry-after", res.Status, res.Header.Get("Retry-After"), out)
		}
	}
	if res, _ := check("token_bucket", "v2"); res.StatusCode != 200 {
		t.Errorf("another visitor: %s, want its own bucket", res.Status)
	}
	if res, out := check("fixed_window", "v1"); res.StatusCode != 200 || out["remaining"] != "4" {
		t.Errorf("fixed window: %s %v", res.Status, out)
	}
	res, _ := check("token_bucket", strings.Repeat("x", 5000))
	if res.StatusCode != 200 {
		t.Errorf("a long visitor id: %s", res.Status)
	}
	var v ui.TrafficView
	getJSON(t, r.url+"/ui/api/traffic", &v)
	if len(v.Rules) != 0 {
		t.Errorf("the demo counted on the real limiter: %+v", v.Rules)
	}
}

// TestLimits_Period: a sliding window of several units reads as its
// period in words.
func TestLimits_Period(t *testing.T) {
	r := newRig(t)
	write(t, r.dir, "limits.yaml", "domain: web\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 20, algorithm: sliding_window}\n")
	if err := r.reload.Reload(); err != nil {
		t.Fatal(err)
	}
	var v ui.LimitsView
	getJSON(t, r.url+"/ui/api/limits", &v)
	if len(v.Rules) != 1 || v.Rules[0].Limit != "20 per 30 seconds" || v.Rules[0].Algorithm != "sliding_window" || v.Rules[0].UnitMultiplier != 30 {
		t.Fatalf("rules %+v, want one sliding window of 20 per 30 seconds", v.Rules)
	}
}

// TestLimits_Calendar: a calendar rule reads as its calendar period and
// zone.
func TestLimits_Calendar(t *testing.T) {
	r := newRig(t)
	write(t, r.dir, "limits.yaml", "domain: web\ndescriptors:\n"+
		"  - key: m\n    rate_limit: {unit: month, requests_per_unit: 1000, calendar: true, time_zone: Europe/Berlin}\n"+
		"  - key: q\n    rate_limit: {unit: month, unit_multiplier: 3, requests_per_unit: 5, calendar: true, algorithm: sliding_window}\n")
	if err := r.reload.Reload(); err != nil {
		t.Fatal(err)
	}
	var v ui.LimitsView
	getJSON(t, r.url+"/ui/api/limits", &v)
	if len(v.Rules) != 2 || v.Rules[0].Limit != "1000 per calendar month (Europe/Berlin)" || v.Rules[0].TimeZone != "Europe/Berlin" ||
		v.Rules[1].Limit != "5 per 3 calendar months (UTC)" || v.Rules[1].TimeZone != "UTC" || v.Rules[1].UnitMultiplier != 3 {
		t.Fatalf("rules %+v, want 1000 per calendar month (Europe/Berlin) and 5 per 3 calendar months (UTC)", v.Rules)
	}
}

// A budget past 32 bits is shown exactly.
func TestLimits_Big(t *testing.T) {
	r := newRig(t)
	write(t, r.dir, "limits.yaml", "domain: ai\ndescriptors:\n  - key: user\n    rate_limit: {unit: month, requests_per_unit: 100_000_000_000}\n")
	if err := r.reload.Reload(); err != nil {
		t.Fatal(err)
	}
	var v ui.LimitsView
	getJSON(t, r.url+"/ui/api/limits", &v)
	if len(v.Rules) != 1 || v.Rules[0].Limit != "100000000000 per month" || v.Rules[0].RequestsPerUnit != 100_000_000_000 {
		t.Fatalf("rules %+v, want 10^11 per month", v.Rules)
	}
}
