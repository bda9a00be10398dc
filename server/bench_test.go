package server_test

import (
	"context"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe/tracing"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// benchReq has three descriptors: a level rule (5 a minute, so soon
// over its limit), a nested rule the method misses, and one that matches
// nothing.
func benchReq() *rlspb.RateLimitRequest {
	return req(0, d("path", "/bench"), d("api_key", "k", "method", "GET"), d("nothing", "x"))
}

func newBenchRLS(tb testing.TB) *server.RLS {
	lim := limiter.New(tables{loadTable(tb)}, memory.New(memory.Options{}), limiter.Options{})
	return server.NewRLS(lim, server.Options{})
}

// TestCall_Allocs pins what Sluice allocates for a gRPC call of Envoy's
// ShouldRateLimit: nothing, from the request's decoding to the
// response's buffer, with or without an interceptor. (The message path,
// ShouldRateLimit called directly, builds the proto messages.)
func TestCall_Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	wire, err := proto.Marshal(benchReq())
	if err != nil {
		t.Fatal(err)
	}
	passthrough := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	for _, ic := range []grpc.UnaryServerInterceptor{nil, passthrough} {
		n := 0
		call := server.NewCall(newBenchRLS(t), wire, ic, func(b []byte) { n = len(b) })
		if err := call(); err != nil { // create the counters
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			if err := call(); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 || n == 0 {
			t.Errorf("interceptor %v: a call allocates %.1f times (response of %d bytes), want 0", ic != nil, allocs, n)
		}
	}
}

// BenchmarkCall is a gRPC call of Envoy's ShouldRateLimit without the
// transport: decoding, limiter, memory store, encoding.
func BenchmarkCall(b *testing.B) { benchCall(b, newBenchRLS(b)) }

// benchCall calls rls with benchReq as gRPC would, in parallel.
func benchCall(b *testing.B, rls *server.RLS) {
	wire, err := proto.Marshal(benchReq())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		call := server.NewCall(rls, wire, nil, func([]byte) {})
		for pb.Next() {
			if err := call(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCall_Tracing is BenchmarkCall with tracing on, the call
// without a trace context: "unsampled" (a non-recording span), "sampled"
// (both spans recorded, handed to an exporter that discards them).
func BenchmarkCall_Tracing(b *testing.B) {
	for name, sampler := range map[string]sdktrace.Sampler{"unsampled": sdktrace.NeverSample(), "sampled": sdktrace.AlwaysSample()} {
		b.Run(name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithSyncer(tracetest.NewNoopExporter()))
			defer tp.Shutdown(context.Background())
			tracer := tp.Tracer(tracing.Name)
			lim := limiter.New(tables{loadTable(b)}, tracing.Store(memory.New(memory.Options{}), tracer, "memory"), limiter.Options{})
			benchCall(b, server.NewRLS(lim, server.Options{Tracing: server.Tracing{Tracer: tracer, Propagator: tracing.Propagator()}}))
		})
	}
}

// multiResponse is the answer to the load benchmark's multi workload:
// four allowed descriptors, each with its rule.
func multiResponse() *limiter.Response {
	r := &limiter.Response{Overall: limiter.OK}
	for range 4 {
		r.Statuses = append(r.Statuses, limiter.Status{Code: limiter.OK, Limited: true, RequestsPerUnit: 1000000000,
			Unit: config.Unit(rlspb.RateLimitResponse_RateLimit_SECOND), Hits: 1,
			Decision: store.Decision{Allowed: true, Limit: 1000000000, Remaining: 999999990, ResetAfter: 300 * time.Millisecond}})
	}
	return r
}

// TestAppendResponse_Allocs pins the encoder's allocations: none, with
// response headers too, once the buffer is large enough.
func TestAppendResponse_Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	r := multiResponse()
	for _, headers := range []bool{false, true} {
		s := server.NewRLS(nil, server.Options{ResponseHeaders: headers})
		b := make([]byte, 0, 1024)
		allocs := testing.AllocsPerRun(1000, func() { b = s.AppendResponse(b[:0], r) })
		if allocs != 0 || len(b) == 0 {
			t.Errorf("headers %v: AppendResponse allocates %.1f times (%d bytes), want 0", headers, allocs, len(b))
		}
	}
}

// BenchmarkAppendResponse encodes the multi workload's answer.
func BenchmarkAppendResponse(b *testing.B) {
	s, r := server.NewRLS(nil, server.Options{}), multiResponse()
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = s.AppendResponse(buf[:0], r)
	}
	b.SetBytes(int64(len(buf)))
}

// BenchmarkResponseProto is what answering multi cost before
// AppendResponse: the message tree, then proto.Marshal.
func BenchmarkResponseProto(b *testing.B) {
	s, r := server.NewRLS(nil, server.Options{}), multiResponse()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := proto.Marshal(server.BuildResponse(s, r)); err != nil {
			b.Fatal(err)
		}
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
	client := rlspb.NewRateLimitServiceClient(serveLoopback(b, s))
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
