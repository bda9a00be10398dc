package main

import (
	"strings"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestServe_RequestBounds: what a client of ShouldRateLimit gets at each
// bound of a request (--max-recv-msg-size, --max-descriptors,
// --max-entries; an RLQS message over --max-recv-msg-size), and what
// /metrics counts, as docs/RELIABILITY.md's table of every bound says.
func TestServe_RequestBounds(t *testing.T) {
	grpcAddr, httpAddr, _ := startServe(t, nil, "--config", "testdata/serve",
		"--max-recv-msg-size", "4096", "--max-descriptors", "2", "--max-entries", "2")
	rls, _ := dialRLS(t, grpcAddr)
	ctx := testCtx(t)

	_, err := rls.ShouldRateLimit(ctx, rlsRequest("e2e", "remote_address", strings.Repeat("x", 5000)))
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a 5,000-byte request with --max-recv-msg-size 4096: %v, want ResourceExhausted", err)
	}
	three := rlsRequest("e2e", "remote_address", "a")
	three.Descriptors = append(three.Descriptors, three.Descriptors[0], three.Descriptors[0])
	if _, err := rls.ShouldRateLimit(ctx, three); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "more than 2 descriptors exceed the limit of 2") {
		t.Errorf("3 descriptors with --max-descriptors 2: %v, want InvalidArgument naming the limit", err)
	}
	long := rlsRequest("e2e", "a", "1", "b", "2", "c", "3")
	if _, err := rls.ShouldRateLimit(ctx, long); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 0: more than 2 entries exceed the limit of 2") {
		t.Errorf("3 entries with --max-entries 2: %v, want InvalidArgument naming the limit", err)
	}
	empty := rlsRequest("e2e")
	empty.Descriptors[0].Entries = []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "", Value: "x"}}
	if _, err := rls.ShouldRateLimit(ctx, empty); status.Code(err) != codes.InvalidArgument {
		t.Errorf("an empty key: %v, want InvalidArgument", err)
	}

	cc, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	q, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = q.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "e2e", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		{BucketId: &rlqspb.BucketId{Bucket: map[string]string{"remote_address": strings.Repeat("x", 5000)}}, TimeElapsed: durationpb.New(time.Second)}}})
	if _, err := q.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("an RLQS message of 5,000 bytes with --max-recv-msg-size 4096: %v, want ResourceExhausted", err)
	}

	// The client may read the stream's status before the server's
	// interceptor has counted it: read /metrics until it has.
	handled := map[string]float64{}
	for start := time.Now(); handled["StreamRateLimitQuotas ResourceExhausted"] == 0 && time.Since(start) < 30*time.Second; time.Sleep(10 * time.Millisecond) {
		clear(handled)
		for _, m := range getFamilies(t, "http://"+httpAddr+"/metrics")["grpc_server_handled_total"].GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			handled[l["grpc_method"]+" "+l["grpc_code"]] += m.GetCounter().GetValue()
		}
	}
	// gRPC refuses a unary request over the size before any interceptor
	// sees the call, so no metric counts it; a stream's message is
	// refused inside the call, which ends with the code.
	if handled["ShouldRateLimit InvalidArgument"] != 3 || handled["ShouldRateLimit ResourceExhausted"] != 0 ||
		handled["StreamRateLimitQuotas ResourceExhausted"] != 1 {
		t.Errorf("grpc_server_handled_total by method and code: %v, want ShouldRateLimit InvalidArgument 3 and no ResourceExhausted, "+
			"StreamRateLimitQuotas ResourceExhausted 1", handled)
	}
}
