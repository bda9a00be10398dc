package server_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
)

type rlqsEnv struct {
	q      *quota.Service
	health *server.Health
	client rlqspb.RateLimitQuotaServiceClient
	hc     healthpb.HealthClient
	refl   reflectionpb.ServerReflectionClient
}

func newRLQSEnv(t *testing.T, o quota.Options) *rlqsEnv {
	t.Helper()
	return newRLQSEnvOf(t, tables{loadTable(t)}, o, server.GRPCOptions{})
}

// newRLQSEnvOf serves a quota service of tb's tables with go.
func newRLQSEnvOf(t *testing.T, tb quota.Tables, o quota.Options, gopts server.GRPCOptions) *rlqsEnv {
	t.Helper()
	e := &rlqsEnv{q: quota.New(tb, o), health: server.NewHealth()}
	lim := limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{})
	gopts.Quota = e.q
	cc := serveLoopback(t, server.NewGRPC(lim, e.health, gopts))
	e.client = rlqspb.NewRateLimitQuotaServiceClient(cc)
	e.hc, e.refl = healthpb.NewHealthClient(cc), reflectionpb.NewServerReflectionClient(cc)
	e.health.SetServing(true)
	return e
}

func usage(allowed, denied uint64, kv ...string) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{BucketId: &rlqspb.BucketId{Bucket: m},
		TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: allowed, NumRequestsDenied: denied}
}

func reports(domain string, us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) *rlqspb.RateLimitQuotaUsageReports {
	return &rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: us}
}

type rlqsStream = rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient

// streamWait bounds a test's stream and its waits for the server: only a
// hang reaches it (a stream of TestRLQS_LargeBucketIDsSplit carries 9 MB,
// which took over 6 s under -race on a busy 2-core machine).
const streamWait = 2 * time.Minute

func openStream(t *testing.T, e *rlqsEnv) (rlqsStream, context.CancelFunc) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), streamWait)
	t.Cleanup(cancel)
	s, err := e.client.StreamRateLimitQuotas(c)
	if err != nil {
		t.Fatal(err)
	}
	return s, cancel
}

func sendReports(t *testing.T, s rlqsStream, m *rlqspb.RateLimitQuotaUsageReports) {
	t.Helper()
	if err := s.Send(m); err != nil {
		t.Fatalf("Send: %v", err)
	}
}

// recvAction receives one response and returns its only action.
func recvAction(t *testing.T, s rlqsStream) *rlqspb.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	r, err := s.Recv()
	if err != nil {
		t.Fatalf("Recv: %v", err)
	}
	if len(r.BucketAction) != 1 {
		t.Fatalf("got %d actions, want 1: %v", len(r.BucketAction), r)
	}
	return r.BucketAction[0]
}

// recvFor receives until an action for a bucket with key comes.
func recvFor(t *testing.T, s rlqsStream, key string) *rlqspb.RateLimitQuotaResponse_BucketAction {
	t.Helper()
	for {
		r, err := s.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		for _, ba := range r.BucketAction {
			if _, ok := ba.GetBucketId().GetBucket()[key]; ok {
				return ba
			}
		}
	}
}

func rpu(a *rlqspb.RateLimitQuotaResponse_BucketAction) *typepb.RateLimitStrategy_RequestsPerTimeUnit {
	return a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetRequestsPerTimeUnit()
}

// waitFor polls cond until it holds or streamWait passes: the server
// notices a stream's end asynchronously.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(streamWait)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestRLQS_SubscribeAssignRelease(t *testing.T) {
	// The TTL is past the demands' staleness (three minutes, see below),
	// the idle abandon past the TTL.
	const ttl = 5 * time.Minute
	e := newRLQSEnv(t, quota.Options{Reserve: -1, TTL: ttl, IdleAbandon: time.Hour})
	a, cancelA := openStream(t, e)
	b, _ := openStream(t, e)

	// path has a limit of 5 per minute. The first report is answered at
	// once: the group's first proxy gets half.
	sendReports(t, a, reports("e2e", usage(10, 0, "path", "/x")))
	got := recvAction(t, a)
	if !maps.Equal(got.GetBucketId().GetBucket(), map[string]string{"path": "/x"}) ||
		rpu(got).GetRequestsPerTimeUnit() != 2 || rpu(got).GetTimeUnit() != typepb.RateLimitUnit_MINUTE ||
		got.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != ttl {
		t.Fatalf("first answer %v, want 2 per minute for %v", got, ttl)
	}
	sendReports(t, b, reports("e2e", usage(1, 0, "path", "/x"), usage(1, 0, "free", "1"), usage(1, 0, "user", "bot-7")))
	r, err := b.Recv()
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]string{}
	for _, ba := range r.BucketAction {
		for k := range ba.GetBucketId().GetBucket() {
			kinds[k] = ba.GetQuotaAssignmentAction().GetRateLimitStrategy().String()
		}
	}
	if !slices.Equal(slices.Sorted(maps.Keys(kinds)), []string{"free", "path", "user"}) || kinds["free"] != "blanket_rule:ALLOW_ALL" {
		t.Fatalf("second stream's answers %v", kinds)
	}

	// A tick divides 5 per minute: a needs 1, b gets the rest. (Both
	// report a minute's traffic: a demand goes stale after three of its
	// intervals without a report, and the server stamps reports with its
	// own clock, so the tick below must come within three of them.)
	perMinute := func(n uint64) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
		u := usage(n, 0, "path", "/x")
		u.TimeElapsed = durationpb.New(time.Minute)
		return u
	}
	sendReports(t, a, reports("", perMinute(1)))
	sendReports(t, b, reports("", perMinute(36000)))
	waitFor(t, "both reports", func() bool { return e.q.Stats().Usages == 6 })
	if err := e.q.Tick(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	ga, gb := rpu(recvFor(t, a, "path")).GetRequestsPerTimeUnit(), rpu(recvFor(t, b, "path")).GetRequestsPerTimeUnit()
	if ga != 1 || gb != 4 {
		t.Errorf("shares after a tick %d and %d, want 1 and 4", ga, gb)
	}

	// Near the TTL the assignment is sent again (the demands have gone
	// stale by then: an equal split).
	if err := e.q.Tick(ctx(t), time.Now().Add(ttl-time.Second)); err != nil {
		t.Fatal(err)
	}
	ra, rb := rpu(recvFor(t, a, "path")).GetRequestsPerTimeUnit(), rpu(recvFor(t, b, "path")).GetRequestsPerTimeUnit()
	if ra+rb != 5 || min(ra, rb) != 2 {
		t.Errorf("refreshed shares %d and %d, want 2 and 3", ra, rb)
	}

	// The stream ends: its bucket is released and b gets the whole limit.
	cancelA()
	waitFor(t, "stream a's end", func() bool { return e.q.Stats().Streams == 1 })
	sendReports(t, b, reports("", usage(600, 0, "path", "/x")))
	waitFor(t, "b's report", func() bool { return e.q.Stats().Usages == 7 })
	if err := e.q.Tick(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := rpu(recvFor(t, b, "path")).GetRequestsPerTimeUnit(); got != 5 {
		t.Errorf("after a's end b has %d, want 5", got)
	}
}

func TestRLQS_Abandon(t *testing.T) {
	e := newRLQSEnv(t, quota.Options{IdleAbandon: time.Minute})
	s, _ := openStream(t, e)
	sendReports(t, s, reports("e2e", usage(1, 0, "tokens", "t")))
	tb := recvAction(t, s).GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb.GetMaxTokens() == 0 || tb.GetTokensPerFill().GetValue() == 0 || tb.GetFillInterval().AsDuration() <= 0 {
		t.Fatalf("token bucket assignment %v", tb)
	}
	if err := e.q.Tick(ctx(t), time.Now().Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := recvAction(t, s); got.GetAbandonAction() == nil || got.GetBucketId().GetBucket()["tokens"] != "t" {
		t.Errorf("after two idle minutes: %v, want abandon", got)
	}
}

func TestRLQS_BadInput(t *testing.T) {
	e := newRLQSEnv(t, quota.Options{MaxBucketsPerStream: 2})
	cases := []struct {
		name string
		msgs []*rlqspb.RateLimitQuotaUsageReports
		code codes.Code
	}{
		{"no domain", []*rlqspb.RateLimitQuotaUsageReports{reports("", usage(1, 0, "k", "v"))}, codes.InvalidArgument},
		{"empty bucket id", []*rlqspb.RateLimitQuotaUsageReports{reports("e2e", usage(1, 0))}, codes.InvalidArgument},
		{"absurd counts", []*rlqspb.RateLimitQuotaUsageReports{reports("e2e", usage(1<<50, 0, "k", "v"))}, codes.InvalidArgument},
		{"absurd interval", []*rlqspb.RateLimitQuotaUsageReports{reports("e2e", &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: map[string]string{"k": "v"}}, TimeElapsed: &durationpb.Duration{Seconds: -5}})}, codes.InvalidArgument},
		{"domain changed", []*rlqspb.RateLimitQuotaUsageReports{reports("e2e", usage(1, 0, "k", "v")), reports("other")}, codes.InvalidArgument},
		{"too many buckets", []*rlqspb.RateLimitQuotaUsageReports{reports("e2e", usage(1, 0, "k", "1"), usage(1, 0, "k", "2")),
			reports("", usage(1, 0, "k", "3"))}, codes.ResourceExhausted},
		{"more keys than a rule can match", []*rlqspb.RateLimitQuotaUsageReports{reports("e2e",
			usage(1, 0, "1", "", "2", "", "3", "", "4", "", "5", "", "6", "", "7", "", "8", "", "9", ""))}, codes.ResourceExhausted},
	}
	for _, c := range cases {
		s, _ := openStream(t, e)
		for _, m := range c.msgs {
			sendReports(t, s, m)
		}
		var err error
		for err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != c.code {
			t.Errorf("%s: stream ended with %v, want %v", c.name, err, c.code)
		}
	}
	waitFor(t, "every stream's end", func() bool { return e.q.Stats().Streams == 0 && e.q.Stats().Buckets == 0 })
}

func TestRLQS_DrainEndsStreams(t *testing.T) {
	e := newRLQSEnv(t, quota.Options{})
	s, _ := openStream(t, e)
	sendReports(t, s, reports("e2e", usage(1, 0, "path", "/x")))
	recvAction(t, s)
	e.health.Shutdown()
	var err error
	for err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Errorf("stream ended with %v when draining, want UNAVAILABLE", err)
	}
	waitFor(t, "the stream's buckets released", func() bool { return e.q.Stats().Buckets == 0 })
}

func TestRLQS_HealthAndReflection(t *testing.T) {
	e := newRLQSEnv(t, quota.Options{})
	name := rlqspb.RateLimitQuotaService_ServiceDesc.ServiceName
	r, err := e.hc.Check(ctx(t), &healthpb.HealthCheckRequest{Service: name})
	if err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("health of %s: %v, %v", name, r, err)
	}
	s, err := e.refl.ServerReflectionInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := s.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, sv := range resp.GetListServicesResponse().GetService() {
		names = append(names, sv.GetName())
	}
	if !slices.Contains(names, name) {
		t.Errorf("reflection lists %v, without %s", names, name)
	}
	s.CloseSend()
}

// TestRLQS_StreamCap: past quota.Options.MaxStreams a stream ends with
// RESOURCE_EXHAUSTED, counting the streams that have sent nothing yet.
func TestRLQS_StreamCap(t *testing.T) {
	e := newRLQSEnv(t, quota.Options{MaxStreams: 1})
	_, cancel := openStream(t, e)
	waitFor(t, "the silent stream opened", func() bool { return e.q.Stats().Streams == 1 })
	s, _ := openStream(t, e)
	// The server may end the stream before the message is sent.
	_ = s.Send(reports("e2e", usage(1, 0, "path", "/x")))
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a second stream: %v, want RESOURCE_EXHAUSTED", err)
	}
	if n := e.q.Stats().Capped[quota.CapStreams]; n != 1 {
		t.Errorf("%d streams refused at the cap, want 1", n)
	}
	cancel()
	waitFor(t, "the silent stream's end", func() bool { return e.q.Stats().Streams == 0 })
	s, _ = openStream(t, e)
	sendReports(t, s, reports("e2e", usage(1, 0, "path", "/x")))
	recvAction(t, s)
}

// panicTables panics in Current while panics > 0, as a bug in the code a
// stream's messages run would.
type panicTables struct {
	t      *config.Table
	panics atomic.Int32
}

func (p *panicTables) Current() *config.Table {
	if p.panics.Add(-1) >= 0 {
		panic("injected")
	}
	return p.t
}

// TestRLQS_PanicInReceiver: a panic while a stream's message is handled
// ends that stream with INTERNAL and is logged; the server serves on.
func TestRLQS_PanicInReceiver(t *testing.T) {
	tb := &panicTables{t: loadTable(t)}
	tb.panics.Store(1)
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	e := newRLQSEnvOf(t, tb, quota.Options{}, server.GRPCOptions{Logger: logger})
	s, _ := openStream(t, e)
	sendReports(t, s, reports("e2e", usage(1, 0, "path", "/x")))
	if _, err := s.Recv(); status.Code(err) != codes.Internal || strings.Contains(err.Error(), "injected") {
		t.Fatalf("stream whose message panicked: %v, want INTERNAL without the panic's text", err)
	}
	waitFor(t, "the stream's end", func() bool { return e.q.Stats().Streams == 0 })
	s, _ = openStream(t, e)
	sendReports(t, s, reports("e2e", usage(1, 0, "path", "/x")))
	if got := recvAction(t, s); rpu(got).GetRequestsPerTimeUnit() == 0 {
		t.Errorf("the next stream got %v, want a share", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "injected") {
		t.Errorf("log %q, want an ERROR with the panic", logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// settable is a Tables whose table a test sets.
type settable struct{ p atomic.Pointer[config.Table] }

func (s *settable) Current() *config.Table { return s.p.Load() }

// TestRLQS_NoAssignmentBeforeConfig: before the first config (xDS before
// its first push, when RLS answers UNAVAILABLE and health NOT_SERVING) a
// bucket gets no assignment, so that Envoy applies the
// no_assignment_behavior its operator chose; the first config assigns it
// its share, not ALLOW_ALL first.
func TestRLQS_NoAssignmentBeforeConfig(t *testing.T) {
	tb := &settable{}
	e := newRLQSEnvOf(t, tb, quota.Options{Reserve: -1}, server.GRPCOptions{})
	s, _ := openStream(t, e)
	sendReports(t, s, reports("e2e", usage(10, 0, "path", "/x")))
	waitFor(t, "the report", func() bool { return e.q.Stats().Buckets == 1 })
	if err := e.q.Tick(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	tb.p.Store(loadTable(t))
	if err := e.q.Tick(ctx(t), time.Now()); err != nil {
		t.Fatal(err)
	}
	if got := recvAction(t, s); rpu(got).GetRequestsPerTimeUnit() != 5 {
		t.Errorf("first answer %v, want the whole limit of 5 per minute", got)
	}
}

// TestGRPC_MaxConcurrentStreams: the server advertises its bound on
// concurrent streams per connection in its HTTP/2 SETTINGS, 1,000 unless
// set.
func TestGRPC_MaxConcurrentStreams(t *testing.T) {
	lim := limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{})
	for _, c := range []struct{ set, want uint32 }{{0, server.DefaultMaxConcurrentStreams}, {7, 7}} {
		gs := server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{MaxConcurrentStreams: c.set})
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go gs.Serve(lis)
		got, err := maxConcurrentStreams(lis.Addr().String())
		gs.Stop()
		if err != nil || got != c.want {
			t.Errorf("MaxConcurrentStreams %d: the server advertises %d (%v), want %d", c.set, got, err, c.want)
		}
	}
}

// maxConcurrentStreams reads SETTINGS_MAX_CONCURRENT_STREAMS from the
// first frame an HTTP/2 server at addr sends (RFC 9113, sections 3.4 and
// 6.5): 9 bytes of header, then settings of 6 bytes each.
func maxConcurrentStreams(addr string) (uint32, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// The client preface and an empty SETTINGS frame.
	if _, err := c.Write(append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), 0, 0, 0, 4, 0, 0, 0, 0, 0)); err != nil {
		return 0, err
	}
	var h [9]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, err
	}
	if h[3] != 4 {
		return 0, fmt.Errorf("first frame of type %d, want SETTINGS", h[3])
	}
	body := make([]byte, int(h[0])<<16|int(h[1])<<8|int(h[2]))
	if _, err := io.ReadFull(c, body); err != nil {
		return 0, err
	}
	for ; len(body) >= 6; body = body[6:] {
		if binary.BigEndian.Uint16(body) == 3 {
			return binary.BigEndian.Uint32(body[2:]), nil
		}
	}
	return 0, errors.New("no SETTINGS_MAX_CONCURRENT_STREAMS")
}

// TestRLQS_LargeBucketIDsSplit: 600 buckets of 7.5 KiB ids re-sent at
// once (their TTL nears) come in messages under gRPC's default 4 MiB, which
// one message of them all (4.5 MB) would pass.
func TestRLQS_LargeBucketIDsSplit(t *testing.T) {
	e := newRLQSEnv(t, quota.Options{})
	s, _ := openStream(t, e)
	fat := func(i int) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
		u := usage(1, 0, "id", strconv.Itoa(i))
		for k := range 3 {
			u.BucketId.Bucket["k"+strconv.Itoa(k)] = strings.Repeat("v", 2500)
		}
		return u
	}
	for m := range 6 {
		var us []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
		for i := range 100 {
			us = append(us, fat(100*m+i))
		}
		sendReports(t, s, reports("e2e", us...))
	}
	recvN := func(n int) (msgs int) {
		t.Helper()
		for got := 0; got < n; msgs++ {
			r, err := s.Recv()
			if err != nil {
				t.Fatalf("after %d of %d actions: %v", got, n, err)
			}
			got += len(r.BucketAction)
		}
		return msgs
	}
	recvN(600)
	if err := e.q.Tick(ctx(t), time.Now().Add(quota.DefaultTTL)); err != nil {
		t.Fatal(err)
	}
	if msgs := recvN(600); msgs < 5 {
		t.Errorf("600 re-sent actions of 7.5 KiB ids in %d messages, want at least 5 of about 1 MiB", msgs)
	}
}
