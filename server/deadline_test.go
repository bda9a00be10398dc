package server_test

import (
	"context"
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

// deadlineStore is a memory store that records the time left before the
// deadline of each Take's ctx (-1 without one).
type deadlineStore struct {
	store.Store
	mu   sync.Mutex
	left []time.Duration
}

func (s *deadlineStore) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	left := time.Duration(-1)
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

	within := func(what string, got, lo, hi time.Duration) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s: store saw %v left, want %v to %v", what, got, lo, hi)
		}
	}
	gctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := rls.ShouldRateLimit(gctx, req); err != nil {
		t.Fatal(err)
	}
	within("grpc-timeout 300ms", st.last(), time.Millisecond, 300*time.Millisecond)
	if _, err := rls.ShouldRateLimit(context.Background(), req, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	if got := st.last(); got != -1 {
		t.Errorf("no grpc-timeout: store saw %v left, want no deadline", got)
	}

	post := func(timeout string) *http.Response {
		t.Helper()
		r, err := http.NewRequest("POST", hs.URL+"/json", strings.NewReader(
			`{"domain":"e2e","descriptors":[{"entries":[{"key":"path","value":"/deadline"}]}]}`))
		if err != nil {
			t.Fatal(err)
		}
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
	if res := post("250ms"); res.StatusCode != 200 {
		t.Fatalf("Sluice-Timeout 250ms: %d", res.StatusCode)
	}
	within("Sluice-Timeout 250ms", st.last(), time.Millisecond, 250*time.Millisecond)
	if res := post(""); res.StatusCode != 200 || st.last() != -1 {
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
