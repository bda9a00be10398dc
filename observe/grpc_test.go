package observe_test

import (
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/loadgen"
	"github.com/sluicehq/sluice/observe"
)

// serveLoopback serves s on a loopback port until the test ends, and
// returns a client connection to it.
func serveLoopback(t *testing.T, s *grpc.Server) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); s.Stop(); <-done })
	return conn
}

func TestGRPCMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewGRPCMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(m.UnaryServerInterceptor()))
	rlspb.RegisterRateLimitServiceServer(s, loadgen.Noop{})
	conn := serveLoopback(t, s)
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

// fakeStream is a server stream that delivers recv messages, then io.EOF,
// and fails sends after sendOK of them.
type fakeStream struct {
	grpc.ServerStream
	recv, sendOK int
}

func (f *fakeStream) Context() context.Context { return context.Background() }

func (f *fakeStream) RecvMsg(any) error {
	if f.recv == 0 {
		return io.EOF
	}
	f.recv--
	return nil
}

func (f *fakeStream) SendMsg(any) error {
	if f.sendOK == 0 {
		return errors.New("stream broken")
	}
	f.sendOK--
	return nil
}

// TestGRPCMetrics_SameAsProvider runs the same unary calls and streams,
// every outcome among them, through GRPCMetrics and through
// go-grpc-middleware's Prometheus provider whose series it keeps: the two
// scrapes must hold the same series with the same counts.
func TestGRPCMetrics_SameAsProvider(t *testing.T) {
	ours, theirs := prometheus.NewRegistry(), prometheus.NewRegistry()
	m, err := observe.NewGRPCMetrics(ours)
	if err != nil {
		t.Fatal(err)
	}
	pm := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(observe.LatencyBuckets)))
	theirs.MustRegister(pm)
	unaryErrs := []error{nil, nil, status.Error(codes.InvalidArgument, "bad"), context.Canceled, context.DeadlineExceeded,
		errors.New("plain"), status.Error(codes.Code(42), "odd code"), status.Error(codes.Unauthenticated, "who")}
	for _, ic := range []grpc.UnaryServerInterceptor{m.UnaryServerInterceptor(), pm.UnaryServerInterceptor()} {
		for i, e := range unaryErrs {
			info := &grpc.UnaryServerInfo{FullMethod: []string{"/pkg.Svc/Call", "/pkg.Svc/Other", "malformed"}[i%3]}
			_, err := ic(context.Background(), "req", info, func(context.Context, any) (any, error) { return "resp", e })
			if err != e {
				t.Fatalf("interceptor returned %v, want the handler's %v", err, e)
			}
		}
	}
	streams := []struct {
		info       grpc.StreamServerInfo
		recv, send int // messages received, then sent before one fails
		err        error
	}{
		{grpc.StreamServerInfo{FullMethod: "/pkg.Svc/Bidi", IsClientStream: true, IsServerStream: true}, 3, 2, nil},
		{grpc.StreamServerInfo{FullMethod: "/pkg.Svc/Up", IsClientStream: true}, 5, 1, status.Error(codes.ResourceExhausted, "full")},
		{grpc.StreamServerInfo{FullMethod: "/pkg.Svc/Down", IsServerStream: true}, 1, 4, nil},
	}
	for _, ic := range []grpc.StreamServerInterceptor{m.StreamServerInterceptor(), pm.StreamServerInterceptor()} {
		for _, st := range streams {
			err := ic(nil, &fakeStream{recv: st.recv, sendOK: st.send}, &st.info, func(_ any, ss grpc.ServerStream) error {
				for ss.RecvMsg(nil) == nil {
				}
				for ss.SendMsg(nil) == nil {
				}
				return st.err
			})
			if err != st.err {
				t.Fatalf("stream interceptor returned %v, want %v", err, st.err)
			}
		}
	}
	got, want := samples(t, ours), samples(t, theirs)
	if len(want) < 20 {
		t.Fatalf("the provider's scrape has %d series: %v", len(want), want)
	}
	if !maps.Equal(got, want) {
		t.Errorf("series differ:\nours:     %v\nprovider: %v", got, want)
	}
}

// samples flattens a scrape: each series (a histogram's by its count) to
// its value.
func samples(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	out := map[string]float64{}
	for name, f := range scrape(t, reg) {
		for _, mt := range f.Metric {
			var labels []string
			for _, l := range mt.Label {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := name + "{" + strings.Join(labels, ",") + "}"
			switch {
			case mt.Counter != nil:
				out[key] = mt.Counter.GetValue()
			case mt.Histogram != nil:
				out[key+" count"] = float64(mt.Histogram.GetSampleCount())
				out[key+" buckets"] = float64(len(mt.Histogram.Bucket))
			}
		}
	}
	return out
}

// BenchmarkUnaryInterceptor measures what counting and timing costs per
// call, against go-grpc-middleware's Prometheus provider.
func BenchmarkUnaryInterceptor(b *testing.B) {
	m, err := observe.NewGRPCMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	pm := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(grpcprom.WithHistogramBuckets(observe.LatencyBuckets)))
	info := &grpc.UnaryServerInfo{FullMethod: "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	// With the reference's stats on (observe.RefStats), calls are also
	// counted by whole milliseconds.
	ms, err := observe.NewGRPCMetrics(prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	ms.TrackMillis()
	for _, c := range []struct {
		name string
		ic   grpc.UnaryServerInterceptor
	}{{"sluice", m.UnaryServerInterceptor()}, {"sluice+millis", ms.UnaryServerInterceptor()}, {"provider", pm.UnaryServerInterceptor()}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.ic(context.Background(), nil, info, handler)
				}
			})
		})
	}
}

// TestGRPCMetrics_NoAllocs pins that counting a unary call allocates
// nothing once its series exist.
func TestGRPCMetrics_NoAllocs(t *testing.T) {
	m, err := observe.NewGRPCMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	ic := m.UnaryServerInterceptor()
	info := &grpc.UnaryServerInfo{FullMethod: "/pkg.Svc/Call"}
	invalid := status.Error(codes.InvalidArgument, "bad")
	call := func() {
		ic(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, nil })
		ic(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, invalid })
	}
	call()
	if n := testing.AllocsPerRun(100, call); n != 0 {
		t.Errorf("%v allocations per two calls, want 0", n)
	}
	m.TrackMillis()
	info.FullMethod = "/pkg.Svc/Timed"
	call()
	if n := testing.AllocsPerRun(100, call); n != 0 {
		t.Errorf("with TrackMillis: %v allocations per two calls, want 0", n)
	}
}

// panicking is a RateLimitService and RateLimitQuotaService whose calls
// panic.
type panicking struct {
	rlspb.UnimplementedRateLimitServiceServer
	rlqspb.UnimplementedRateLimitQuotaServiceServer
}

func (panicking) ShouldRateLimit(context.Context, *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	panic("unary")
}

func (panicking) StreamRateLimitQuotas(rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	panic("stream")
}

// TestGRPCMetrics_PanicCountedAsInternal: behind the server's recovery (as
// server.NewGRPC chains them: recovery first), a call whose handler
// panicked is counted as the INTERNAL the client gets, and the panic
// reaches the recovery with its stack.
func TestGRPCMetrics_PanicCountedAsInternal(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := observe.NewGRPCMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var stacks []string
	recovered := recovery.WithRecoveryHandler(func(p any) error {
		stacks = append(stacks, string(debug.Stack()))
		return status.Error(codes.Internal, "internal error")
	})
	s := grpc.NewServer(
		grpc.ChainUnaryInterceptor(recovery.UnaryServerInterceptor(recovered), m.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(recovered), m.StreamServerInterceptor()))
	rlspb.RegisterRateLimitServiceServer(s, panicking{})
	rlqspb.RegisterRateLimitQuotaServiceServer(s, panicking{})
	conn := serveLoopback(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	if _, err := rlspb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlspb.RateLimitRequest{}); status.Code(err) != codes.Internal {
		t.Fatalf("a panicking unary call: %v, want Internal", err)
	}
	st, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Internal {
		t.Fatalf("a panicking stream: %v, want Internal", err)
	}
	fams := scrape(t, reg)
	check(t, fams, "grpc_server_handled_total", map[string]string{"grpc_method": "ShouldRateLimit", "grpc_code": "Internal"}, 1)
	check(t, fams, "grpc_server_handled_total", map[string]string{"grpc_method": "StreamRateLimitQuotas", "grpc_code": "Internal"}, 1)
	check(t, fams, "grpc_server_handling_seconds", map[string]string{"grpc_method": "ShouldRateLimit"}, 1)
	for i, s := range stacks {
		if !strings.Contains(s, "observe_test.panicking.") {
			t.Errorf("recovery %d: the stack lacks the panicking handler:\n%s", i, s)
		}
	}
}
