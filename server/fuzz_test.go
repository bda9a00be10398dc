package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// FuzzShouldRateLimit feeds arbitrary wire bytes through Envoy's request
// decoding, the validation path and the limiter. A request is either
// refused with INVALID_ARGUMENT or answered with one OK/OVER_LIMIT status
// per descriptor and an overall code that agrees with them.
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlspb.RateLimitRequest{
		req(0, d("remote_address", "10.0.0.1")),
		req(3, d("api_key", "k", "method", "POST"), hits(d("path", "/login"), 0)),
		req(0, override(d("nothing", "x"), 5, typepb.RateLimitUnit_MINUTE), d("small", "a"), d("big", "a")),
		req(0, d("", "x")),
		{Domain: "e2e"},
		{Descriptors: []*commonpb.RateLimitDescriptor{d("a", "b")}},
		req(1<<31, d("tokens", "t"), d("free", "x"), d("shadow", "s")),
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	table := loadTable(f)
	lim := limiter.New(tables{table}, memory.New(memory.Options{}), limiter.Options{Clock: storetest.NewClock(t0)})
	rls := server.NewRLS(lim, server.Options{ResponseHeaders: true})
	f.Fuzz(func(t *testing.T, wire []byte) {
		in := new(rlspb.RateLimitRequest)
		if proto.Unmarshal(wire, in) != nil {
			return
		}
		out, err := rls.ShouldRateLimit(context.Background(), in)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument or an answer", err)
			}
			return
		}
		if len(out.Statuses) != len(in.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(out.Statuses), len(in.Descriptors))
		}
		anyOver := false
		for i, s := range out.Statuses {
			switch s.Code {
			case rlspb.RateLimitResponse_OK:
			case rlspb.RateLimitResponse_OVER_LIMIT:
				anyOver = true
			default:
				t.Fatalf("status %d: code %v", i, s.Code)
			}
		}
		if anyOver != (out.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT) || out.OverallCode == rlspb.RateLimitResponse_UNKNOWN {
			t.Fatalf("overall %v disagrees with the statuses", out.OverallCode)
		}
	})
}

// consumeStore is a memory store that counts the Takes that consume.
type consumeStore struct {
	store.Store
	consumed atomic.Int64
}

func (s *consumeStore) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	for _, h := range hits {
		if h.Cost > 0 {
			s.consumed.Add(1)
			break
		}
	}
	return s.Store.Take(ctx, now, hits, out)
}

// FuzzHTTP sends arbitrary methods, queries, content types and bodies to
// the HTTP endpoints: every answer is one of the documented codes, a GET
// never consumes, a POST consumes only with a JSON body, a body above the
// bound is refused, and no answer carries a CORS header.
func FuzzHTTP(f *testing.F) {
	for _, s := range [][4]string{
		{"GET", "/v1/check?domain=e2e&key=remote_address&value=1.2.3.4&cost=0", "", ""},
		{"GET", "/v1/check?domain=e2e&key=remote_address&value=1.2.3.4&cost=5", "", ""},
		{"GET", "/v1/check?domain=e2e&key=remote_address&cost=0&cost=1", "", ""},
		{"POST", "/v1/check", "application/json", `{"domain":"e2e","key":"remote_address","value":"1","cost":2}`},
		{"POST", "/v1/check", "text/plain", `{"domain":"e2e","key":"remote_address","value":"1"}`},
		{"POST", "/json", "application/json; charset=utf-8", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`},
		{"POST", "/json", "application/x-www-form-urlencoded", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`},
		{"POST", "/json", "application/json", `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"` + strings.Repeat("x", 300) + `"}]}]}`},
		{"OPTIONS", "/json", "", ""},
		{"PUT", "/healthcheck", "application/json", "{}"},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	st := &consumeStore{Store: memory.New(memory.Options{})}
	lim := limiter.New(tables{loadTable(f)}, st, limiter.Options{})
	health := server.NewHealth()
	health.SetServing(true)
	const maxBody = 256
	h := server.NewHTTP(lim, health, server.Options{MaxBodyBytes: maxBody})
	f.Fuzz(func(t *testing.T, method, target, contentType, body string) {
		if !strings.HasPrefix(target, "/") {
			target = "/" + target
		}
		r, err := http.NewRequest(method, "http://sluice"+target, strings.NewReader(body))
		if err != nil {
			return // not a request a server could receive
		}
		r.Header.Set("Content-Type", contentType)
		r.Header.Set("Origin", "https://elsewhere.example")
		before := st.consumed.Load()
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		consumed := st.consumed.Load() > before
		for k := range w.Header() {
			if strings.HasPrefix(strings.ToLower(k), "access-control-") {
				t.Errorf("%s %s: %s", method, target, k)
			}
		}
		switch w.Code {
		case 200, 429, 400, 404, 405, 408, 413, 415, 503:
		default:
			t.Errorf("%s %s (%q, %q): %d %s", method, target, contentType, body, w.Code, w.Body)
		}
		json := strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "application/json")
		if consumed && (method != http.MethodPost || !json || len(body) > maxBody) {
			t.Errorf("%s %s (%q, %d bytes) consumed", method, target, contentType, len(body))
		}
	})
}
