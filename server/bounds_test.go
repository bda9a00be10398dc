package server_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"testing"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/gen/sluice/v1"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
)

const mib = 1 << 20

// hostileWire returns 1 MiB of Envoy's request: the domain, then empty
// descriptors (many descriptors) or one descriptor of empty entries
// (many entries).
func hostileWire(manyEntries bool) []byte {
	b := []byte("\x0a\x03e2e")
	if manyEntries {
		n := (mib - len(b) - 6) &^ 1
		b = append(b, 0x12)
		b = appendVarint(b, uint64(n))
		return append(b, bytes.Repeat([]byte{0x0a, 0x00}, n/2)...)
	}
	return append(b, bytes.Repeat([]byte{0x12, 0x00}, (mib-len(b))/2)...)
}

// hostileJSON is hostileWire's JSON form.
func hostileJSON(manyEntries bool) []byte {
	if manyEntries {
		return []byte(`{"domain":"e2e","descriptors":[{"entries":[` + strings.Repeat(`{},`, (mib-100)/3) + `{}]}]}`)
	}
	return []byte(`{"domain":"e2e","descriptors":[` + strings.Repeat(`{},`, (mib-100)/3) + `{}]}`)
}

func appendVarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// allocatedPerRun is the heap bytes fn allocates, averaged over runs.
func allocatedPerRun(runs int, fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range runs {
		fn()
	}
	runtime.ReadMemStats(&after)
	return (after.TotalAlloc - before.TotalAlloc) / uint64(runs)
}

// TestDecodeRLS_HostileMessageBounded: a 1 MiB request of empty
// descriptors, or of one descriptor of empty entries, is refused at the
// bound with the limit in the reason, and decoding it into a fresh
// request allocates a few kilobytes, not the half million descriptors or
// entries it holds (tens of megabytes before the bound stopped decoding).
func TestDecodeRLS_HostileMessageBounded(t *testing.T) {
	for _, manyEntries := range []bool{false, true} {
		wire := hostileWire(manyEntries)
		want := "more than 64 descriptors exceed the limit of 64"
		if manyEntries {
			want = "descriptor 0: more than 16 entries exceed the limit of 16"
		}
		var err error
		per := allocatedPerRun(10, func() {
			var r limiter.Request
			err = server.DecodeRLS(&r, wire, "", limiter.DefaultMaxDescriptors, limiter.DefaultMaxEntries)
			if len(r.Descriptors) > limiter.DefaultMaxDescriptors || len(r.Descriptors) > 0 && len(r.Descriptors[0].Entries) > limiter.DefaultMaxEntries {
				t.Fatalf("decoded %d descriptors", len(r.Descriptors))
			}
		})
		var inv *limiter.InvalidError
		if !errors.As(err, &inv) || inv.Reason != want {
			t.Errorf("many entries %v: %v, want the reason %q", manyEntries, err, want)
		}
		if per > 64<<10 {
			t.Errorf("many entries %v: decoding a 1 MiB request allocates %d bytes, want at most 64 KiB", manyEntries, per)
		}
		if err := server.WireShape(wire, limiter.DefaultMaxDescriptors, limiter.DefaultMaxEntries); err == nil || err.Error() != "limiter: invalid request: "+want {
			t.Errorf("many entries %v: the wire form's shape: %v, want %q", manyEntries, err, want)
		}
		body := hostileJSON(manyEntries)
		if err := server.JSONShape(body, limiter.DefaultMaxDescriptors, limiter.DefaultMaxEntries); err == nil || err.Error() != "limiter: invalid request: "+want {
			t.Errorf("many entries %v: the JSON form's shape: %v, want %q", manyEntries, err, want)
		}
		if !raceEnabled {
			allocs := testing.AllocsPerRun(3, func() {
				server.JSONShape(body, limiter.DefaultMaxDescriptors, limiter.DefaultMaxEntries)
				server.WireShape(wire, limiter.DefaultMaxDescriptors, limiter.DefaultMaxEntries)
			})
			if allocs > 4 {
				t.Errorf("many entries %v: checking the shapes allocates %.0f times, want a few (the error)", manyEntries, allocs)
			}
		}
	}
}

// FuzzShape checks the shape of a request's wire and JSON forms against
// the decoded message: refused exactly when the message has more than 2
// descriptors or a descriptor of more than 2 entries, and the gRPC
// codec's decoding stops at the same bounds.
func FuzzShape(f *testing.F) {
	for _, m := range []*rlspb.RateLimitRequest{fourDescriptors(), req(0, d("a", "b", "c", "d", "e", "f")),
		req(0, d("a", "b"), d("c", "d")), {Domain: "e2e"}} {
		w, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(w, false)
		j, err := protojson.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(j, true)
	}
	f.Add([]byte(`{"domain":"x","descriptors":[{"entries":[{"key":"a"},{"key":"b"},{"key":"c"}]}]}`), true)
	f.Add([]byte(`{"descr\u0069ptors":[{},{},{}],"domain":"x"}`), true)
	f.Add([]byte(`{"domain":"x","other":[{"entries":[{},{},{}]}],"descriptors":[{"entries":[]}]}`), true)
	f.Fuzz(func(t *testing.T, b []byte, isJSON bool) {
		in := new(rlspb.RateLimitRequest)
		var err, shapeErr error
		if isJSON {
			err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, in)
			shapeErr = server.JSONShape(b, 2, 2)
		} else {
			err = proto.Unmarshal(b, in)
			shapeErr = server.WireShape(b, 2, 2)
		}
		if err != nil {
			return
		}
		over := len(in.Descriptors) > 2
		for _, d := range in.Descriptors {
			over = over || len(d.Entries) > 2
		}
		if over != (shapeErr != nil) {
			t.Fatalf("%d descriptors: shape error %v", len(in.Descriptors), shapeErr)
		}
		if isJSON {
			return
		}
		var r limiter.Request
		decErr := server.DecodeRLS(&r, b, "", 2, 2)
		var inv *limiter.InvalidError
		if over != errors.As(decErr, &inv) || (!over && decErr != nil) {
			t.Fatalf("over the bounds %v: decodeRLS: %v", over, decErr)
		}
	})
}

// TestGRPC_HostileRequestsRefusedAtTheBound sends 1 MiB requests over
// real gRPC: Envoy's ShouldRateLimit (the codec's path and, with an
// interceptor, the proto messages'), our Check, /json, /v1/check and
// /v1/counters are refused with INVALID_ARGUMENT or 400 naming the bound;
// an RLQS report of more usages than a stream may hold ends its stream as
// the quota service would. A normal request on the same connection is
// answered.
func TestGRPC_HostileRequestsRefusedAtTheBound(t *testing.T) {
	lim := limiter.New(tables{loadTable(t)}, memory.New(memory.Options{}), limiter.Options{})
	noop := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(ctx, req)
	}
	q := quota.New(tables{loadTable(t)}, quota.Options{MaxBucketsPerStream: 4})
	for _, interceptors := range [][]grpc.UnaryServerInterceptor{nil, {noop}} {
		gs := server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{Interceptors: interceptors, MaxRecvMsgSize: 2 * mib, Quota: q})
		cc := serveLoopback(t, gs)
		for _, manyEntries := range []bool{false, true} {
			wire := hostileWire(manyEntries)
			var out []byte
			err := cc.Invoke(ctx(t), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", &wire, &out, grpc.ForceCodecV2(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "exceed the limit of") {
				t.Errorf("interceptors %d, many entries %v: ShouldRateLimit: %v, want InvalidArgument naming the limit", len(interceptors), manyEntries, err)
			}
			err = cc.Invoke(ctx(t), sluicev1.RateLimiter_Check_FullMethodName, &wire, &out, grpc.ForceCodecV2(rawCodec{}))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "exceed the limit of") {
				t.Errorf("interceptors %d, many entries %v: Check: %v, want InvalidArgument naming the limit", len(interceptors), manyEntries, err)
			}
		}
		if _, err := rlspb.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx(t), fourDescriptors()); err != nil {
			t.Errorf("interceptors %d: a normal request: %v", len(interceptors), err)
		}
		// An RLQS report of 5 usages where a stream holds 4 buckets.
		s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		us := []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{}
		for range 5 {
			us = append(us, usage(1, 0, "k", "v"))
		}
		sendReports(t, s, reports("e2e", us...))
		for err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "more than 4 bucket_quota_usages in one report") {
			t.Errorf("interceptors %d: an RLQS report of 5 usages: %v, want ResourceExhausted naming the bound", len(interceptors), err)
		}
	}

	e := newCountersEnv(t, false)
	for _, manyEntries := range []bool{false, true} {
		body := string(hostileJSON(manyEntries))
		for _, path := range []string{"/json", "/v1/check", "/v1/counters"} {
			r := e.do(t, "POST", path, body)
			if msg, _ := r.body["error"].(string); r.code != 400 || !strings.Contains(msg, "exceed the limit of") {
				t.Errorf("many entries %v: POST %s: %d %v, want 400 naming the limit", manyEntries, path, r.code, r.body)
			}
		}
	}
	r := e.do(t, "GET", "/v1/counters?domain=e2e"+strings.Repeat("&key=k&value=v", 17), "")
	if msg, _ := r.body["error"].(string); r.code != 400 || !strings.Contains(msg, "more than 16 entries exceed the limit of 16") {
		t.Errorf("GET /v1/counters with 17 keys: %d %v, want 400 naming the limit", r.code, r.body)
	}
}

// TestShouldRateLimit_DomainBound: a domain longer than --max-domain-bytes
// (1024 by default) is refused with INVALID_ARGUMENT naming the limit,
// over gRPC and HTTP; the longest domain Envoy Gateway writes
// (namespace/gateway/listener: 63, 253 and 253 bytes) is answered.
func TestShouldRateLimit_DomainBound(t *testing.T) {
	e := newEnv(t, limiter.Options{}, server.Options{})
	eg := strings.Repeat("n", 63) + "/" + strings.Repeat("g", 253) + "/" + strings.Repeat("l", 253)
	in := req(0, d("path", "/x"))
	in.Domain = eg
	if _, err := e.rls.ShouldRateLimit(ctx(t), in); err != nil {
		t.Errorf("a domain of %d bytes: %v", len(eg), err)
	}
	in.Domain = strings.Repeat("d", limiter.DefaultMaxDomainBytes+1)
	_, err := e.rls.ShouldRateLimit(ctx(t), in)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "a domain of 1025 bytes exceeds the limit of 1024") {
		t.Errorf("a domain of 1025 bytes: %v, want InvalidArgument naming the limit", err)
	}
	r := e.do(t, "POST", "/v1/check", `{"domain":"`+in.Domain+`","key":"path","value":"/x"}`)
	if msg, _ := r.body["error"].(string); r.code != 400 || !strings.Contains(msg, "exceeds the limit of 1024") {
		t.Errorf("POST /v1/check with a domain of 1025 bytes: %d %v, want 400 naming the limit", r.code, r.body)
	}
}

// TestRefunds_Setting: with Refunds deny every request holding a refund
// (is_negative_hits, COST_KIND_REFUND) is refused PERMISSION_DENIED (HTTP
// 403) and others are answered; with token only a caller sending the
// admin token in "authorization: Bearer" may refund; allow, the default,
// takes refunds from anyone, as anyone may send hits.
func TestRefunds_Setting(t *testing.T) {
	refund := req(0, negative(hits(d("path", "/x"), 1)))
	apiRefund := `{"domain":"e2e","key":"path","value":"/x","kind":"COST_KIND_REFUND"}`
	for _, c := range []struct {
		refunds             server.Refunds
		anyone, withToken   codes.Code
		httpAnyone, httpTok int
	}{
		{server.RefundsAllow, codes.OK, codes.OK, 200, 200},
		{server.RefundsToken, codes.PermissionDenied, codes.OK, 403, 200},
		{server.RefundsDeny, codes.PermissionDenied, codes.PermissionDenied, 403, 403},
	} {
		e := newEnv(t, limiter.Options{}, server.Options{Refunds: c.refunds, RefundAuth: tokenAuth(goodToken)})
		if _, err := e.rls.ShouldRateLimit(ctx(t), req(0, d("path", "/x"))); err != nil {
			t.Errorf("refunds %v: a request without a refund: %v", c.refunds, err)
		}
		_, err := e.rls.ShouldRateLimit(ctx(t), refund)
		if status.Code(err) != c.anyone {
			t.Errorf("refunds %v: a refund without the token: %v, want %v", c.refunds, err, c.anyone)
		}
		withToken := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+goodToken)
		if _, err := e.rls.ShouldRateLimit(withToken, refund); status.Code(err) != c.withToken {
			t.Errorf("refunds %v: a refund with the token: %v, want %v", c.refunds, err, c.withToken)
		}
		wrong := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+goodToken+"x")
		if _, err := e.rls.ShouldRateLimit(wrong, refund); status.Code(err) != c.anyone {
			t.Errorf("refunds %v: a refund with a wrong token: %v, want %v", c.refunds, err, c.anyone)
		}
		if r := e.do(t, "POST", "/v1/check", apiRefund); r.code != c.httpAnyone {
			t.Errorf("refunds %v: POST /v1/check of a refund: %d %v, want %d", c.refunds, r.code, r.body, c.httpAnyone)
		}
		h := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer " + goodToken}}
		if r := e.doWith(t, "POST", "/v1/check", apiRefund, h); r.code != c.httpTok {
			t.Errorf("refunds %v: POST /v1/check of a refund with the token: %d %v, want %d", c.refunds, r.code, r.body, c.httpTok)
		}
	}
}
