package server_test

import (
	"context"
	"log/slog"
	"math"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/config"
	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const limits = `
domain: e2e
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_ip}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 1, name: login}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: user
    value: bot-*
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: api_key
    descriptors:
      - key: method
        value: POST
        rate_limit: {unit: second, requests_per_unit: 3}
  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 1, name: small_rule}
  - key: big
    rate_limit: {unit: minute, requests_per_unit: 100, replaces: [{name: small_rule}]}
  - key: tokens
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
  - key: tier
    metadata: {plan: {name: gold, seats: 3}, region: eu}
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: tier_second}
      - {unit: minute, requests_per_unit: 3, name: tier_minute}
  - key: extra
    metadata: {plan: {extra: true}, region: us}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: quota_rule}
  - key: budget
    rate_limit: {unit: day, requests_per_unit: 10000000000, name: budget}
`

// t0 is a minute boundary: a minute window resets 60 s after it.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

type tables struct{ t *config.Table }

func (t tables) Current() *config.Table { return t.t }

func loadTable(t testing.TB) *config.Table {
	t.Helper()
	p := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte(limits), 0o644); err != nil {
		t.Fatal(err)
	}
	table, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return table
}

type env struct {
	clock  *storetest.Clock
	health *server.Health
	rls    rlspb.RateLimitServiceClient
	api    sluicev1.RateLimiterClient
	hc     healthpb.HealthClient
	http   *httptest.Server
}

// newEnv serves lim over a real loopback gRPC listener and an httptest
// server.
func newEnv(t *testing.T, lopts limiter.Options, sopts server.Options) *env {
	t.Helper()
	table := loadTable(t)
	e := &env{clock: storetest.NewClock(t0), health: server.NewHealth()}
	lopts.Clock = e.clock
	lim := limiter.New(tables{table}, memory.New(memory.Options{}), lopts)
	gs := server.NewGRPC(lim, e.health, server.GRPCOptions{Options: sopts})
	cc := serveLoopback(t, gs)
	e.rls, e.api, e.hc = rlspb.NewRateLimitServiceClient(cc), sluicev1.NewRateLimiterClient(cc), healthpb.NewHealthClient(cc)
	e.http = httptest.NewServer(server.NewHTTP(lim, e.health, sopts))
	t.Cleanup(e.http.Close)
	e.health.SetServing(true)
	return e
}

// serveLoopback serves gs on a loopback port and returns a client
// connection to it; both stop when the test ends.
func serveLoopback(tb testing.TB, gs *grpc.Server) *grpc.ClientConn {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go gs.Serve(lis)
	tb.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return cc
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// d builds an Envoy descriptor from key, value pairs.
func d(kv ...string) *commonpb.RateLimitDescriptor {
	out := &commonpb.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		out.Entries = append(out.Entries, &commonpb.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

func hits(desc *commonpb.RateLimitDescriptor, n uint64) *commonpb.RateLimitDescriptor {
	desc.HitsAddend = wrapperspb.UInt64(n)
	return desc
}

func override(desc *commonpb.RateLimitDescriptor, n uint32, unit typepb.RateLimitUnit) *commonpb.RateLimitDescriptor {
	desc.Limit = &commonpb.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	return desc
}

func multiplied(desc *commonpb.RateLimitDescriptor, m uint32) *commonpb.RateLimitDescriptor {
	desc.Limit.UnitMultiplier = wrapperspb.UInt32(m)
	return desc
}

func negative(desc *commonpb.RateLimitDescriptor) *commonpb.RateLimitDescriptor {
	desc.IsNegativeHits = true
	return desc
}

func withMultiplier(s *dstat, m uint32) *dstat {
	s.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(m)
	return s
}

func req(hitsAddend uint32, ds ...*commonpb.RateLimitDescriptor) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: "e2e", Descriptors: ds, HitsAddend: hitsAddend}
}

type (
	resp   = rlspb.RateLimitResponse
	dstat  = rlspb.RateLimitResponse_DescriptorStatus
	rlimit = rlspb.RateLimitResponse_RateLimit
)

const (
	ok   = rlspb.RateLimitResponse_OK
	over = rlspb.RateLimitResponse_OVER_LIMIT
)

func st(code rlspb.RateLimitResponse_Code, name string, rpu uint32, unit rlspb.RateLimitResponse_RateLimit_Unit, remaining uint32, reset time.Duration) *dstat {
	return &dstat{Code: code, CurrentLimit: &rlimit{Name: name, RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining: remaining, DurationUntilReset: durationpb.New(reset)}
}

var (
	noRule    = &dstat{Code: ok}
	unlimited = &dstat{Code: ok, LimitRemaining: math.MaxUint32}
	minute    = rlspb.RateLimitResponse_RateLimit_MINUTE
	hour      = rlspb.RateLimitResponse_RateLimit_HOUR
	second    = rlspb.RateLimitResponse_RateLimit_SECOND
)

func overall(code rlspb.RateLimitResponse_Code, sts ...*dstat) *resp {
	return &resp{OverallCode: code, Statuses: sts}
}

// TestShouldRateLimit walks Envoy's semantics through the gRPC wire, one
// step at a time at fixed instants.
func TestShouldRateLimit(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	steps := []struct {
		name    string
		advance time.Duration
		in      *rlspb.RateLimitRequest
		want    *resp
	}{
		{name: "unknown domain", in: &rlspb.RateLimitRequest{Domain: "nope", Descriptors: []*commonpb.RateLimitDescriptor{d("remote_address", "1")}},
			want: overall(ok, noRule)},
		{name: "no rule", in: req(0, d("nothing", "x")), want: overall(ok, noRule)},
		{name: "level rule 1", in: req(0, d("remote_address", "10.0.0.1")), want: overall(ok, st(ok, "per_ip", 2, minute, 1, time.Minute))},
		{name: "level rule 2", in: req(0, d("remote_address", "10.0.0.1")), want: overall(ok, st(ok, "per_ip", 2, minute, 0, time.Minute))},
		{name: "level rule 3", in: req(0, d("remote_address", "10.0.0.1")), want: overall(over, st(over, "per_ip", 2, minute, 0, time.Minute))},
		{name: "level rule, other value", in: req(0, d("remote_address", "10.0.0.2")), want: overall(ok, st(ok, "per_ip", 2, minute, 1, time.Minute))},
		{name: "exact value", in: req(0, d("path", "/login")), want: overall(ok, st(ok, "login", 1, minute, 0, time.Minute))},
		{name: "key-only beside exact", in: req(0, d("path", "/home")), want: overall(ok, st(ok, "", 5, minute, 4, time.Minute))},
		{name: "wildcard", in: req(0, d("user", "bot-1")), want: overall(ok, st(ok, "", 1, hour, 0, time.Hour))},
		{name: "wildcard, each value apart", in: req(0, d("user", "bot-2")), want: overall(ok, st(ok, "", 1, hour, 0, time.Hour))},
		{name: "wildcard again", in: req(0, d("user", "bot-1")), want: overall(over, st(over, "", 1, hour, 0, time.Hour))},
		{name: "wildcard no match", in: req(0, d("user", "human")), want: overall(ok, noRule)},
		{name: "nested", in: req(0, d("api_key", "k", "method", "POST")), want: overall(ok, st(ok, "", 3, second, 2, time.Second))},
		{name: "nested, too few entries", in: req(0, d("api_key", "k")), want: overall(ok, noRule)},
		{name: "unlimited", in: req(100, d("free", "x")), want: overall(ok, unlimited)},
		{name: "shadow 1", in: req(0, d("shadow", "x")), want: overall(ok, st(ok, "", 1, minute, 0, time.Minute))},
		{name: "shadow over", in: req(0, d("shadow", "x")), want: overall(ok, st(ok, "", 1, minute, 0, time.Minute))},
		{name: "replaces", in: req(0, d("small", "r"), d("big", "r")), want: overall(ok, noRule, st(ok, "", 100, minute, 99, time.Minute))},
		{name: "replaced rule not counted", in: req(0, d("small", "r")), want: overall(ok, st(ok, "small_rule", 1, minute, 0, time.Minute))},
		{name: "request hits_addend", in: req(3, d("path", "/a")), want: overall(ok, st(ok, "", 5, minute, 2, time.Minute))},
		{name: "descriptor hits_addend wins (a charge)", in: req(3, hits(d("path", "/a"), 1)), want: overall(ok, st(ok, "", 5, minute, 1, time.Minute))},
		{name: "descriptor hits_addend 0 checks", in: req(0, hits(d("path", "/a"), 0)), want: overall(ok, st(ok, "", 5, minute, 1, time.Minute))},
		{name: "all-or-nothing: a charge that does not fit denies", in: req(0, d("path", "/b"), hits(d("path", "/a"), 2)),
			want: overall(over, st(ok, "", 5, minute, 5, time.Minute), st(over, "", 5, minute, 0, time.Minute))},
		{name: "nothing consumed", in: req(0, hits(d("path", "/b"), 0)), want: overall(ok, st(ok, "", 5, minute, 5, time.Minute))},
		{name: "the charge was recorded whole: a check is over", in: req(0, hits(d("path", "/a"), 0)), want: overall(over, st(over, "", 5, minute, 0, time.Minute))},
		{name: "is_negative_hits gives 3 of the 6 back", in: req(0, negative(hits(d("path", "/a"), 3))), want: overall(ok, st(ok, "", 5, minute, 2, time.Minute))},
		{name: "a check fits again", in: req(0, hits(d("path", "/a"), 0)), want: overall(ok, st(ok, "", 5, minute, 2, time.Minute))},
		{name: "override", in: req(0, override(d("shadow", "o"), 1, typepb.RateLimitUnit_HOUR)), want: overall(ok, st(ok, "", 1, hour, 0, time.Hour))},
		{name: "override, no shadow", in: req(0, override(d("shadow", "o"), 1, typepb.RateLimitUnit_HOUR)), want: overall(over, st(over, "", 1, hour, 0, time.Hour))},
		{name: "override without a rule", in: req(0, override(d("nothing", "o"), 7, typepb.RateLimitUnit_DAY)),
			want: overall(ok, st(ok, "", 7, rlspb.RateLimitResponse_RateLimit_DAY, 6, 24*time.Hour))},
		{name: "override with a multiplier", in: req(0, multiplied(override(d("nothing", "m"), 2, typepb.RateLimitUnit_MINUTE), 5)),
			want: overall(ok, withMultiplier(st(ok, "", 2, minute, 1, 5*time.Minute), 5))},
		{name: "override with a multiplier counts apart", in: req(0, override(d("nothing", "m"), 2, typepb.RateLimitUnit_MINUTE)),
			want: overall(ok, st(ok, "", 2, minute, 1, time.Minute))},
		{name: "is_negative_hits never goes below empty", in: req(0, negative(hits(d("path", "/neg"), 3))), want: overall(ok, st(ok, "", 5, minute, 5, time.Minute))},
		{name: "token bucket", in: req(15, d("tokens", "t")), want: overall(ok, st(ok, "", 10, second, 5, 2*time.Second))},
		{name: "token bucket refills", advance: time.Second, in: req(0, hits(d("tokens", "t"), 0)), want: overall(ok, st(ok, "", 10, second, 15, time.Second))},
		{name: "window resets", advance: 59 * time.Second, in: req(0, d("remote_address", "10.0.0.1")), want: overall(ok, st(ok, "per_ip", 2, minute, 1, time.Minute))},
	}
	for _, s := range steps {
		e.clock.Advance(s.advance)
		got, err := e.rls.ShouldRateLimit(ctx(t), s.in)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if !proto.Equal(got, s.want) {
			t.Errorf("%s:\n got %s\nwant %s", s.name, protojson.Format(got), protojson.Format(s.want))
		}
	}
}

func TestShouldRateLimit_GlobalShadowMode(t *testing.T) {
	e := newEnv(t, limiter.Options{ShadowMode: true}, server.Options{})
	got, err := e.rls.ShouldRateLimit(ctx(t), req(2, d("path", "/login")))
	if err != nil {
		t.Fatal(err)
	}
	want := overall(ok, st(over, "login", 1, minute, 0, time.Minute))
	if !proto.Equal(got, want) {
		t.Errorf("got %s\nwant %s", protojson.Format(got), protojson.Format(want))
	}
}

func TestShouldRateLimit_ResponseHeaders(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{ResponseHeaders: true, HeaderNames: server.Headers{Limit: "X-Limit"}})
	header := func(r *resp) map[string]string {
		m := map[string]string{}
		for _, h := range r.GetResponseHeadersToAdd() {
			m[h.GetKey()] = h.GetValue()
		}
		return m
	}
	got, err := e.rls.ShouldRateLimit(ctx(t), req(0, d("path", "/x"), d("remote_address", "1")))
	if err != nil {
		t.Fatal(err)
	}
	// The most restrictive: remote_address has 1 left of 2.
	want := map[string]string{"X-Limit": "2", "RateLimit-Remaining": "1", "RateLimit-Reset": "60"}
	if h := header(got); len(h) != 3 || h["X-Limit"] != "2" || h["RateLimit-Remaining"] != "1" || h["RateLimit-Reset"] != "60" {
		t.Errorf("headers %v, want %v", h, want)
	}
	got, err = e.rls.ShouldRateLimit(ctx(t), req(2, d("remote_address", "1")))
	if err != nil {
		t.Fatal(err)
	}
	if h := header(got); h["Retry-After"] != "60" {
		t.Errorf("over limit: headers %v, want Retry-After 60", h)
	}
	// A cost above the capacity can never succeed: no Retry-After.
	got, err = e.rls.ShouldRateLimit(ctx(t), req(21, d("tokens", "x")))
	if err != nil {
		t.Fatal(err)
	}
	if h := header(got); got.OverallCode != over || h["Retry-After"] != "" {
		t.Errorf("never: code %v headers %v, want OVER_LIMIT without Retry-After", got.OverallCode, h)
	}
}

func TestShouldRateLimit_BadRequests(t *testing.T) {
	e := newEnv(t, limiter.Options{MaxDescriptors: 2, MaxEntries: 2}, server.Options{})
	cases := []struct {
		name   string
		in     *rlspb.RateLimitRequest
		reason string
	}{
		{"empty domain", &rlspb.RateLimitRequest{Descriptors: []*commonpb.RateLimitDescriptor{d("a", "b")}}, "domain must not be empty"},
		{"no descriptors", &rlspb.RateLimitRequest{Domain: "e2e"}, "at least one descriptor"},
		{"too many descriptors", req(0, d("a", "b"), d("a", "b"), d("a", "b")), "more than 2 descriptors exceed the limit of 2"},
		{"too many entries", req(0, d("a", "b", "c", "d", "e", "f")), "descriptor 0: more than 2 entries exceed the limit of 2"},
		{"empty key", req(0, d("", "b")), "empty key"},
		{"override without unit", req(0, override(d("a", "b"), 1, typepb.RateLimitUnit_UNKNOWN)), "unknown unit"},
	}
	for _, c := range cases {
		_, err := e.rls.ShouldRateLimit(ctx(t), c.in)
		if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), c.reason) {
			t.Errorf("%s: %v, want InvalidArgument containing %q", c.name, err, c.reason)
		}
	}
	// A request whose deadline has passed is not processed.
	rls := server.NewRLS(limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{}), server.Options{})
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if _, err := rls.ShouldRateLimit(past, req(0, d("path", "/x"))); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("past deadline: %v, want DeadlineExceeded", err)
	}
	// An empty value and a very long one are fine.
	if _, err := e.rls.ShouldRateLimit(ctx(t), req(0, d("path", ""), d("path", strings.Repeat("x", 100000)))); err != nil {
		t.Errorf("long value: %v", err)
	}
}

func TestShouldRateLimit_NoConfig(t *testing.T) {
	health := server.NewHealth()
	lim := limiter.New(tables{}, memory.New(memory.Options{}), limiter.Options{})
	gs := server.NewGRPC(lim, health, server.GRPCOptions{})
	cc := serveLoopback(t, gs)
	_, err := rlspb.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx(t), req(0, d("a", "b")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("no config: %v, want Unavailable", err)
	}
	hr, err := healthpb.NewHealthClient(cc).Check(ctx(t), &healthpb.HealthCheckRequest{})
	if err != nil || hr.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health before config: %v %v, want NOT_SERVING", hr, err)
	}
}

func TestHealth(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	check := func(service string) healthpb.HealthCheckResponse_ServingStatus {
		r, err := e.hc.Check(ctx(t), &healthpb.HealthCheckRequest{Service: service})
		if err != nil {
			t.Fatalf("health %q: %v", service, err)
		}
		return r.Status
	}
	for _, s := range []string{"", "envoy.service.ratelimit.v3.RateLimitService", "sluice.v1.RateLimiter"} {
		if got := check(s); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q = %v, want SERVING", s, got)
		}
	}
	e.health.Shutdown()
	e.health.SetServing(true) // ignored while draining
	if got := check(""); got != healthpb.HealthCheckResponse_NOT_SERVING || e.health.Serving() {
		t.Errorf("after Shutdown: %v (serving %v), want NOT_SERVING", got, e.health.Serving())
	}
}

func TestCheck(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	cost := func(n uint64) *uint64 { return &n }
	got, err := e.api.Check(ctx(t), &sluicev1.CheckRequest{Domain: "e2e", Key: "path", Value: "/login"})
	if err != nil {
		t.Fatal(err)
	}
	want := &sluicev1.CheckResponse{Allowed: true, Limit: 1, Remaining: 0, ResetAfter: durationpb.New(time.Minute),
		Results: []*sluicev1.DescriptorResult{{Allowed: true, Limited: true, Rule: "login", Limit: 1, ResetAfter: durationpb.New(time.Minute)}}}
	if !proto.Equal(got, want) {
		t.Errorf("first:\n got %s\nwant %s", protojson.Format(got), protojson.Format(want))
	}
	e.clock.Advance(15 * time.Second)
	got, err = e.api.Check(ctx(t), &sluicev1.CheckRequest{Domain: "e2e", Descriptors: []*sluicev1.Descriptor{
		{Entries: []*sluicev1.Entry{{Key: "path", Value: "/login"}}},
		{Entries: []*sluicev1.Entry{{Key: "path", Value: "/x"}}, Cost: cost(0)},
		{Entries: []*sluicev1.Entry{{Key: "nothing", Value: "x"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	want = &sluicev1.CheckResponse{Allowed: false, Limit: 1, Remaining: 0, ResetAfter: durationpb.New(45 * time.Second), RetryAfter: durationpb.New(45 * time.Second),
		Results: []*sluicev1.DescriptorResult{
			{Allowed: false, Limited: true, Rule: "login", Limit: 1, ResetAfter: durationpb.New(45 * time.Second), RetryAfter: durationpb.New(45 * time.Second)},
			{Allowed: true, Limited: true, Limit: 5, Remaining: 5, ResetAfter: durationpb.New(45 * time.Second)},
			{Allowed: true},
		}}
	if !proto.Equal(got, want) {
		t.Errorf("denied:\n got %s\nwant %s", protojson.Format(got), protojson.Format(want))
	}
	// cost 0 on the request checks without consuming; an explicit
	// descriptor cost wins.
	got, err = e.api.Check(ctx(t), &sluicev1.CheckRequest{Domain: "e2e", Key: "path", Value: "/y", Cost: cost(0)})
	if err != nil || got.Remaining != 5 {
		t.Errorf("cost 0: %v %v, want remaining 5", got, err)
	}
	_, err = e.api.Check(ctx(t), &sluicev1.CheckRequest{Domain: "e2e", Key: "k", Descriptors: []*sluicev1.Descriptor{{}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("key and descriptors: %v, want InvalidArgument", err)
	}
	_, err = e.api.Check(ctx(t), &sluicev1.CheckRequest{Domain: "e2e", Key: "k", Kind: 7})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("an unknown cost kind: %v, want InvalidArgument", err)
	}
}

// TestCheck_ChargeAndRefund: Sluice's own API says a cost's kind in
// CheckRequest.kind (every descriptor) or Descriptor.kind (one).
func TestCheck_ChargeAndRefund(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	cost := func(n uint64) *uint64 { return &n }
	kind := func(k sluicev1.CostKind) *sluicev1.CostKind { return &k }
	path := func(v string) []*sluicev1.Entry { return []*sluicev1.Entry{{Key: "path", Value: v}} }
	for i, c := range []struct {
		in        *sluicev1.CheckRequest
		allowed   bool
		remaining []uint64
	}{
		{&sluicev1.CheckRequest{Domain: "e2e", Key: "path", Value: "/u", Cost: cost(8), Kind: sluicev1.CostKind_COST_KIND_CHARGE}, false, []uint64{0}},
		{&sluicev1.CheckRequest{Domain: "e2e", Descriptors: []*sluicev1.Descriptor{
			{Entries: path("/u"), Cost: cost(0)}, {Entries: path("/v"), Cost: cost(2)}}}, false, []uint64{0, 5}},
		{&sluicev1.CheckRequest{Domain: "e2e", Cost: cost(5), Kind: sluicev1.CostKind_COST_KIND_REFUND, Descriptors: []*sluicev1.Descriptor{
			{Entries: path("/u")}, {Entries: path("/v"), Cost: cost(2), Kind: kind(sluicev1.CostKind_COST_KIND_UNSPECIFIED)}}}, true, []uint64{2, 3}},
	} {
		got, err := e.api.Check(ctx(t), c.in)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got.Allowed != c.allowed {
			t.Errorf("step %d: allowed %v, want %v", i, got.Allowed, c.allowed)
		}
		for j, want := range c.remaining {
			if r := got.Results[j].Remaining; r != want {
				t.Errorf("step %d descriptor %d: remaining %d, want %d", i, j, r, want)
			}
		}
	}
}

// TestGRPC_LoggingAndRecovery: at debug level every call is logged; a
// panic below the recovery interceptor becomes INTERNAL and a log line.
func TestGRPC_LoggingAndRecovery(t *testing.T) {
	var buf logbuf.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	lim := limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{})
	boom := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if r, ok := req.(*rlspb.RateLimitRequest); ok && r.Domain == "panic" {
			panic("boom")
		}
		return next(ctx, req)
	}
	gs := server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{Logger: logger, Interceptors: []grpc.UnaryServerInterceptor{boom}})
	cc := serveLoopback(t, gs)
	client := rlspb.NewRateLimitServiceClient(cc)
	if _, err := client.ShouldRateLimit(ctx(t), req(0, d("path", "/log"))); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ShouldRateLimit(ctx(t), &rlspb.RateLimitRequest{Domain: "panic"}); status.Code(err) != codes.Internal {
		t.Errorf("panicking handler: %v, want Internal", err)
	}
	log := buf.String()
	if !strings.Contains(log, "finished call") || !strings.Contains(log, "ShouldRateLimit") {
		t.Errorf("no call logged at debug level:\n%s", log)
	}
	if !strings.Contains(log, "panic in gRPC handler") || !strings.Contains(log, "boom") {
		t.Errorf("panic not logged:\n%s", log)
	}
}

// TestNewGRPC_StreamWorkers: the server keeps the pool of stream workers
// it is given (one goroutine each, started with the server).
func TestNewGRPC_StreamWorkers(t *testing.T) {
	lim := limiter.New(tables{}, memory.New(memory.Options{}), limiter.Options{})
	before := runtime.NumGoroutine()
	gs := server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{StreamWorkers: 500})
	defer gs.Stop()
	// (A margin for goroutines of earlier tests still exiting.)
	if n := runtime.NumGoroutine() - before; n < 450 {
		t.Errorf("%d goroutines more after NewGRPC, want the 500 workers", n)
	}
}

// TestBigLimits: a budget of 10^10 charged in steps of 3×10^9 is counted
// exactly; Envoy's statuses report min(value, 4294967295) in their uint32
// fields, Sluice's own API and HTTP the exact values.
func TestBigLimits(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{ResponseHeaders: true})
	const u32 = math.MaxUint32
	day := rlspb.RateLimitResponse_RateLimit_DAY
	for i, want := range []*resp{
		overall(ok, st(ok, "budget", u32, day, u32, 24*time.Hour)),         // 7×10^9 left
		overall(ok, st(ok, "budget", u32, day, 4e9, 24*time.Hour)),         // 4×10^9 left
		overall(ok, st(ok, "budget", u32, day, 1e9, 24*time.Hour)),         // 10^9 left
		overall(over, st(over, "budget", u32, day, 0, 24*time.Hour)),       // 1.2×10^10 counted
		overall(over, st(over, "budget", u32, day, 0, 24*time.Hour)),       // a check
		overall(ok, st(ok, "budget", u32, day, 500_000_000, 24*time.Hour)), // 2.5×10^9 refunded
	} {
		in := req(0, hits(d("budget", "tenant"), 3e9))
		switch i {
		case 4:
			in = req(0, hits(d("budget", "tenant"), 0))
		case 5:
			in = req(0, negative(hits(d("budget", "tenant"), 25e8)))
		}
		got, err := e.rls.ShouldRateLimit(ctx(t), in)
		if err != nil {
			t.Fatal(err)
		}
		got.ResponseHeadersToAdd = nil
		if !proto.Equal(got, want) {
			t.Errorf("step %d:\n got %s\nwant %s", i, protojson.Format(got), protojson.Format(want))
		}
	}
	cost := uint64(0)
	api, err := e.api.Check(ctx(t), &sluicev1.CheckRequest{Domain: "e2e", Key: "budget", Value: "tenant", Cost: &cost})
	if err != nil || api.Limit != 1e10 || api.Remaining != 5e8 || api.Results[0].Limit != 1e10 || api.Results[0].Remaining != 5e8 {
		t.Errorf("sluice.v1: %v %v, want limit 10^10 and 5×10^8 left", api, err)
	}
	r := e.do(t, "GET", "/v1/check?domain=e2e&key=budget&value=tenant&cost=0", "")
	if r.body["limit"] != "10000000000" || r.body["remaining"] != "500000000" || r.header.Get("RateLimit-Limit") != "10000000000" {
		t.Errorf("/v1/check: %v %v, want exact values", r.body, r.header)
	}
	got, err := e.rls.ShouldRateLimit(ctx(t), req(0, hits(d("budget", "tenant"), 0)))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range got.ResponseHeadersToAdd {
		if h.Key == "RateLimit-Limit" && h.Value != "10000000000" || h.Key == "RateLimit-Remaining" && h.Value != "500000000" {
			t.Errorf("response header %s: %s, want the exact value", h.Key, h.Value)
		}
	}
}
