package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// fakeProxy reports a steady demand for one bucket on an RLQS stream, as
// Envoy's filter does every interval, and keeps the last share assigned.
type fakeProxy struct {
	share atomic.Uint64
}

func startFakeProxy(t *testing.T, ctx context.Context, addr string, perInterval uint64, interval time.Duration) *fakeProxy {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p := &fakeProxy{}
	go func() {
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			for _, a := range r.BucketAction {
				p.share.Store(a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetRequestsPerTimeUnit().GetRequestsPerTimeUnit())
			}
		}
	}()
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		domain := "q"
		for {
			u := &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId:    &rlqspb.BucketId{Bucket: map[string]string{"tenant": "acme"}},
				TimeElapsed: durationpb.New(interval), NumRequestsAllowed: perInterval}
			if s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{u}}) != nil {
				return
			}
			domain = ""
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return p
}

// TestServeRLQS_TwoReplicasOneRedis: three proxies, one on replica A and
// two on B, each wanting more than a third of the limit, end up with a
// third each: the replicas divide the limit over the whole fleet.
func TestServeRLQS_TwoReplicasOneRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeConfig(t, "domain: q\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 900}\n")
	args := []string{"--config", cfg, "--store", "redis", "--redis-url", "redis://" + srv.Addr, "--redis-timeout", storeTimeout,
		"--rlqs-interval", "100ms", "--rlqs-ttl", "2s", "--rlqs-reserve", "0"}
	a, _, _ := startServe(t, nil, append(args, "--rlqs-replica-id", "a")...)
	b, _, _ := startServe(t, nil, append(args, "--rlqs-replica-id", "b")...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const interval = 100 * time.Millisecond
	ps := []*fakeProxy{
		startFakeProxy(t, ctx, a, 100, interval), // 1,000/s each
		startFakeProxy(t, ctx, b, 100, interval),
		startFakeProxy(t, ctx, b, 100, interval),
	}
	waitUntil(t, mustWithin, "a third of 900 for each proxy", func() bool {
		for _, p := range ps {
			if s := p.share.Load(); s < 290 || s > 300 {
				return false
			}
		}
		return true
	})
	var sum uint64
	for _, p := range ps {
		sum += p.share.Load()
	}
	if sum > 900 {
		t.Errorf("the fleet's shares sum to %d > 900", sum)
	}
}

func TestServeRLQS_BadSettings(t *testing.T) {
	cfg := writeConfig(t, "domain: q\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--rlqs-interval", "0s"}, "--rlqs-interval"},
		{[]string{"--rlqs-interval", "1s", "--rlqs-ttl", "2s"}, "--rlqs-ttl"},
		{[]string{"--rlqs-threshold", "1.5"}, "--rlqs-threshold"},
		{[]string{"--rlqs-reserve", "0.9"}, "--rlqs-reserve"},
		{[]string{"--rlqs-max-buckets-per-stream", "0"}, "--rlqs-max-buckets-per-stream"},
		{[]string{"--rlqs-max-streams", "0"}, "--rlqs-max-streams"},
		{[]string{"--rlqs-max-buckets", "-1"}, "--rlqs-max-buckets"},
		{[]string{"--rlqs-max-claims", "0"}, "--rlqs-max-claims"},
		{[]string{"--rlqs-fixed-window-strategy", "leaky"}, "--rlqs-fixed-window-strategy"},
		{[]string{"--rlqs-demand-window", "0"}, "--rlqs-demand-window"},
		{[]string{"--rlqs-demand-window", "65"}, "--rlqs-demand-window"},
		{[]string{"--rlqs-overcommit", "0.5"}, "--rlqs-overcommit"},
		{[]string{"--rlqs-overcommit", "NaN"}, "--rlqs-overcommit"},
	} {
		args := append([]string{"--config", cfg, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, c.args...)
		err := serve(context.Background(), args, serveEnv{}.get, &strings.Builder{}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %s", c.args, err, c.want)
		}
	}
}

// TestServeRLQS_ReloadReassigns: a limits file edited under a running
// serve re-assigns the proxies' shares within an interval or so.
func TestServeRLQS_ReloadReassigns(t *testing.T) {
	dir := writeConfig(t, "domain: q\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	addr, _, _ := startServe(t, nil, "--config", dir, "--rlqs-interval", "100ms", "--rlqs-ttl", "2s", "--rlqs-reserve", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p := startFakeProxy(t, ctx, addr, 100, 100*time.Millisecond)
	waitUntil(t, mustWithin, "the whole limit of 100", func() bool { return p.share.Load() == 100 })
	if err := os.WriteFile(filepath.Join(dir, "limits.yaml"),
		[]byte("domain: q\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 40}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, mustWithin, "the new limit of 40", func() bool { return p.share.Load() == 40 })
}

// TestServeRLQS_Caps: --rlqs-max-streams ends a stream past it with
// RESOURCE_EXHAUSTED, counted in /metrics, and
// --grpc-max-concurrent-streams makes a connection's next call wait for
// one in flight to end.
func TestServeRLQS_Caps(t *testing.T) {
	cfg := writeConfig(t, "domain: q\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 100}\n")
	grpcAddr, httpAddr, _ := startServe(t, nil, "--config", cfg, "--rlqs-max-streams", "1", "--grpc-max-concurrent-streams", "2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func() *grpc.ClientConn {
		cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	open := func(cc *grpc.ClientConn) (rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient, error) {
		s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_ = s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "q", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"tenant": "a"}}, TimeElapsed: durationpb.New(time.Second)}}})
		_, err = s.Recv()
		return s, err
	}
	cc := dial()
	if _, err := open(cc); err != nil {
		t.Fatalf("first stream: %v", err)
	}
	if _, err := open(dial()); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("second stream past --rlqs-max-streams 1: %v, want RESOURCE_EXHAUSTED", err)
	}
	if body := httpGet(t, "http://"+httpAddr+"/metrics"); !strings.Contains(body, `sluice_rlqs_over_cap_total{cap="streams"} 1`) {
		t.Errorf("/metrics does not count the stream past the cap:\n%s", body)
	}
	// cc holds the RLQS stream; a health watch takes the second place.
	hc := healthpb.NewHealthClient(cc)
	wctx, stopWatch := context.WithCancel(ctx)
	w, err := hc.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelShort()
	if _, err := hc.Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third call on a connection with 2 in flight: %v, want it to wait (DEADLINE_EXCEEDED)", err)
	}
	stopWatch()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("once the watch ended: %v", err)
	}
}
