package observe_test

import (
	"context"
	"net"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/loadgen"
	"github.com/sluicehq/sluice/observe"
)

func TestGRPCMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewGRPCMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor()))
	rlspb.RegisterRateLimitServiceServer(s, loadgen.Noop{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(lis) }()
	defer func() { s.Stop(); <-done }()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := rlspb.NewRateLimitServiceClient(conn)
	req := &rlspb.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
	for range 3 {
		if _, err := c.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	fams := scrape(t, reg)
	l := map[string]string{"grpc_service": "envoy.service.ratelimit.v3.RateLimitService", "grpc_method": "ShouldRateLimit"}
	check(t, fams, "grpc_server_started_total", l, 3)
	check(t, fams, "grpc_server_handled_total", map[string]string{"grpc_method": "ShouldRateLimit", "grpc_code": "OK"}, 3)
	check(t, fams, "grpc_server_handling_seconds", l, 3)
	if b := fams["grpc_server_handling_seconds"].Metric[0].Histogram.Bucket; b[0].GetUpperBound() != observe.LatencyBuckets[0] {
		t.Errorf("first bucket %v, want %v", b[0].GetUpperBound(), observe.LatencyBuckets[0])
	}
}
