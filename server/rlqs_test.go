package server_test

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

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
	tb := tables{loadTable(t)}
	e := &rlqsEnv{q: quota.New(tb, o), health: server.NewHealth()}
	lim := limiter.New(tb, memory.New(memory.Options{}), limiter.Options{})
	cc := serveLoopback(t, server.NewGRPC(lim, e.health, server.GRPCOptions{Quota: e.q}))
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

func openStream(t *testing.T, e *rlqsEnv) (rlqsStream, context.CancelFunc) {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
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

// waitFor polls cond until it holds or 5 s pass: the server notices a
// stream's end asynchronously.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func TestRLQS_SubscribeAssignRelease(t *testing.T) {
	e := newRLQSEnv(t, quota.Options{Reserve: -1, TTL: 30 * time.Second})
	a, cancelA := openStream(t, e)
	b, _ := openStream(t, e)

	// path has a limit of 5 per minute. The first report is answered at
	// once: the group's first proxy gets half.
	sendReports(t, a, reports("e2e", usage(10, 0, "path", "/x")))
	got := recvAction(t, a)
	if !maps.Equal(got.GetBucketId().GetBucket(), map[string]string{"path": "/x"}) ||
		rpu(got).GetRequestsPerTimeUnit() != 2 || rpu(got).GetTimeUnit() != typepb.RateLimitUnit_MINUTE ||
		got.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() != 30*time.Second {
		t.Fatalf("first answer %v, want 2 per minute for 30s", got)
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

	// A tick divides 5 per minute: a needs 1, b gets the rest.
	slow := usage(1, 0, "path", "/x")
	slow.TimeElapsed = durationpb.New(time.Minute)
	sendReports(t, a, reports("", slow))
	sendReports(t, b, reports("", usage(600, 0, "path", "/x")))
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
	if err := e.q.Tick(ctx(t), time.Now().Add(29*time.Second)); err != nil {
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
