package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
)

type httpResult struct {
	code   int
	header http.Header
	body   map[string]any
}

func (e *env) do(t *testing.T, method, path, body string) httpResult {
	t.Helper()
	r, err := http.NewRequestWithContext(ctx(t), method, e.http.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.http.Client().Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := httpResult{code: res.StatusCode, header: res.Header}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &out.body); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, path, b, err)
		}
	}
	return out
}

func TestHTTP_Healthcheck(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	if r := e.do(t, "GET", "/healthcheck", ""); r.code != 200 {
		t.Errorf("serving: %d, want 200", r.code)
	}
	e.health.SetServing(false)
	if r := e.do(t, "GET", "/healthcheck", ""); r.code != 503 {
		t.Errorf("not serving: %d, want 503", r.code)
	}
}

func TestHTTP_JSON(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	body := `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`
	r := e.do(t, "POST", "/json", body)
	if r.code != 200 || r.body["overallCode"] != "OK" {
		t.Fatalf("first: %d %v, want 200 OK", r.code, r.body)
	}
	st := r.body["statuses"].([]any)[0].(map[string]any)
	if st["currentLimit"].(map[string]any)["name"] != "login" || st["durationUntilReset"] != "60s" {
		t.Errorf("status %v, want the login rule and 60s", st)
	}
	if r = e.do(t, "POST", "/json", body); r.code != 429 || r.body["overallCode"] != "OVER_LIMIT" {
		t.Errorf("second: %d %v, want 429 OVER_LIMIT", r.code, r.body)
	}
	if r = e.do(t, "POST", "/json", `{"domain":`); r.code != 400 || r.body["error"] == nil {
		t.Errorf("bad JSON: %d %v, want 400 with an error", r.code, r.body)
	}
	if r = e.do(t, "POST", "/json", `{"domain":"e2e"}`); r.code != 400 || !strings.Contains(r.body["error"].(string), "descriptor") {
		t.Errorf("no descriptors: %d %v, want 400 naming descriptors", r.code, r.body)
	}
	if r = e.do(t, "GET", "/json", ""); r.code != 405 {
		t.Errorf("GET /json: %d, want 405", r.code)
	}
}

func TestHTTP_Check(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	r := e.do(t, "GET", "/v1/check?domain=e2e&key=remote_address&value=1.2.3.4", "")
	if r.code != 200 || r.body["allowed"] != true || r.body["remaining"] != "1" {
		t.Errorf("first: %d %v, want 200 allowed remaining 1", r.code, r.body)
	}
	if h := r.header; h.Get("RateLimit-Limit") != "2" || h.Get("RateLimit-Remaining") != "1" || h.Get("RateLimit-Reset") != "60" {
		t.Errorf("first: headers %v", h)
	}
	e.clock.Advance(20*time.Second + time.Millisecond)
	r = e.do(t, "GET", "/v1/check?domain=e2e&key=remote_address&value=1.2.3.4&cost=2", "")
	if r.code != 429 || r.body["allowed"] != false || r.header.Get("Retry-After") != "40" {
		t.Errorf("cost 2 of 1 left: %d %v Retry-After %q, want 429 and 40", r.code, r.body, r.header.Get("Retry-After"))
	}
	// POST with our API's JSON form.
	r = e.do(t, "POST", "/v1/check", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/p"}]}],"cost":3}`)
	if r.code != 200 || r.body["remaining"] != "2" {
		t.Errorf("POST: %d %v, want remaining 2", r.code, r.body)
	}
	// A cost above the capacity: 429 without Retry-After.
	r = e.do(t, "GET", "/v1/check?domain=e2e&key=tokens&value=x&cost=21", "")
	if r.code != 429 || r.header.Get("Retry-After") != "" {
		t.Errorf("never: %d Retry-After %q, want 429 without it", r.code, r.header.Get("Retry-After"))
	}
	for _, q := range []string{"?domain=e2e", "?key=a&value=b", "?domain=e2e&key=a&cost=-1", "?domain=e2e&key=a&cost=x", "?domain=e2e&key=a&kind=debit"} {
		if r = e.do(t, "GET", "/v1/check"+q, ""); r.code != 400 || r.body["error"] == nil {
			t.Errorf("GET /v1/check%s: %d %v, want 400 with an error", q, r.code, r.body)
		}
	}
	if r = e.do(t, "POST", "/v1/check", `[]`); r.code != 400 {
		t.Errorf("POST bad JSON: %d, want 400", r.code)
	}
}

// TestHTTP_ChargeAndRefund: /v1/check says a cost's kind with kind=charge
// or kind=refund (GET) or "kind" (POST): a charge past the limit is
// recorded whole, a refund gives usage back.
func TestHTTP_ChargeAndRefund(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	for i, c := range []struct {
		method, q, body string
		code            int
		remaining       string
	}{
		{"GET", "domain=e2e&key=path&value=/c&cost=7&kind=charge", "", 429, "0"},
		{"GET", "domain=e2e&key=path&value=/c&cost=0", "", 429, "0"},
		{"GET", "domain=e2e&key=path&value=/c&cost=4&kind=refund", "", 200, "2"},
		{"POST", "", `{"domain":"e2e","key":"path","value":"/c","cost":2,"kind":"COST_KIND_CHARGE"}`, 200, "0"},
		{"POST", "", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/c"}],"kind":"COST_KIND_REFUND"}],"cost":1}`, 200, "1"},
		{"GET", "domain=e2e&key=path&value=/c&kind=hits", "", 200, "0"},
	} {
		r := e.do(t, c.method, "/v1/check?"+c.q, c.body)
		if r.code != c.code || r.body["remaining"] != c.remaining {
			t.Errorf("step %d %s %s%s: %d %v, want %d remaining %s", i, c.method, c.q, c.body, r.code, r.body, c.code, c.remaining)
		}
	}
}
