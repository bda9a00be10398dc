package server_test

import (
	"fmt"
	"slices"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typepb "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
)

// FuzzDecodeRLS checks the gRPC path's decoding of Envoy's request
// against proto.Unmarshal followed by the proto message's translation:
// both refuse, or both give the same request. The decoding reuses a
// request that held another one first, as the pool does.
func FuzzDecodeRLS(f *testing.F) {
	seeds := []*rlspb.RateLimitRequest{
		fourDescriptors(),
		req(3, d("api_key", "k", "method", "POST"), hits(d("path", "/login"), 0)),
		req(0, multiplied(override(d("k", "v"), 7, typepb.RateLimitUnit_HOUR), 3), negative(hits(d("a", "b"), 9)), d("", "")),
		{Domain: "e2e"},
		func() *rlspb.RateLimitRequest { in, _ := newerEnvoy(); return in }(),
	}
	for _, s := range seeds {
		b, err := proto.Marshal(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	prev, err := proto.Marshal(req(5, d("x", "y", "z", "w"), override(d("o", "p"), 1, typepb.RateLimitUnit_SECOND)))
	if err != nil {
		f.Fatal(err)
	}
	// Bounds no message of the fuzzer's reaches (FuzzShape checks them).
	const maxDescriptors, maxEntries = 1 << 30, 1 << 30
	f.Fuzz(func(t *testing.T, wire []byte) {
		var got limiter.Request
		if err := server.DecodeRLS(&got, prev, "", maxDescriptors, maxEntries); err != nil {
			t.Fatal(err)
		}
		gotErr := server.DecodeRLS(&got, wire, "domain", maxDescriptors, maxEntries)
		in := new(rlspb.RateLimitRequest)
		wantErr := proto.Unmarshal(wire, in)
		if (gotErr == nil) != (wantErr == nil) {
			t.Fatalf("decodeRLS: %v, proto.Unmarshal: %v", gotErr, wantErr)
		}
		if wantErr != nil {
			return
		}
		var want limiter.Request
		server.FillRequest(&want, in)
		if g, w := describe(&got), describe(&want); g != w {
			t.Fatalf("decoded\n%s\nwant\n%s", g, w)
		}
		// Both paths see the same unknown fields (when none was left out).
		if dec, msg, err := server.UnknownFields(wire); err != nil || (len(dec) < server.MaxUnknown && !slices.Equal(dec, msg)) {
			t.Fatalf("unknown fields: decoded %q, from the message %q (%v)", dec, msg, err)
		}
	})
}

// describe prints a request, treating nil and empty slices alike.
func describe(r *limiter.Request) string {
	s := fmt.Sprintf("domain %q hits %d\n", r.Domain, r.HitsAddend)
	for i, d := range r.Descriptors {
		s += fmt.Sprintf("%d: cost %d/%v %v override %+v entries", i, d.Cost, d.HasCost, d.Kind, d.Override)
		for _, e := range d.Entries {
			s += fmt.Sprintf(" %q=%q", e.Key, e.Value)
		}
		s += "\n"
	}
	return s
}

// fourDescriptors is the benchmark's multi workload's shape.
func fourDescriptors() *rlspb.RateLimitRequest {
	return req(0, d("remote_address", "10.0.0.1"), d("api_key", "key-1", "method", "GET"),
		d("path", "/api/v1/items"), hits(d("user", "u-42"), 2))
}

// TestDecodeRLS_Allocs pins the gRPC codec's decoding of a request with
// four descriptors into a reused call: no allocation once the call's
// buffers have grown and its domain is known.
func TestDecodeRLS_Allocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	wire, err := proto.Marshal(fourDescriptors())
	if err != nil {
		t.Fatal(err)
	}
	decode, r := server.NewCallDecoder(wire)
	if err := decode(); err != nil {
		t.Fatal(err)
	}
	if len(r.Descriptors) != 4 || r.Domain != "e2e" {
		t.Fatalf("decoded %s", describe(r))
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if err := decode(); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("decoding allocates %.1f times per request, want 0", allocs)
	}
}

// TestGRPC_MalformedRequest: wire data proto.Unmarshal refuses gets
// INTERNAL, as gRPC answers any codec failure, and the next request on
// the connection is answered normally.
func TestGRPC_MalformedRequest(t *testing.T) {
	lim := limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{})
	gs := server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{})
	cc := serveLoopback(t, gs)
	const method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	bad := []byte("\x0a\x03e2e\x12\x05\x0a\x03\x0a\x01\xff") // invalid UTF-8 in a key
	var out []byte
	if err := cc.Invoke(ctx(t), method, &bad, &out, grpc.ForceCodecV2(rawCodec{})); status.Code(err) != codes.Internal {
		t.Errorf("malformed request: %v, want Internal", err)
	}
	good, err := proto.Marshal(fourDescriptors())
	if err != nil {
		t.Fatal(err)
	}
	if err := cc.Invoke(ctx(t), method, &good, &out, grpc.ForceCodecV2(rawCodec{})); err != nil {
		t.Fatal(err)
	}
	resp := new(rlspb.RateLimitResponse)
	if err := proto.Unmarshal(out, resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.Statuses) != 4 || resp.OverallCode != rlspb.RateLimitResponse_OK {
		t.Errorf("response %v, want 4 statuses, OK", resp)
	}
}

// rawCodec sends and receives messages as the bytes they are.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
