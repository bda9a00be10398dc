package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

var (
	errUnavailable = status.Error(codes.Unavailable, "down")
	errInvalid     = status.Error(codes.InvalidArgument, "bad")
)

func exhausted(after time.Duration) error {
	s, _ := status.New(codes.ResourceExhausted, "slow down").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(after)})
	return s.Err()
}

func top(n int64) int64    { return n - 1 }
func bottom(n int64) int64 { return 0 }

// scriptedInvoker answers the i-th attempt with errs[i] (nil past the
// end) and records when each attempt came, relative to its creation.
type scriptedInvoker struct {
	errs  []error
	start time.Time
	at    []time.Duration
}

func newScriptedInvoker(errs ...error) *scriptedInvoker {
	return &scriptedInvoker{errs: errs, start: time.Now()}
}

func (s *scriptedInvoker) invoke(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
	i := len(s.at)
	s.at = append(s.at, time.Since(s.start))
	if i < len(s.errs) {
		return s.errs[i]
	}
	return nil
}

func newBudget(t *testing.T, initial int) *RetryBudget {
	t.Helper()
	return newTestBudget(t, BudgetConfig{Initial: initial})
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestRetrier_Unary(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name        string
		errs        []error
		rand        func(int64) int64
		maxAttempts int
		wantCode    codes.Code
		wantAt      []time.Duration
		wantBalance int64 // from 50
	}{
		{"retries then succeeds", []error{errUnavailable, errUnavailable}, top, 0, codes.OK, []time.Duration{0, 750 * ms, 3000 * ms}, 30},
		{"retry-after is a floor", []error{exhausted(5 * time.Second)}, bottom, 0, codes.OK, []time.Duration{0, 5 * time.Second}, 40},
		{"not retryable", []error{errInvalid}, top, 0, codes.InvalidArgument, []time.Duration{0}, 51},
		{"first-try success deposits", nil, top, 0, codes.OK, []time.Duration{0}, 51},
		{"max attempts", []error{errUnavailable, errUnavailable, errUnavailable, errUnavailable}, bottom, 3, codes.Unavailable, []time.Duration{0, 250 * ms, 500 * ms}, 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				budget := newBudget(t, 5)
				r := NewRetrier(RetryConfig{Budget: budget, Backoff: Backoff{Rand: tc.rand}, MaxAttempts: tc.maxAttempts})
				inv := newScriptedInvoker(tc.errs...)
				err := r.UnaryClientInterceptor()(context.Background(), "/m", nil, nil, nil, inv.invoke)
				if status.Code(err) != tc.wantCode || errors.Is(err, ErrRetryBudgetExhausted) {
					t.Fatalf("err = %v, want code %v", err, tc.wantCode)
				}
				if !equalDurations(inv.at, tc.wantAt) {
					t.Fatalf("attempts at %v, want %v", inv.at, tc.wantAt)
				}
				if budget.Balance() != tc.wantBalance {
					t.Fatalf("budget balance %d, want %d", budget.Balance(), tc.wantBalance)
				}
			})
		})
	}
}

// A refused retry fails at once, is never queued, and keeps the code.
func TestRetrier_BudgetRefusedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRetrier(RetryConfig{Budget: newBudget(t, -1)})
		inv := newScriptedInvoker(errUnavailable, errUnavailable)
		start := time.Now()
		err := r.UnaryClientInterceptor()(context.Background(), "/m", nil, nil, nil, inv.invoke)
		if !errors.Is(err, ErrRetryBudgetExhausted) || status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v, want ErrRetryBudgetExhausted with code UNAVAILABLE", err)
		}
		if len(inv.at) != 1 || time.Since(start) != 0 {
			t.Fatalf("%d attempts over %v; want one, at once", len(inv.at), time.Since(start))
		}
	})
}

// A retry that would wait past the deadline is not made, nor paid for.
func TestRetrier_DeadlineCutsRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		budget := newBudget(t, 5)
		r := NewRetrier(RetryConfig{Budget: budget})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		inv := newScriptedInvoker(exhausted(5 * time.Second))
		start := time.Now()
		err := r.UnaryClientInterceptor()(ctx, "/m", nil, nil, nil, inv.invoke)
		if status.Code(err) != codes.ResourceExhausted || len(inv.at) != 1 || time.Since(start) != 0 || budget.Balance() != 50 {
			t.Fatalf("err %v after %d attempts in %v, balance %d; want the server's error at once, balance 50",
				err, len(inv.at), time.Since(start), budget.Balance())
		}
	})
}

func TestRetrier_CancelDuringWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := NewRetrier(RetryConfig{Backoff: Backoff{Rand: top}})
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		inv := newScriptedInvoker(errUnavailable)
		start := time.Now()
		err := r.UnaryClientInterceptor()(ctx, "/m", nil, nil, nil, inv.invoke)
		if status.Code(err) != codes.Canceled || len(inv.at) != 1 || time.Since(start) != 100*time.Millisecond {
			t.Fatalf("err %v after %d attempts in %v; want CANCELED after one attempt at 100ms", err, len(inv.at), time.Since(start))
		}
	})
}

// A healthy spell fills the budget to its cap; then a 60 s outage with a
// call every 10 ms: every first try still goes out, retries stop once
// the cap's worth is spent, and refusals say so.
func TestRetrier_Outage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		budget := newBudget(t, 0)
		r := NewRetrier(RetryConfig{Budget: budget, MaxAttempts: 2, Backoff: Backoff{Base: time.Millisecond, Cap: time.Millisecond}})
		ic := r.UnaryClientInterceptor()
		var attempts int
		healthy := true
		invoke := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			attempts++
			if healthy {
				return nil
			}
			return errUnavailable
		}
		for range 2000 {
			ic(context.Background(), "/m", nil, nil, nil, invoke)
		}
		healthy, attempts = false, 0
		refused, failed := 0, 0
		for range 6000 {
			next := time.Now().Add(10 * time.Millisecond)
			err := ic(context.Background(), "/m", nil, nil, nil, invoke)
			switch {
			case errors.Is(err, ErrRetryBudgetExhausted):
				refused++
			case status.Code(err) == codes.Unavailable:
				failed++
			default:
				t.Fatalf("outage call: %v", err)
			}
			time.Sleep(time.Until(next))
		}
		if retries := attempts - 6000; retries != DefaultBudgetCap || failed != DefaultBudgetCap || refused != 6000-DefaultBudgetCap {
			t.Fatalf("outage: %d attempts (%d retries), %d failed after a retry, %d refused; want %d retries then refusals",
				attempts, retries, failed, refused, DefaultBudgetCap)
		}
	})
}

func TestRetrier_Pacing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bucket, err := NewBucket(8, time.Second, 2, nil)
		if err != nil {
			t.Fatal(err)
		}
		wait := NewRetrier(RetryConfig{Bucket: bucket}).UnaryClientInterceptor()
		inv := newScriptedInvoker()
		for range 3 {
			if err := wait(context.Background(), "/m", nil, nil, nil, inv.invoke); err != nil {
				t.Fatal(err)
			}
		}
		if want := []time.Duration{0, 0, 125 * time.Millisecond}; !equalDurations(inv.at, want) {
			t.Fatalf("paced attempts at %v, want %v", inv.at, want)
		}
		fast := NewRetrier(RetryConfig{Bucket: bucket, FailFast: true}).UnaryClientInterceptor()
		err = fast(context.Background(), "/m", nil, nil, nil, inv.invoke)
		if !errors.Is(err, ErrRateLimited) || status.Code(err) != codes.ResourceExhausted || len(inv.at) != 3 {
			t.Fatalf("fail fast on an empty bucket: %v after %d attempts; want ErrRateLimited, RESOURCE_EXHAUSTED and no attempt", err, len(inv.at))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := wait(ctx, "/m", nil, nil, nil, inv.invoke); status.Code(err) != codes.DeadlineExceeded || len(inv.at) != 3 {
			t.Fatalf("pacing past the deadline: %v after %d attempts; want DEADLINE_EXCEEDED and no attempt", err, len(inv.at))
		}
	})
}

// flaky fails every other call with UNAVAILABLE.
type flaky struct{ n atomic.Int64 }

func (f *flaky) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if f.n.Add(1)%2 == 1 {
		return nil, errUnavailable
	}
	return h(ctx, req)
}

// Many goroutines share one Retrier over a real connection.
func TestRetrier_Concurrent(t *testing.T) {
	var f flaky
	app := startAppClient(t, []grpc.ServerOption{grpc.UnaryInterceptor(f.intercept)},
		grpc.WithUnaryInterceptor(NewRetrier(RetryConfig{Budget: newBudget(t, 100),
			Backoff: Backoff{Base: time.Millisecond, Cap: 2 * time.Millisecond}}).UnaryClientInterceptor()))
	var ok, refused, failed atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range 25 {
				_, err := app.Check(testCtx(t), &healthpb.HealthCheckRequest{})
				switch {
				case err == nil:
					ok.Add(1)
				case errors.Is(err, ErrRetryBudgetExhausted):
					refused.Add(1)
				case status.Code(err) == codes.Unavailable: // five failures in a row
					failed.Add(1)
				default:
					t.Errorf("call: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if ok.Load()+refused.Load()+failed.Load() != 400 || f.n.Load() <= 400 || ok.Load() < 200 {
		t.Fatalf("%d ok, %d refused, %d failed, %d server calls; want every call accounted for and retries made",
			ok.Load(), refused.Load(), failed.Load(), f.n.Load())
	}
}

// rtFunc is a hand-written RoundTripper.
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// trackedBody records whether it was closed.
type trackedBody struct {
	io.Reader
	closed bool
}

func (b *trackedBody) Close() error { b.closed = true; return nil }

func response(code int, retryAfter string) (*http.Response, *trackedBody) {
	body := &trackedBody{Reader: strings.NewReader("busy")}
	resp := &http.Response{StatusCode: code, Status: fmt.Sprintf("%d %s", code, http.StatusText(code)), Header: http.Header{}, Body: body}
	if retryAfter != "" {
		resp.Header.Set("Retry-After", retryAfter)
	}
	return resp, body
}

func TestRoundTripper_Retries(t *testing.T) {
	var hits atomic.Int64
	var bodies sync.Map
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		bodies.Store(n, string(b))
		if n <= 2 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "done")
	}))
	t.Cleanup(srv.Close)
	client := &http.Client{Transport: NewRetrier(RetryConfig{Backoff: Backoff{Base: time.Millisecond, Cap: time.Millisecond}}).RoundTripper(srv.Client().Transport)}
	req, _ := http.NewRequestWithContext(testCtx(t), http.MethodPut, srv.URL, strings.NewReader("payload"))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(got) != "done" || hits.Load() != 3 {
		t.Fatalf("%d %q after %d hits, want 200 done after 3", resp.StatusCode, got, hits.Load())
	}
	for n := int64(1); n <= 3; n++ {
		if b, _ := bodies.Load(n); b != "payload" {
			t.Fatalf("attempt %d sent body %q, want the replayed payload", n, b)
		}
	}
}

func TestRoundTripper_WhatIsRetried(t *testing.T) {
	opaque := func() io.Reader { return io.MultiReader(strings.NewReader("x")) } // no GetBody
	for _, tc := range []struct {
		name     string
		method   string
		body     func() io.Reader
		header   string
		anyMeth  bool
		attempts int
	}{
		{"GET", http.MethodGet, nil, "", false, 3},
		{"PUT with a replayable body", http.MethodPut, func() io.Reader { return strings.NewReader("x") }, "", false, 3},
		{"PUT with a body that cannot be replayed", http.MethodPut, opaque, "", false, 1},
		{"POST", http.MethodPost, func() io.Reader { return strings.NewReader("x") }, "", false, 1},
		{"POST with an idempotency key", http.MethodPost, func() io.Reader { return strings.NewReader("x") }, "Idempotency-Key", false, 3},
		{"POST opted in", http.MethodPost, func() io.Reader { return strings.NewReader("x") }, "", true, 3},
		{"POST opted in, body not replayable", http.MethodPost, opaque, "", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				attempts := 0
				next := rtFunc(func(r *http.Request) (*http.Response, error) {
					attempts++
					if r.Body != nil {
						io.ReadAll(r.Body)
						r.Body.Close()
					}
					resp, _ := response(http.StatusTooManyRequests, "")
					return resp, nil
				})
				rt := NewRetrier(RetryConfig{MaxAttempts: 3, RetryAnyMethod: tc.anyMeth}).RoundTripper(next)
				var body io.Reader
				if tc.body != nil {
					body = tc.body()
				}
				req, _ := http.NewRequest(tc.method, "http://example.test/", body)
				if tc.header != "" {
					req.Header.Set(tc.header, "k1")
				}
				resp, err := rt.RoundTrip(req)
				if err != nil || resp.StatusCode != http.StatusTooManyRequests || attempts != tc.attempts {
					t.Fatalf("%v, %v after %d attempts; want the 429 after %d", resp, err, attempts, tc.attempts)
				}
			})
		})
	}
}

func TestRoundTripper_RetryAfterFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var at []time.Duration
		var first *trackedBody
		next := rtFunc(func(*http.Request) (*http.Response, error) {
			at = append(at, time.Since(start))
			if len(at) == 1 {
				resp, body := response(http.StatusTooManyRequests, "3")
				first = body
				return resp, nil
			}
			resp, _ := response(http.StatusOK, "")
			return resp, nil
		})
		rt := NewRetrier(RetryConfig{Backoff: Backoff{Rand: bottom}}).RoundTripper(next)
		req, _ := http.NewRequest(http.MethodGet, "http://example.test/", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("%v, %v", resp, err)
		}
		if want := []time.Duration{0, 3 * time.Second}; !equalDurations(at, want) {
			t.Fatalf("attempts at %v, want %v", at, want)
		}
		if !first.closed {
			t.Fatal("the retried response's body was not closed")
		}
	})
}

func TestRoundTripper_BudgetExhausted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var body *trackedBody
		attempts := 0
		next := rtFunc(func(*http.Request) (*http.Response, error) {
			attempts++
			var resp *http.Response
			resp, body = response(http.StatusServiceUnavailable, "")
			return resp, nil
		})
		rt := NewRetrier(RetryConfig{Budget: newBudget(t, -1)}).RoundTripper(next)
		req, _ := http.NewRequest(http.MethodGet, "http://example.test/", nil)
		resp, err := rt.RoundTrip(req)
		if !errors.Is(err, ErrRetryBudgetExhausted) || resp != nil || attempts != 1 || !body.closed {
			t.Fatalf("%v, %v after %d attempts (body closed %v); want ErrRetryBudgetExhausted after 1, body closed", resp, err, attempts, body.closed)
		}
		if !strings.Contains(err.Error(), "503") {
			t.Fatalf("error %q does not name the response", err)
		}
	})
}

func TestRoundTripper_FailFastClosesBody(t *testing.T) {
	bucket, err := NewBucket(1, time.Hour, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	bucket.Allow()
	rt := NewRetrier(RetryConfig{Bucket: bucket, FailFast: true}).RoundTripper(rtFunc(func(*http.Request) (*http.Response, error) {
		t.Fatal("attempt made on an empty bucket")
		return nil, nil
	}))
	body := &trackedBody{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest(http.MethodPut, "http://example.test/", body)
	if _, err := rt.RoundTrip(req); !errors.Is(err, ErrRateLimited) || !body.closed {
		t.Fatalf("err %v, body closed %v; want ErrRateLimited and the body closed", err, body.closed)
	}
}

func TestRetryAfterHeader(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                              0,
		"0":                             0,
		"120":                           2 * time.Minute,
		"-5":                            0,
		"soon":                          0,
		"Sun, 22 Nov 2026 12:00:30 GMT": 30 * time.Second,
		"Sun, 22 Nov 2026 11:00:00 GMT": 0,
	} {
		if got := retryAfterHeader(v, now); got != want {
			t.Errorf("retryAfterHeader(%q) = %v, want %v", v, got, want)
		}
	}
}
