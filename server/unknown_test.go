package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	commonpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
)

// withUnknown adds an unknown varint field num to m, as a newer Envoy's
// field would arrive.
func withUnknown[M proto.Message](m M, num protowire.Number) M {
	r := m.ProtoReflect()
	b := protowire.AppendTag(r.GetUnknown(), num, protowire.VarintType)
	r.SetUnknown(protoreflect.RawFields(protowire.AppendVarint(b, 1)))
	return m
}

// newerEnvoy is a request with fields this version of the proto does not
// define, in the request, a descriptor, an entry, a hits_addend and a
// limit override.
func newerEnvoy() (*rlspb.RateLimitRequest, []string) {
	desc := withUnknown(hits(d("path", "/login"), 0), 5)
	desc.Entries[0] = withUnknown(desc.Entries[0], 3)
	desc.HitsAddend = withUnknown(desc.HitsAddend, 2)
	o := withUnknown(override(d("k", "v"), 7, typepb.RateLimitUnit_HOUR), 5)
	o.Limit = withUnknown(o.Limit, 4)
	return withUnknown(req(0, desc, o, withUnknown(d("a", "b"), 5)), 9), []string{
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.5",
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry.3",
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride.4",
		"envoy.service.ratelimit.v3.RateLimitRequest.9",
		"google.protobuf.UInt64Value.2",
	}
}

// TestGRPC_IgnoredFields: the fields of a newer Envoy's request, which
// Sluice skips, reach OnIgnoredField once per request and field (at most
// MaxUnknown), on the codec's path and on the message path that
// interceptors take; a request without any reports nothing.
func TestGRPC_IgnoredFields(t *testing.T) {
	in, want := newerEnvoy()
	passthrough := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	for _, ic := range []grpc.UnaryServerInterceptor{nil, passthrough} {
		var mu sync.Mutex
		var got []string
		o := server.GRPCOptions{Options: server.Options{OnIgnoredField: func(m string, n int32) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, fmt.Sprintf("%s.%d", m, n))
		}}}
		if ic != nil {
			o.Interceptors = []grpc.UnaryServerInterceptor{ic}
		}
		lim := limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{})
		rls := rlspb.NewRateLimitServiceClient(serveLoopback(t, server.NewGRPC(lim, server.NewHealth(), o)))
		if _, err := rls.ShouldRateLimit(ctx(t), in); err != nil {
			t.Fatal(err)
		}
		if _, err := rls.ShouldRateLimit(ctx(t), req(0, d("path", "/login"))); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("interceptor %v: ignored %q, want %q", ic != nil, got, want)
		}
		mu.Unlock()
	}
}

// TestCall_IgnoredFieldsAllocs: a request with fields Sluice ignores
// costs no allocation either, its fields reported.
func TestCall_IgnoredFieldsAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	in, _ := newerEnvoy()
	wire, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	reported := 0
	lim := limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{})
	s := server.NewRLS(lim, server.Options{OnIgnoredField: func(string, int32) { reported++ }})
	call := server.NewCall(s, wire, nil, func([]byte) {})
	if err := call(); err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 || reported != 5*1002 {
		t.Errorf("a call allocates %.1f times, %d fields reported, want 0 and %d", allocs, reported, 5*1002)
	}
}

// TestDecode_KnowsEveryField: the codec reads every field that this
// version of Envoy's proto defines (a newer go-control-plane with new
// fields fails here until decode.go reads them or reports them).
func TestDecode_KnowsEveryField(t *testing.T) {
	read := map[protoreflect.FullName][]protowire.Number{
		"envoy.service.ratelimit.v3.RateLimitRequest":                                {1, 2, 3},
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor":                   {1, 2, 3, 4},
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.Entry":             {1, 2},
		"envoy.extensions.common.ratelimit.v3.RateLimitDescriptor.RateLimitOverride": {1, 2, 3},
	}
	for _, m := range []protoreflect.MessageDescriptor{(&rlspb.RateLimitRequest{}).ProtoReflect().Descriptor(),
		(&commonpb.RateLimitDescriptor{}).ProtoReflect().Descriptor(), (&commonpb.RateLimitDescriptor_Entry{}).ProtoReflect().Descriptor(),
		(&commonpb.RateLimitDescriptor_RateLimitOverride{}).ProtoReflect().Descriptor()} {
		var nums []protowire.Number
		for i := range m.Fields().Len() {
			nums = append(nums, m.Fields().Get(i).Number())
		}
		slices.Sort(nums)
		if !slices.Equal(nums, read[m.FullName()]) {
			t.Errorf("%s has fields %v; decode.go reads %v", m.FullName(), nums, read[m.FullName()])
		}
	}
}
