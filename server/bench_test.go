package server_test

import (
	"context"
	"net"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
)

// benchReq has three descriptors: a level rule, a nested rule and one
// that matches nothing; the limits are high enough never to deny.
func benchReq() *rlspb.RateLimitRequest {
	return req(0, d("path", "/bench"), d("api_key", "k", "method", "GET"), d("nothing", "x"))
}

func newBenchRLS(tb testing.TB) *server.RLS {
	lim := limiter.New(tables{loadTable(tb)}, memory.New(memory.Options{}), limiter.Options{})
	return server.NewRLS(lim, server.Options{})
}

// TestShouldRateLimit_Allocs pins the adapter's allocations: the
// response, one array of per-descriptor messages and the status pointer
// slice. The limiter and the memory store add none.
func TestShouldRateLimit_Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	rls, in := newBenchRLS(t), benchReq()
	ctx := context.Background()
	rls.ShouldRateLimit(ctx, in) // create the counter
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := rls.ShouldRateLimit(ctx, in); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 3 {
		t.Errorf("ShouldRateLimit allocates %.1f times per request, want at most 3", allocs)
	}
}

// BenchmarkShouldRateLimit calls the adapter directly: translation,
// limiter and memory store, no transport.
func BenchmarkShouldRateLimit(b *testing.B) {
	rls := newBenchRLS(b)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		in, ctx := benchReq(), context.Background()
		for pb.Next() {
			if _, err := rls.ShouldRateLimit(ctx, in); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// noop answers OK without looking at the request: the transport's cost.
type noop struct {
	rlspb.UnimplementedRateLimitServiceServer
}

func (noop) ShouldRateLimit(context.Context, *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}, nil
}

// BenchmarkShouldRateLimit_GRPC goes through a loopback gRPC connection,
// against Sluice's server and a no-op server built the same way.
func BenchmarkShouldRateLimit_GRPC(b *testing.B) {
	lim := limiter.New(tables{loadTable(b)}, memory.New(memory.Options{}), limiter.Options{})
	b.Run("sluice", func(b *testing.B) {
		benchGRPC(b, server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{}))
	})
	b.Run("noop", func(b *testing.B) {
		s := grpc.NewServer()
		rlspb.RegisterRateLimitServiceServer(s, noop{})
		benchGRPC(b, s)
	})
}

func benchGRPC(b *testing.B, s *grpc.Server) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go s.Serve(lis)
	defer s.Stop()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	client := rlspb.NewRateLimitServiceClient(cc)
	b.ReportAllocs()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		in, ctx := benchReq(), context.Background()
		for pb.Next() {
			if _, err := client.ShouldRateLimit(ctx, in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
