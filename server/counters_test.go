package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

const countersLimits = `
domain: shop
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 3, name: per_second}
      - {unit: minute, requests_per_unit: 5, name: per_minute}
  - key: api_key
    descriptors:
      - key: method
        value: POST
        detailed_metric: true
        rate_limit: {unit: hour, requests_per_unit: 2, name: posts}
  - key: tokens
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 4}
`

// goodToken is the admin token the tests write.
const goodToken = "s3cret-admin-token-0123456789"

type countersEnv struct {
	*env
	logs   *logbuf.Buffer
	resets map[string]int
	mu     sync.Mutex
}

// newCountersEnv serves /v1/check and the counter endpoints of one
// limiter on a memory store over a loopback httptest server; resets are
// on when withToken.
func newCountersEnv(t *testing.T, withToken bool) *countersEnv {
	t.Helper()
	dir := t.TempDir()
	p := filepath.Join(dir, "limits.yaml")
	if err := os.WriteFile(p, []byte(countersLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	table, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := &countersEnv{env: &env{clock: storetest.NewClock(t0), health: server.NewHealth()},
		logs: &logbuf.Buffer{}, resets: map[string]int{}}
	lim := limiter.New(tables{table}, memory.New(memory.Options{}), limiter.Options{Clock: e.clock})
	opts := server.CountersOptions{Logger: slog.New(slog.NewTextHandler(e.logs, nil)),
		Sleep: func(context.Context, time.Duration) {}, // TestCounters_RefusedResetsLoggedAndSlowed checks the wait
		OnReset: func(domain string, rule *config.Rule) {
			path := "override"
			if rule != nil {
				path = rule.Path
			}
			e.mu.Lock()
			e.resets[domain+" "+path]++
			e.mu.Unlock()
		}}
	if withToken {
		opts.Auth = tokenAuth(goodToken)
	}
	mux := http.NewServeMux()
	h := server.NewHTTP(lim, e.health, server.Options{})
	for _, p := range h.Patterns() {
		mux.Handle(p, h)
	}
	c := server.NewCounters(lim, opts)
	for _, p := range c.Patterns() {
		mux.Handle(p, c)
	}
	e.http = httptest.NewServer(mux)
	t.Cleanup(e.http.Close)
	return e
}

// tokenAuth is a server.Authorizer that accepts one token.
type tokenAuth string

func (a tokenAuth) Valid(token []byte) bool { return string(token) == string(a) }

// limit returns descriptor i's limit j of a counters answer.
func limit(t *testing.T, r httpResult, i, j int) map[string]any {
	t.Helper()
	ds, _ := r.body["descriptors"].([]any)
	if len(ds) <= i {
		t.Fatalf("answer %v: no descriptor %d", r.body, i)
	}
	ls, _ := ds[i].(map[string]any)["limits"].([]any)
	if len(ls) <= j {
		t.Fatalf("answer %v: descriptor %d has no limit %d", r.body, i, j)
	}
	return ls[j].(map[string]any)
}

func (e *countersEnv) reset(t *testing.T, body, token string) httpResult {
	t.Helper()
	h := http.Header{"Content-Type": {"application/json"}}
	if token != "" {
		h.Set("Authorization", "Bearer "+token)
	}
	return e.doWith(t, "POST", "/v1/counters/reset", body, h)
}

const aliceBody = `{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}`

// TestCounters_LookupConsumesNothing: GET and POST lookups report the
// matched rule and each limit's counter, and change nothing: a check
// after them sees what it would have seen without.
func TestCounters_LookupConsumesNothing(t *testing.T) {
	e := newCountersEnv(t, false)
	for range 2 {
		if r := e.do(t, "POST", "/v1/check", aliceBody); r.code != 200 {
			t.Fatalf("check: %d %v", r.code, r.body)
		}
	}
	var r httpResult
	for range 10 {
		if r = e.do(t, "GET", "/v1/counters?domain=shop&key=user&value=alice", ""); r.code != 200 {
			t.Fatalf("GET lookup: %d %v", r.code, r.body)
		}
		if r2 := e.do(t, "POST", "/v1/counters", aliceBody); r2.code != 200 {
			t.Fatalf("POST lookup: %d %v", r2.code, r2.body)
		}
	}
	d := r.body["descriptors"].([]any)[0].(map[string]any)
	if d["matched"] != true || d["path"] != "user[0]" || d["name"] != "per_second" {
		t.Errorf("descriptor = %v, want the user rule", d)
	}
	for j, want := range []struct {
		name            string
		used, remaining float64
		reset           float64
	}{{"per_second", 2, 1, 1}, {"per_minute", 2, 3, 60}} {
		l := limit(t, r, 0, j)
		if l["name"] != want.name || l["used"] != want.used || l["remaining"] != want.remaining || l["reset_after_s"] != want.reset ||
			l["algorithm"] != "fixed_window" || l["allowed"] != true {
			t.Errorf("limit %d = %v, want %+v", j, l, want)
		}
	}
	r = e.do(t, "POST", "/v1/check", aliceBody)
	if res := r.body["results"].([]any)[0].(map[string]any); r.code != 200 || res["remaining"] != "0" {
		t.Errorf("the third check after 20 lookups: %d %v, want allowed with 0 left", r.code, res)
	}
	r = e.do(t, "GET", "/v1/counters?domain=shop&key=user&value=alice", "")
	if l := limit(t, r, 0, 0); l["allowed"] != false || l["used"] != 3.0 || l["retry_after_s"] != 1.0 {
		t.Errorf("per_second after three checks = %v, want used up, retry in 1s", l)
	}
}

// TestCounters_QueryEntries: GET pairs repeated key and value parameters
// into one descriptor of several entries, as POST's entries.
func TestCounters_QueryEntries(t *testing.T) {
	e := newCountersEnv(t, false)
	post := `{"domain":"shop","descriptors":[{"entries":[{"key":"api_key","value":"k1"},{"key":"method","value":"POST"}]}]}`
	e.do(t, "POST", "/v1/check", post)
	r := e.do(t, "GET", "/v1/counters?domain=shop&key=api_key&value=k1&key=method&value=POST", "")
	if l := limit(t, r, 0, 0); r.code != 200 || l["path"] != "api_key.method_POST" || l["used"] != 1.0 || l["per"] != "hour" {
		t.Errorf("two entries: %d %v", r.code, l)
	}
	r = e.do(t, "GET", "/v1/counters?domain=shop&key=nothing&value=x", "")
	if d := r.body["descriptors"].([]any)[0].(map[string]any); r.code != 200 || d["matched"] != false || len(d["limits"].([]any)) != 0 {
		t.Errorf("no rule: %d %v, want matched false and no limits", r.code, r.body)
	}
	for _, q := range []string{
		"domain=shop&key=user",                  // a key without its value
		"domain=shop&key=user&value=a&value=b",  // a value too many
		"domain=shop",                           // no key
		"domain=shop&key=user&value=a&cost=1",   // an unknown parameter
		"domain=shop&domain=x&key=user&value=a", // two domains
		"key=user&value=a",                      // no domain
		"domain=shop&key=&value=a",              // an empty key
	} {
		if r := e.do(t, "GET", "/v1/counters?"+q, ""); r.code != 400 || r.body["error"] == "" {
			t.Errorf("GET ?%s: %d %v, want 400 with a reason", q, r.code, r.body)
		}
	}
}

// TestCounters_PostIsJSONOnly: a POST lookup or reset of another content
// type is refused (a page cannot send a JSON body cross-site without a
// preflight), and a body past the bound is 413.
func TestCounters_PostIsJSONOnly(t *testing.T) {
	e := newCountersEnv(t, true)
	form := http.Header{"Content-Type": {"application/x-www-form-urlencoded"}}
	if r := e.doWith(t, "POST", "/v1/counters", aliceBody, form); r.code != 415 {
		t.Errorf("form lookup: %d, want 415", r.code)
	}
	form.Set("Authorization", "Bearer "+goodToken)
	if r := e.doWith(t, "POST", "/v1/counters/reset", aliceBody, form); r.code != 415 {
		t.Errorf("form reset: %d, want 415", r.code)
	}
	big := `{"domain":"shop","key":"user","value":"` + strings.Repeat("x", server.DefaultMaxBodyBytes) + `"}`
	if r := e.do(t, "POST", "/v1/counters", big); r.code != 413 {
		t.Errorf("a body past the bound: %d, want 413", r.code)
	}
	if r := e.do(t, "GET", "/v1/counters/reset", ""); r.code != 405 {
		t.Errorf("GET reset: %d, want 405", r.code)
	}
}

// TestCounters_ResetOff: without a token file every reset is 403 and
// nothing is reset.
func TestCounters_ResetOff(t *testing.T) {
	e := newCountersEnv(t, false)
	e.do(t, "POST", "/v1/check", aliceBody)
	for _, tok := range []string{"", goodToken} {
		if r := e.reset(t, aliceBody, tok); r.code != 403 {
			t.Errorf("reset with token %q while off: %d, want 403", tok, r.code)
		}
	}
	if l := limit(t, e.do(t, "POST", "/v1/counters", aliceBody), 0, 0); l["used"] != 1.0 {
		t.Errorf("after refused resets: %v, want used 1", l)
	}
}

// TestCounters_ResetNeedsToken: a reset without the token or with a
// wrong one is 401 and resets nothing; with it, the counters are empty,
// the reset is logged (who and which rule, not the value) and counted,
// and the token is in no log line.
func TestCounters_ResetNeedsToken(t *testing.T) {
	e := newCountersEnv(t, true)
	for range 5 {
		e.do(t, "POST", "/v1/check", aliceBody)
	}
	h := http.Header{"Content-Type": {"application/json"}}
	for name, auth := range map[string]string{"none": "", "wrong": "Bearer " + goodToken + "x", "prefix": "Bearer " + goodToken[:20],
		"basic": "Basic " + goodToken, "bare": goodToken} {
		if auth != "" {
			h.Set("Authorization", auth)
		}
		r := e.doWith(t, "POST", "/v1/counters/reset", aliceBody, h)
		if r.code != 401 || !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s: %d (WWW-Authenticate %q), want 401 with a Bearer challenge", name, r.code, r.header.Get("WWW-Authenticate"))
		}
	}
	if l := limit(t, e.do(t, "POST", "/v1/counters", aliceBody), 0, 1); l["used"] != 3.0 {
		t.Fatalf("after refused resets: %v, want used 3 (two of five checks were denied)", l)
	}
	r := e.reset(t, aliceBody, goodToken)
	if r.code != 200 {
		t.Fatalf("reset with the token: %d %v", r.code, r.body)
	}
	for j := range 2 {
		if l := limit(t, r, 0, j); l["used"] != 0.0 || l["allowed"] != true {
			t.Errorf("reset's answer, limit %d = %v, want empty", j, l)
		}
	}
	if r := e.do(t, "POST", "/v1/check", aliceBody); r.code != 200 {
		t.Errorf("check after the reset: %d, want 200", r.code)
	}
	post := `{"domain":"shop","descriptors":[{"entries":[{"key":"api_key","value":"k-secret-value"},{"key":"method","value":"POST"}]}]}`
	e.do(t, "POST", "/v1/check", post)
	if r := e.reset(t, post, goodToken); r.code != 200 {
		t.Fatalf("reset of a detailed_metric rule: %d %v", r.code, r.body)
	}
	logs := e.logs.String()
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(logs), "\n") {
		if strings.Contains(l, "counters reset") {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("log = %q, want one line per reset", logs)
	}
	for _, want := range []string{"level=INFO", "client=127.0.0.1:", "domain=shop", "rule=user[0]", "name=per_second", "limits=2"} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("log line %q lacks %q", lines[0], want)
		}
	}
	if strings.Contains(lines[0], "alice") {
		t.Errorf("log line %q names the value of a rule without detailed_metric", lines[0])
	}
	if !strings.Contains(lines[1], `descriptor="api_key=k-secret-value,method=POST"`) {
		t.Errorf("log line %q lacks the descriptor of a detailed_metric rule", lines[1])
	}
	if strings.Contains(logs, goodToken[:10]) {
		t.Errorf("the token is in the log: %q", logs)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.resets) != 3 || e.resets["shop user[0]"] != 1 || e.resets["shop user[1]"] != 1 || e.resets["shop api_key.method_POST"] != 1 {
		t.Errorf("OnReset = %v, want one reset of each limit", e.resets)
	}
}

// FuzzCountersQuery feeds arbitrary query strings to GET /v1/counters's
// decoding: it never panics, and a query it accepts is one descriptor
// whose entries are the key and value parameters in order, under one
// domain.
func FuzzCountersQuery(f *testing.F) {
	for _, s := range []string{
		"domain=shop&key=user&value=alice",
		"domain=shop&key=api_key&value=k1&key=method&value=POST",
		"domain=shop&key=user",
		"domain=shop&key=user&value=a&value=b",
		"domain=a&domain=b&key=k&value=v",
		"domain=shop&key=%zz&value=x",
		"key=k&value=&cost=1",
		"domain=%E2%82%AC&key=%00&value=%FF",
		";;&&==",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		var req limiter.Request
		if err := server.ParseCountersQuery(q, &req, limiter.DefaultMaxEntries); err != nil {
			var inv *limiter.InvalidError
			if !errors.As(err, &inv) || inv.Reason == "" {
				t.Fatalf("%q: error %v, want an InvalidError with a reason", raw, err)
			}
			return
		}
		if len(req.Descriptors) != 1 || req.Domain != q.Get("domain") || len(q["domain"]) > 1 {
			t.Fatalf("%q: accepted as %+v", raw, req)
		}
		es := req.Descriptors[0].Entries
		if len(es) != len(q["key"]) || len(es) != len(q["value"]) || len(es) == 0 {
			t.Fatalf("%q: %d entries for %d keys and %d values", raw, len(es), len(q["key"]), len(q["value"]))
		}
		for i, e := range es {
			if e.Key != q["key"][i] || e.Value != q["value"][i] {
				t.Fatalf("%q: entry %d = %+v, want %q=%q", raw, i, e, q["key"][i], q["value"][i])
			}
		}
	})
}

// TestCounters_RefusedResetsLoggedAndSlowed: a reset with a wrong or
// missing token waits RefusedDelay before its 401 (a guesser is slowed;
// the wait holds no lock) and is logged at most once a minute on the
// clock, the line counting the refusals since the last one; a reset with
// the token waits nothing and logs no refusal.
func TestCounters_RefusedResetsLoggedAndSlowed(t *testing.T) {
	table := loadTable(t)
	lim := limiter.New(tables{table}, memory.New(memory.Options{}), limiter.Options{})
	logs := &logbuf.Buffer{}
	now := time.Unix(1_800_000_000, 0)
	var mu sync.Mutex
	var waits []time.Duration
	c := server.NewCounters(lim, server.CountersOptions{Auth: tokenAuth(goodToken), Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Now:   func() time.Time { mu.Lock(); defer mu.Unlock(); return now },
		Sleep: func(_ context.Context, d time.Duration) { mu.Lock(); waits = append(waits, d); mu.Unlock() }})
	hs := httptest.NewServer(c)
	defer hs.Close()
	e := &env{http: hs}
	body := `{"domain":"e2e","key":"path","value":"/x"}`
	reset := func(auth string) int {
		h := http.Header{"Content-Type": {"application/json"}}
		if auth != "" {
			h.Set("Authorization", auth)
		}
		return e.doWith(t, "POST", "/v1/counters/reset", body, h).code
	}
	for range 5 {
		if code := reset("Bearer wrong-token-wrong-token"); code != 401 {
			t.Fatalf("a wrong token: %d, want 401", code)
		}
	}
	mu.Lock()
	now = now.Add(time.Minute)
	mu.Unlock()
	if code := reset(""); code != 401 {
		t.Fatalf("no token: %d, want 401", code)
	}
	if code := reset("Bearer " + goodToken); code != 200 {
		t.Fatalf("the token: %d, want 200", code)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(waits) != 6 || waits[0] != server.DefaultRefusedDelay {
		t.Errorf("waits %v, want 6 of %v (none for the right token)", waits, server.DefaultRefusedDelay)
	}
	lines := strings.Count(logs.String(), "counter reset refused")
	if lines != 2 || !strings.Contains(logs.String(), "refused=1 ") || !strings.Contains(logs.String(), "refused=5 ") {
		t.Errorf("logs %q, want 2 lines: the first refusal, then the 5 since", logs)
	}
}
