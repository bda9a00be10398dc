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

// do sends a request; a POST's body is application/json.
func (e *env) do(t *testing.T, method, path, body string) httpResult {
	t.Helper()
	h := http.Header{}
	if method == http.MethodPost {
		h.Set("Content-Type", "application/json")
	}
	return e.doWith(t, method, path, body, h)
}

func (e *env) doWith(t *testing.T, method, path, body string, h http.Header) httpResult {
	t.Helper()
	r, err := http.NewRequestWithContext(ctx(t), method, e.http.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header = h
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
	r := e.do(t, "POST", "/v1/check", `{"domain":"e2e","key":"remote_address","value":"1.2.3.4"}`)
	if r.code != 200 || r.body["allowed"] != true || r.body["remaining"] != "1" {
		t.Errorf("first: %d %v, want 200 allowed remaining 1", r.code, r.body)
	}
	if h := r.header; h.Get("RateLimit-Limit") != "2" || h.Get("RateLimit-Remaining") != "1" || h.Get("RateLimit-Reset") != "60" {
		t.Errorf("first: headers %v", h)
	}
	e.clock.Advance(20*time.Second + time.Millisecond)
	r = e.do(t, "POST", "/v1/check", `{"domain":"e2e","key":"remote_address","value":"1.2.3.4","cost":2}`)
	if r.code != 429 || r.body["allowed"] != false || r.header.Get("Retry-After") != "40" {
		t.Errorf("cost 2 of 1 left: %d %v Retry-After %q, want 429 and 40", r.code, r.body, r.header.Get("Retry-After"))
	}
	// With descriptors.
	r = e.do(t, "POST", "/v1/check", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/p"}]}],"cost":3}`)
	if r.code != 200 || r.body["remaining"] != "2" {
		t.Errorf("POST: %d %v, want remaining 2", r.code, r.body)
	}
	// A cost above the capacity: 429 without Retry-After.
	r = e.do(t, "POST", "/v1/check", `{"domain":"e2e","key":"tokens","value":"x","cost":21}`)
	if r.code != 429 || r.header.Get("Retry-After") != "" {
		t.Errorf("never: %d Retry-After %q, want 429 without it", r.code, r.header.Get("Retry-After"))
	}
	for _, q := range []string{"?domain=e2e&cost=0", "?key=a&value=b&cost=0"} {
		if r = e.do(t, "GET", "/v1/check"+q, ""); r.code != 400 || r.body["error"] == nil {
			t.Errorf("GET /v1/check%s: %d %v, want 400 with an error", q, r.code, r.body)
		}
	}
	if r = e.do(t, "POST", "/v1/check", `[]`); r.code != 400 {
		t.Errorf("POST bad JSON: %d, want 400", r.code)
	}
}

// TestHTTP_GetCheckPeeks: GET /v1/check answers what a check would get
// and consumes nothing, however often it is sent, with or without cost=0;
// a GET that asks for a cost (as a GET that consumed did) is refused.
func TestHTTP_GetCheckPeeks(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	for i := range 6 {
		q := []string{"&cost=0", ""}[i%2]
		r := e.do(t, "GET", "/v1/check?domain=e2e&key=remote_address&value=1.2.3.4"+q, "")
		if r.code != 200 || r.body["allowed"] != true || r.body["remaining"] != "2" || r.header.Get("RateLimit-Remaining") != "2" {
			t.Fatalf("peek %d: %d %v, want 200 with 2 remaining", i, r.code, r.body)
		}
	}
	for _, q := range []string{"&cost=1", "&cost=x", "&cost=-1", "&cost=", "&cost=0&cost=1"} {
		r := e.do(t, "GET", "/v1/check?domain=e2e&key=remote_address&value=1.2.3.4"+q, "")
		if r.code != 400 || !strings.Contains(r.body["error"].(string), "GET /v1/check never consumes") {
			t.Errorf("GET%s: %d %v, want 400 saying a GET never consumes", q, r.code, r.body)
		}
	}
	r := e.do(t, "POST", "/v1/check", `{"domain":"e2e","key":"remote_address","value":"1.2.3.4","cost":2}`)
	if r.code != 200 || r.body["remaining"] != "0" {
		t.Errorf("after the peeks a cost of 2: %d %v, want the whole limit", r.code, r.body)
	}
}

// TestHTTP_ContentType: a POST consumes only with a JSON body; every form
// a web page can send to another origin without a preflight gets 415.
func TestHTTP_ContentType(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	body := map[string]string{
		"/json":     `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`,
		"/v1/check": `{"domain":"e2e","key":"path","value":"/login"}`,
	}
	for path, b := range body {
		for _, ct := range []string{"", "text/plain", "text/plain;charset=UTF-8", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonx", "json"} {
			h := http.Header{}
			if ct != "" {
				h.Set("Content-Type", ct)
			}
			if r := e.doWith(t, "POST", path, b, h); r.code != http.StatusUnsupportedMediaType || !strings.Contains(r.body["error"].(string), "application/json") {
				t.Errorf("POST %s as %q: %d %v, want 415", path, ct, r.code, r.body)
			}
		}
	}
	// Nothing was counted: the login rule allows 1 a minute.
	h := http.Header{"Content-Type": {"Application/JSON; charset=utf-8"}}
	if r := e.doWith(t, "POST", "/json", body["/json"], h); r.code != 200 {
		t.Errorf("POST /json as JSON with a charset: %d %v, want 200", r.code, r.body)
	}
}

// TestHTTP_BodyLimit: a body above MaxBodyBytes gets 413.
func TestHTTP_BodyLimit(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{MaxBodyBytes: 200})
	long := `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"` + strings.Repeat("x", 200) + `"}]}]}`
	for _, path := range []string{"/json", "/v1/check"} {
		if r := e.do(t, "POST", path, long); r.code != http.StatusRequestEntityTooLarge || !strings.Contains(r.body["error"].(string), "200 bytes") {
			t.Errorf("POST %s of %d bytes: %d %v, want 413", path, len(long), r.code, r.body)
		}
	}
	if r := e.do(t, "POST", "/json", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`); r.code != 200 {
		t.Errorf("a short body: %d %v", r.code, r.body)
	}
}

// TestHTTP_NeverCORS: no answer grants a cross-origin request, preflight
// included: no Access-Control-* header, ever.
func TestHTTP_NeverCORS(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	for _, path := range []string{"/json", "/v1/check", "/v1/check?domain=e2e&key=path&value=/login&cost=0", "/healthcheck"} {
		for _, method := range []string{"OPTIONS", "GET", "POST"} {
			h := http.Header{"Origin": {"https://evil.example"}, "Access-Control-Request-Method": {"POST"},
				"Access-Control-Request-Headers": {"content-type"}, "Content-Type": {"application/json"}}
			r := e.doWith(t, method, path, `{"domain":"e2e","key":"path","value":"/login"}`, h)
			for k := range r.header {
				if strings.HasPrefix(strings.ToLower(k), "access-control-") {
					t.Errorf("%s %s: %d with %s: %q", method, path, r.code, k, r.header.Get(k))
				}
			}
		}
	}
}

// TestHTTP_ChargeAndRefund: POST /v1/check says a cost's kind with "kind"
// (on the request or a descriptor): a charge past the limit is recorded
// whole, a refund gives usage back; a GET peeks.
func TestHTTP_ChargeAndRefund(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	for i, c := range []struct {
		method, q, body string
		code            int
		remaining       string
	}{
		{"POST", "", `{"domain":"e2e","key":"path","value":"/c","cost":7,"kind":"COST_KIND_CHARGE"}`, 429, "0"},
		{"GET", "?domain=e2e&key=path&value=/c", "", 429, "0"},
		{"POST", "", `{"domain":"e2e","key":"path","value":"/c","cost":4,"kind":"COST_KIND_REFUND"}`, 200, "2"},
		{"POST", "", `{"domain":"e2e","key":"path","value":"/c","cost":2,"kind":"COST_KIND_CHARGE"}`, 200, "0"},
		{"POST", "", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/c"}],"kind":"COST_KIND_REFUND"}],"cost":1}`, 200, "1"},
		{"GET", "?domain=e2e&key=path&value=/c", "", 200, "1"},
	} {
		r := e.do(t, c.method, "/v1/check"+c.q, c.body)
		if r.code != c.code || r.body["remaining"] != c.remaining {
			t.Errorf("step %d %s %s%s: %d %v, want %d remaining %s", i, c.method, c.q, c.body, r.code, r.body, c.code, c.remaining)
		}
	}
}
