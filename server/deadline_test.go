package server_test

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// noDeadline is what deadlineStore records for a ctx without a deadline.
const noDeadline = time.Duration(math.MinInt64)

// deadlineStore is a memory store that records the time left before the
// deadline of each Take's ctx (noDeadline without one).
type deadlineStore struct {
	store.Store
	mu   sync.Mutex
	left []time.Duration
}

func (s *deadlineStore) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	left := noDeadline
	if d, ok := ctx.Deadline(); ok {
		left = time.Until(d)
	}
	s.mu.Lock()
	s.left = append(s.left, left)
	s.mu.Unlock()
	return s.Store.Take(ctx, now, hits, out)
}

func (s *deadlineStore) last() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.left[len(s.left)-1]
}

// TestDeadline_ReachesStore: a gRPC caller's grpc-timeout and an HTTP
// caller's Sluice-Timeout header become the deadline of the store's ctx;
// callers that state none leave it without one; a malformed header is a
// 400 that names it.
func TestDeadline_ReachesStore(t *testing.T) {
	st := &deadlineStore{Store: memory.New(memory.Options{})}
	lim := limiter.New(tables{loadTable(t)}, st, limiter.Options{})
	cc := serveLoopback(t, server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{}))
	hs := httptest.NewServer(server.NewHTTP(lim, server.NewHealth(), server.Options{}))
	t.Cleanup(hs.Close)
	rls := rlspb.NewRateLimitServiceClient(cc)
	req := &rlspb.RateLimitRequest{Domain: "e2e", Descriptors: []*commonpb.RateLimitDescriptor{{
		Entries: []*commonpb.RateLimitDescriptor_Entry{{Key: "path", Value: "/deadline"}}}}}

	// The callers' timeouts are long enough for the calls to succeed on a
	// busy machine (the first one dials): the store must see at most the
	// timeout left, and not much less.
	const timeout = time.Minute
	within := func(what string, got time.Duration) {
		t.Helper()
		if got < timeout/2 || got > timeout {
			t.Errorf("%s: store saw %v left, want %v to %v", what, got, timeout/2, timeout)
		}
	}
	gctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if _, err := rls.ShouldRateLimit(gctx, req); err != nil {
		t.Fatal(err)
	}
	within("grpc-timeout 1m", st.last())
	if _, err := rls.ShouldRateLimit(context.Background(), req, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if got := st.last(); got != noDeadline {
		t.Errorf("no grpc-timeout: store saw %v left, want no deadline", got)
	}

	post := func(timeout string) *http.Response {
		t.Helper()
		r, err := http.NewRequest("POST", hs.URL+"/json", strings.NewReader(
			`{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/deadline"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set("Content-Type", "application/json")
		if timeout != "" {
			r.Header.Set(server.TimeoutHeader, timeout)
		}
		res, err := hs.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	if res := post(timeout.String()); res.StatusCode != 200 {
		t.Fatalf("Sluice-Timeout %v: %d", timeout, res.StatusCode)
	}
	within("Sluice-Timeout 1m", st.last())
	if res := post(""); res.StatusCode != 200 || st.last() != noDeadline {
		t.Errorf("no header: %d, store saw %v left, want 200 and no deadline", res.StatusCode, st.last())
	}
	n := len(st.left)
	for _, bad := range []string{"soon", "0s", "-1s", "2h", "20"} {
		if res := post(bad); res.StatusCode != 400 {
			t.Errorf("Sluice-Timeout %q: %d, want 400", bad, res.StatusCode)
		}
	}
	if len(st.left) != n {
		t.Errorf("a request with a malformed header reached the store")
	}
}

// FuzzTimeoutHeader: any Sluice-Timeout value is answered (200 or 429) with a
// deadline of at most an hour reaching the store (already past for a
// tiny one), 503 when it passed before the limiter started, or 400
// without reaching the store; never a panic.
func FuzzTimeoutHeader(f *testing.F) {
	for _, s := range []string{"", "20ms", "1s", "1h", "1h0m0.000000001s", "0", "-5ms", "1e9h", "9223372036854775807ns", "1.5µs", " 20ms", "ms", "\x00"} {
		f.Add(s)
	}
	st := &deadlineStore{Store: memory.New(memory.Options{})}
	lim := limiter.New(tables{loadTable(f)}, st, limiter.Options{})
	h := server.NewHTTP(lim, server.NewHealth(), server.Options{})
	body := `{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/fuzz"}]}]}`
	f.Fuzz(func(t *testing.T, v string) {
		r := httptest.NewRequest("POST", "/json", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header[server.TimeoutHeader] = []string{v}
		w := httptest.NewRecorder()
		st.mu.Lock()
		n := len(st.left)
		st.mu.Unlock()
		h.ServeHTTP(w, r)
		st.mu.Lock()
		defer st.mu.Unlock()
		switch w.Code {
		case 200, 429: // (the limit is 5 a minute)
			// (An empty value is no header: no deadline.)
			if len(st.left) != n+1 || (st.left[n] == noDeadline) != (v == "") || st.left[n] > time.Hour {
				t.Errorf("Sluice-Timeout %q: 200, store saw %v left", v, st.left[n:])
			}
		case 503:
			if !strings.Contains(w.Body.String(), "deadline") {
				t.Errorf("Sluice-Timeout %q: 503 %q", v, w.Body.String())
			}
		case 400:
			if len(st.left) != n || !strings.Contains(w.Body.String(), server.TimeoutHeader) {
				t.Errorf("Sluice-Timeout %q: 400 %q, store called %d times", v, w.Body.String(), len(st.left)-n)
			}
		default:
			t.Errorf("Sluice-Timeout %q: %d %s", v, w.Code, w.Body.String())
		}
	})
}
