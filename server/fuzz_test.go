package server_test

import (
	"context"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// FuzzShouldRateLimit feeds arbitrary wire bytes through Envoy's request
// decoding, the validation path and the limiter. A request is either
// refused with INVALID_ARGUMENT or answered with one OK/OVER_LIMIT status
// per descriptor and an overall code that agrees with them.
func FuzzShouldRateLimit(f *testing.F) {
	seeds := []*rlspb.RateLimitRequest{
		req(0, d("remote_address", "10.0.0.1")),
		req(3, d("api_key", "k", "method", "POST"), hits(d("path", "/login"), 0)),
		req(0, override(d("nothing", "x"), 5, typepb.RateLimitUnit_MINUTE), d("small", "a"), d("big", "a")),
		req(0, d("", "x")),
		{Domain: "e2e"},
		{Descriptors: []*commonpb.RateLimitDescriptor{d("a", "b")}},
		req(1<<31, d("tokens", "t"), d("free", "x"), d("shadow", "s")),
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	table := loadTable(f)
	lim := limiter.New(tables{table}, memory.New(memory.Options{}), limiter.Options{Clock: storetest.NewClock(t0)})
	rls := server.NewRLS(lim, server.Options{ResponseHeaders: true})
	f.Fuzz(func(t *testing.T, wire []byte) {
		in := new(rlspb.RateLimitRequest)
		if proto.Unmarshal(wire, in) != nil {
			return
		}
		out, err := rls.ShouldRateLimit(context.Background(), in)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument or an answer", err)
			}
			return
		}
		if len(out.Statuses) != len(in.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(out.Statuses), len(in.Descriptors))
		}
		anyOver := false
		for i, s := range out.Statuses {
			switch s.Code {
			case rlspb.RateLimitResponse_OK:
			case rlspb.RateLimitResponse_OVER_LIMIT:
				anyOver = true
			default:
				t.Fatalf("status %d: code %v", i, s.Code)
			}
		}
		if anyOver != (out.OverallCode == rlspb.RateLimitResponse_OVER_LIMIT) || out.OverallCode == rlspb.RateLimitResponse_UNKNOWN {
			t.Fatalf("overall %v disagrees with the statuses", out.OverallCode)
		}
	})
}
