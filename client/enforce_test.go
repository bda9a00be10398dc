package client

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// byUser limits calls by the x-user metadata; calls without it are not
// checked.
func byUser(_ string, md metadata.MD) []Descriptor {
	u := md.Get("x-user")
	if len(u) == 0 {
		return nil
	}
	return []Descriptor{{{"user", u[0]}}}
}

// startApp runs a gRPC application (the standard health service) behind
// opts and returns a client connection to it.
func startApp(t *testing.T, opts ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	return startAppClient(t, opts)
}

// startAppClient is startApp with options for the client connection too.
func startAppClient(t *testing.T, serverOpts []grpc.ServerOption, dialOpts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	s := grpc.NewServer(serverOpts...)
	healthpb.RegisterHealthServer(s, health.NewServer())
	dialOpts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, dialOpts...)
	conn, err := grpc.NewClient(serveGRPC(t, s), dialOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func asUser(ctx context.Context, u string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-user", u)
}

func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func TestUnaryServerInterceptor(t *testing.T) {
	for _, proto := range []struct {
		name  string
		opts  []Option
		retry time.Duration
	}{{"sluice.v1", nil, 50 * time.Second}, {"envoy", []Option{WithEnvoyRLS()}, 50 * time.Second}} {
		t.Run(proto.name, func(t *testing.T) {
			c := dial(t, startSluice(t, limitsYAML, newFakeClock(tWindow)), proto.opts...)
			app := startApp(t, grpc.UnaryInterceptor(c.UnaryServerInterceptor("api", byUser)))
			ctx := asUser(testCtx(t), "alice")
			for i := range 2 {
				if _, err := app.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
			}
			var trailer metadata.MD
			_, err := app.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
			if status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("third call: %v, want RESOURCE_EXHAUSTED", err)
			}
			if d, ok := retryDelay(err); !ok || d != proto.retry {
				t.Fatalf("RetryInfo = %v, %v; want %v", d, ok, proto.retry)
			}
			if got := trailer.Get(PushbackTrailer); len(got) != 1 || got[0] != "50000" {
				t.Fatalf("trailer %s = %q, want 50000", PushbackTrailer, got)
			}
			// Another user, and a call without descriptors, go through.
			if _, err := app.Check(asUser(testCtx(t), "bob"), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("another user: %v", err)
			}
			if _, err := app.Check(testCtx(t), &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("no descriptors: %v", err)
			}
		})
	}
}

func TestStreamServerInterceptor(t *testing.T) {
	c := dial(t, startSluice(t, limitsYAML, newFakeClock(tWindow)))
	app := startApp(t, grpc.StreamInterceptor(c.StreamServerInterceptor("api", byUser)))
	ctx := asUser(testCtx(t), "carol")
	watch := func() error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		st, err := app.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return err
		}
		_, err = st.Recv()
		return err
	}
	for i := range 2 {
		if err := watch(); err != nil {
			t.Fatalf("stream %d: %v", i+1, err)
		}
	}
	err := watch()
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	if d, ok := retryDelay(err); !ok || d != 50*time.Second {
		t.Fatalf("RetryInfo = %v, %v; want 50s", d, ok)
	}
}

func TestServerInterceptor_FailureMode(t *testing.T) {
	addr := deadAddr(t)
	for _, tc := range []struct {
		mode FailureMode
		want codes.Code
	}{{FailAllow, codes.OK}, {FailDeny, codes.Unavailable}} {
		c := dial(t, addr, WithFailureMode(tc.mode))
		app := startApp(t, grpc.UnaryInterceptor(c.UnaryServerInterceptor("api", byUser)))
		_, err := app.Check(asUser(testCtx(t), "dave"), &healthpb.HealthCheckRequest{})
		if status.Code(err) != tc.want {
			t.Fatalf("mode %d with Sluice down: %v, want %v", tc.mode, err, tc.want)
		}
		if c.Stats().Failures != 1 {
			t.Fatalf("mode %d: Stats() = %+v, want one failure", tc.mode, c.Stats())
		}
	}
}

// The go-grpc-middleware Limiter sees the method through grpc.Method.
func TestLimiter_GoGRPCMiddleware(t *testing.T) {
	c := dial(t, startSluice(t, limitsYAML, newFakeClock(tWindow)))
	var methods []string
	fn := func(method string, md metadata.MD) []Descriptor {
		methods = append(methods, method)
		return byUser(method, md)
	}
	app := startApp(t, grpc.UnaryInterceptor(ratelimit.UnaryServerInterceptor(c.Limiter("api", fn))))
	ctx := asUser(testCtx(t), "erin")
	var err error
	for range 3 {
		_, err = app.Check(ctx, &healthpb.HealthCheckRequest{})
	}
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry after 50s") {
		t.Fatalf("third call: %v, want RESOURCE_EXHAUSTED saying retry after 50s", err)
	}
	if methods[0] != "/grpc.health.v1.Health/Check" {
		t.Fatalf("descriptor function saw method %q", methods[0])
	}
}

func TestHTTPMiddleware(t *testing.T) {
	c := dial(t, startSluice(t, limitsYAML, newFakeClock(tWindow)))
	byHeader := func(r *http.Request) []Descriptor {
		if u := r.Header.Get("X-User"); u != "" {
			return []Descriptor{{{"user", u}}}
		}
		return nil
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello") })
	srv := httptest.NewServer(c.HTTPMiddleware("api", byHeader)(ok))
	t.Cleanup(srv.Close)
	get := func(user string) *http.Response {
		req, _ := http.NewRequestWithContext(testCtx(t), "GET", srv.URL, nil)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for i, want := range []struct {
		code             int
		remaining, retry string
	}{{200, "1", ""}, {200, "0", ""}, {429, "0", "50"}} {
		resp := get("frank")
		h := resp.Header
		if resp.StatusCode != want.code || h.Get("RateLimit-Limit") != "2" || h.Get("RateLimit-Remaining") != want.remaining ||
			h.Get("RateLimit-Reset") != "50" || h.Get("Retry-After") != want.retry {
			t.Fatalf("request %d: %d %v; want %d remaining %s retry %q", i+1, resp.StatusCode, h, want.code, want.remaining, want.retry)
		}
	}
	if resp := get(""); resp.StatusCode != 200 || resp.Header.Get("RateLimit-Limit") != "" {
		t.Fatalf("unchecked request: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestHTTPMiddleware_FailureMode(t *testing.T) {
	addr := deadAddr(t)
	all := func(*http.Request) []Descriptor { return []Descriptor{{{"user", "x"}}} }
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {})
	for _, tc := range []struct {
		mode FailureMode
		want int
	}{{FailAllow, 200}, {FailDeny, 503}} {
		c := dial(t, addr, WithFailureMode(tc.mode))
		rec := httptest.NewRecorder()
		c.HTTPMiddleware("api", all)(ok).ServeHTTP(rec, httptest.NewRequestWithContext(testCtx(t), "GET", "/", nil))
		if rec.Code != tc.want || rec.Header().Get("RateLimit-Limit") != "" {
			t.Fatalf("mode %d with Sluice down: %d %v, want %d without limit headers", tc.mode, rec.Code, rec.Header(), tc.want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, 1: 1, time.Second: 1, time.Second + 1: 2, 125 * time.Millisecond: 1} {
		if got := ceilSeconds(d); got != want {
			t.Errorf("ceilSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// heldClock reads t0 until run is called, then t0 plus the real time since:
// Sluice's clock stands still while a test sets up, however slow the
// machine, and runs with real time while a real timer (the Retrier's
// wait) is being tested.
type heldClock struct {
	t0    int64
	since atomic.Pointer[time.Time]
}

func (c *heldClock) Now() int64 {
	if s := c.since.Load(); s != nil {
		return c.t0 + int64(time.Since(*s))
	}
	return c.t0
}

func (c *heldClock) run() {
	now := time.Now()
	c.since.Store(&now)
}

// The whole loop: an application enforces a token bucket through Sluice,
// its denial carries RetryInfo, and a client's Retrier waits that long
// and gets through. Sluice's clock stands still until the denial (so the
// bucket cannot refill between the first two calls on a slow machine),
// then runs in real time: the retry is allowed only if the Retrier really
// waited the 100 ms the denial asked for, which the server measures.
func TestRetrier_HonoursSluiceRetryInfo(t *testing.T) {
	clock := &heldClock{t0: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
	c := dial(t, startSluice(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 1}
`, clock))
	var calls atomic.Int64
	// When the second call was denied and the third came, in Unix ns
	// (atomics: the test reads them across a network round trip, which the
	// race detector does not see as synchronisation).
	var denied, retried atomic.Int64
	count := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		n := calls.Add(1)
		if n == 3 {
			retried.Store(time.Now().UnixNano())
		}
		resp, err := h(ctx, req)
		if n == 2 {
			if d, ok := retryDelay(err); !ok || d != 100*time.Millisecond {
				t.Errorf("second call: %v, want a denial with a RetryInfo of 100ms", err)
			}
			denied.Store(time.Now().UnixNano())
			clock.run()
		}
		return resp, err
	}
	app := startAppClient(t,
		[]grpc.ServerOption{grpc.ChainUnaryInterceptor(count, c.UnaryServerInterceptor("api", byUser))},
		grpc.WithUnaryInterceptor(NewRetrier(RetryConfig{Budget: newBudget(t, 1),
			Backoff: Backoff{Base: time.Millisecond, Cap: time.Millisecond}}).UnaryClientInterceptor()))
	ctx := asUser(testCtx(t), "gina")
	if _, err := app.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := app.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("second call: %v, want success after a retry", err)
	}
	if n := calls.Load(); n != 3 {
		t.Fatalf("%d server calls, want 3: the first, its denial and the retry", n)
	}
	if waited := time.Duration(retried.Load() - denied.Load()); waited < 100*time.Millisecond {
		t.Fatalf("retried %v after the denial, want at least its RetryInfo of 100ms", waited)
	}
}
