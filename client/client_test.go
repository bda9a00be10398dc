package client

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const limitsYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {name: per-user, unit: minute, requests_per_unit: 2}
  - key: path
    descriptors:
      - key: tenant
        rate_limit: {unit: second, requests_per_unit: 8, algorithm: token_bucket, burst: 2}
  - key: free
    rate_limit: {unlimited: true}
`

// At 10 s past a minute boundary, so a fixed window resets in 50 s.
var tWindow = int64(1_763_800_020+10) * int64(time.Second)

func TestClient_ShouldRateLimit(t *testing.T) {
	clock := newFakeClock(tWindow)
	c := dial(t, startSluice(t, limitsYAML, clock))
	ctx := testCtx(t)
	alice := []Descriptor{{{"user", "alice"}}}
	for i, want := range []struct {
		allowed   bool
		remaining uint64
	}{{true, 1}, {true, 0}, {false, 0}} {
		r, err := c.ShouldRateLimit(ctx, "api", alice, 0)
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if r.Allowed != want.allowed || len(r.Statuses) != 1 {
			t.Fatalf("call %d: %+v, want allowed %v with one status", i+1, r, want.allowed)
		}
		s := r.Statuses[0]
		wantRetry := time.Duration(0)
		if !want.allowed {
			wantRetry = 50 * time.Second
		}
		if !s.Limited || s.Name != "per-user" || s.Limit != 2 || s.Unit != "minute" || s.Remaining != want.remaining ||
			s.ResetAfter != 50*time.Second || s.RetryAfter != wantRetry || s.Allowed != want.allowed {
			t.Fatalf("call %d: status %+v", i+1, s)
		}
		if r.Limit != 2 || r.Remaining != want.remaining || r.ResetAfter != 50*time.Second || r.RetryAfter != wantRetry {
			t.Fatalf("call %d: summary %+v", i+1, r)
		}
	}
	// An unlimited descriptor and one without a rule are not limited.
	r, err := c.ShouldRateLimit(ctx, "api", []Descriptor{{{"free", "x"}}, {{"nothing", "y"}}}, 5)
	if err != nil || !r.Allowed || r.Statuses[0].Limited || r.Statuses[1].Limited || r.Limit != 0 {
		t.Fatalf("unlimited and unmatched: %+v, %v", r, err)
	}
	if got, want := c.Stats(), (Stats{Calls: 4, OverLimit: 1}); got != want {
		t.Fatalf("Stats() = %+v, want %+v", got, want)
	}
}

func TestClient_Check(t *testing.T) {
	clock := newFakeClock(tWindow)
	c := dial(t, startSluice(t, limitsYAML, clock))
	ctx := testCtx(t)
	d := []Descriptor{{{"path", "/x"}, {"tenant", "t1"}}}
	for i := range 2 {
		if r, err := c.Check(ctx, "api", d, 1); err != nil || !r.Allowed || r.Remaining != uint64(1-i) {
			t.Fatalf("call %d: %+v, %v", i+1, r, err)
		}
	}
	r, err := c.Check(ctx, "api", d, 1)
	if err != nil {
		t.Fatal(err)
	}
	// 8 tokens a second: the next is 125 ms away, exactly.
	if r.Allowed || r.RetryAfter != 125*time.Millisecond || r.Statuses[0].RetryAfter != 125*time.Millisecond || r.Limit != 2 {
		t.Fatalf("over the limit: %+v", r)
	}
	// Cost 0 peeks without consuming: an empty bucket is not past empty,
	// so the peek is allowed, as the reference allows a peek at the
	// limit; a cost above the burst never fits.
	if r, err := c.Check(ctx, "api", d, 0); err != nil || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("check only: %+v, %v", r, err)
	}
	// A charge is recorded whole past the burst: 8 more owed take a
	// second to refill, and a refund gives them back.
	if r, err := c.Charge(ctx, "api", d, 8); err != nil || r.Allowed {
		t.Fatalf("charge past the limit: %+v, %v", r, err)
	}
	if r, err := c.Check(ctx, "api", d, 0); err != nil || r.Allowed || r.RetryAfter != time.Second {
		t.Fatalf("check after the charge: %+v, %v", r, err)
	}
	if r, err := c.Refund(ctx, "api", d, 8); err != nil || !r.Allowed || r.Remaining != 0 {
		t.Fatalf("refund: %+v, %v", r, err)
	}
	clock.Add(time.Second)
	r, err = c.Check(ctx, "api", d, 3)
	if err != nil || r.Allowed || r.RetryAfter != Never || r.Statuses[0].RetryAfter != Never {
		t.Fatalf("cost above the burst: %+v, %v", r, err)
	}
}

func TestClient_FailureMode(t *testing.T) {
	addr := deadAddr(t)
	ctx := testCtx(t)
	d := []Descriptor{{{"user", "alice"}}}
	open := dial(t, addr)
	r, err := open.ShouldRateLimit(ctx, "api", d, 1)
	if err == nil || status.Code(err) != codes.Unavailable || !r.Allowed || !r.FailedOpen || len(r.Statuses) != 0 {
		t.Fatalf("fail open: %+v, %v; want allowed, failed open, UNAVAILABLE", r, err)
	}
	closed := dial(t, addr, WithFailureMode(FailDeny))
	r, err = closed.Check(ctx, "api", d, 1)
	if err == nil || r.Allowed || r.FailedOpen {
		t.Fatalf("fail closed: %+v, %v; want denied with an error", r, err)
	}
	for name, c := range map[string]*Client{"open": open, "closed": closed} {
		if got, want := c.Stats(), (Stats{Calls: 1, Failures: 1}); got != want {
			t.Errorf("%s: Stats() = %+v, want %+v", name, got, want)
		}
	}
}

func TestClient_Timeout(t *testing.T) {
	s := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(s, stallingRLS{})
	addr := serveGRPC(t, s)
	for _, tc := range []struct {
		timeout time.Duration
		opts    []Option
	}{{DefaultTimeout, nil}, {50 * time.Millisecond, []Option{WithTimeout(50 * time.Millisecond)}}} {
		// left is the time the call's context had left when it was sent
		// (math.MaxInt64: it had no deadline).
		var left atomic.Int64
		var sent atomic.Int32
		left.Store(math.MaxInt64)
		record := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			sent.Add(1)
			if d, ok := ctx.Deadline(); ok {
				left.Store(int64(time.Until(d)))
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		c, err := Dial(addr, append(tc.opts, WithDialOptions(grpc.WithUnaryInterceptor(record)))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		caller := testCtx(t)
		start := time.Now()
		r, err := c.ShouldRateLimit(caller, "api", []Descriptor{{{"user", "a"}}}, 1)
		took := time.Since(start)
		if status.Code(err) != codes.DeadlineExceeded || !r.Allowed {
			t.Fatalf("stalled server: %+v, %v; want DEADLINE_EXCEEDED and allowed", r, err)
		}
		// The call ends at the client's timeout: not before it, with a
		// deadline no further than the timeout, and while the caller's
		// (10 s) context still runs, in one call, not tried again. (No
		// upper bound on the time taken: a busy machine may be late by
		// any amount.)
		if l := time.Duration(left.Load()); took < tc.timeout || l > tc.timeout || caller.Err() != nil || sent.Load() != 1 {
			t.Fatalf("gave up after %v and %d calls with %v left when sent (caller's context: %v), want after %v, 1 call with at most %v left",
				took, sent.Load(), l, caller.Err(), tc.timeout, tc.timeout)
		}
	}
}

// Concurrent callers of one Client get exactly the limit.
func TestClient_Concurrent(t *testing.T) {
	clock := newFakeClock(tWindow)
	c := dial(t, startSluice(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 20}
`, clock), WithTimeout(5*time.Second))
	ctx := testCtx(t)
	var allowed, failed atomic.Int64
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			r, err := c.Check(ctx, "api", []Descriptor{{{"user", "bob"}}}, 1)
			if err != nil {
				failed.Add(1)
			}
			if r.Allowed {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 20 || failed.Load() != 0 {
		t.Fatalf("%d allowed, %d failed of 50; want 20 and 0", allowed.Load(), failed.Load())
	}
	if st := c.Stats(); st.Calls != 50 || st.OverLimit != 30 {
		t.Fatalf("Stats() = %+v", st)
	}
}

func TestDial_BadTarget(t *testing.T) {
	if _, err := Dial("dns:///%%bad"); err == nil || errors.Is(err, ErrRateLimited) {
		t.Fatalf("Dial(bad target) = %v, want an error", err)
	}
}

func TestNew_CallerOwnsConn(t *testing.T) {
	addr := startSluice(t, limitsYAML, newFakeClock(tWindow))
	var seen atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		seen.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(count))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := New(conn, WithTimeout(5*time.Second))
	if r, err := c.Check(testCtx(t), "api", []Descriptor{{{"user", "hal"}}}, 1); err != nil || !r.Allowed || seen.Load() != 1 {
		t.Fatalf("Check over a caller's conn: %+v, %v, %d calls seen", r, err, seen.Load())
	}
	c.Close()
	if conn.GetState() == connectivity.Shutdown {
		t.Fatal("Client.Close closed a connection it did not make")
	}
	// WithDialOptions reaches Dial's connection.
	d := dial(t, addr, WithDialOptions(grpc.WithUnaryInterceptor(count)))
	if _, err := d.ShouldRateLimit(testCtx(t), "api", []Descriptor{{{"user", "hal"}}}, 1); err != nil || seen.Load() != 2 {
		t.Fatalf("Dial with options: %v, %d calls seen, want 2", err, seen.Load())
	}
}
