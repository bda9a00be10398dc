package loadgen

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serve runs srv on a loopback port for the test's lifetime.
func serve(t *testing.T, srv rlspb.RateLimitServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	rlspb.RegisterRateLimitServiceServer(s, srv)
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(lis) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return lis.Addr().String()
}

func TestRun_ClosedLoopAgainstNoop(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srvCtx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() { served <- ServeNoop(srvCtx, lis) }()

	reqs, err := Workload("multi", "bench", 10)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(ctx, Options{Target: lis.Addr().String(), Requests: reqs, Concurrency: 4, Connections: 2,
		Duration: 500 * time.Millisecond, Warmup: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if err := <-served; err != nil {
		t.Errorf("ServeNoop: %v", err)
	}
	if res.Requests == 0 {
		t.Fatal("no request counted")
	}
	if res.Codes["OK"] != res.Requests || len(res.Codes) != 1 {
		t.Errorf("grpc codes %v, want only OK = %d", res.Codes, res.Requests)
	}
	if res.Overall["OK"] != res.Requests || len(res.Overall) != 1 {
		t.Errorf("overall codes %v, want only OK = %d", res.Overall, res.Requests)
	}
	if res.StatusMismatches != 0 {
		t.Errorf("%d replies had a status count other than 4", res.StatusMismatches)
	}
	if res.Service != nil {
		t.Errorf("closed loop reports a service latency apart: %+v", res.Service)
	}
	if want := float64(res.Requests) / 0.5; res.RPS != want {
		t.Errorf("RPS = %v, want requests/duration = %v", res.RPS, want)
	}
	l := res.Latency
	if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
		t.Errorf("latency quantiles out of order: %+v", l)
	}
	if res.Concurrency != 4 || res.Connections != 2 || res.Seconds != 0.5 {
		t.Errorf("result echoes concurrency %d connections %d duration %v, want 4, 2, 0.5", res.Concurrency, res.Connections, res.Seconds)
	}

	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("JSON does not parse: %v\n%s", err, b)
	}
	for _, k := range []string{"requests", "rps", "grpc_codes", "overall_codes", "latency_us", "cpu_us_per_request"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON lacks %q: %s", k, b)
		}
	}
}

// mixed answers by domain: "ok" → OK, "over" → OVER_LIMIT, else
// UNAVAILABLE; and a wrong number of statuses for "over".
type mixed struct {
	rlspb.UnimplementedRateLimitServiceServer
}

func (mixed) ShouldRateLimit(_ context.Context, req *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	switch req.Domain {
	case "ok":
		return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK,
			Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{{Code: rlspb.RateLimitResponse_OK}}}, nil
	case "over":
		return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OVER_LIMIT}, nil
	}
	return nil, status.Error(codes.Unavailable, "store down")
}

func TestRun_CountsByCode(t *testing.T) {
	addr := serve(t, mixed{})
	var reqs []*rlspb.RateLimitRequest
	for _, d := range []string{"ok", "over", "down"} {
		reqs = append(reqs, request(d, []string{"k"}, "v"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Target: addr, Requests: reqs, Duration: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// One worker sends ok, over, down in turn: the counts differ by at
	// most one and add up.
	ok, over, down := res.Overall["OK"], res.Overall["OVER_LIMIT"], res.Codes["Unavailable"]
	if ok+over+down != res.Requests || res.Codes["OK"] != ok+over {
		t.Errorf("counts do not add up: requests %d, grpc %v, overall %v", res.Requests, res.Codes, res.Overall)
	}
	if ok == 0 || ok-over > 1 || ok-down > 1 {
		t.Errorf("uneven counts: OK %d, OVER_LIMIT %d, Unavailable %d", ok, over, down)
	}
	if res.StatusMismatches != over {
		t.Errorf("status mismatches = %d, want one per OVER_LIMIT reply (%d)", res.StatusMismatches, over)
	}
}

func TestRun_OpenLoopPaces(t *testing.T) {
	addr := serve(t, Noop{})
	reqs, err := Workload("distinct", "bench", 100)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// 50 slots: a call may take 250 ms (a busy machine under -race)
	// before the schedule slips.
	res, err := Run(ctx, Options{Target: addr, Requests: reqs, Concurrency: 50, Rate: 400,
		Duration: time.Second, Warmup: 250 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// 400 requests are scheduled in the measured second: each is either
	// answered or counted unanswered (on a quiet machine all are
	// answered; a stalled one may leave some pending). A closed loop
	// would send far more.
	if res.Requests+res.Unfinished != 400 || res.Requests == 0 {
		t.Errorf("open loop at 400/s for 1s: %d requests + %d unfinished, want 400 with some answered", res.Requests, res.Unfinished)
	}
	if s := res.Service; s == nil || s.P50 <= 0 || s.P50 > res.Latency.P50 || s.Max > res.Latency.Max {
		t.Errorf("service latency %+v: want positive and at most the latency from the schedule %+v", s, res.Latency)
	}
	// Achieved: the answers over at least the measured second.
	if res.Rate != 400 || res.RPS > 400 || res.RPS <= 0 {
		t.Errorf("Rate = %v, RPS = %v; want 400 and an achieved rate in (0, 400]", res.Rate, res.RPS)
	}
}

// stall never answers: it waits for the call to be cancelled.
type stall struct {
	rlspb.UnimplementedRateLimitServiceServer
}

func (stall) ShouldRateLimit(ctx context.Context, _ *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func TestRun_OpenLoopCountsUnfinished(t *testing.T) {
	addr := serve(t, stall{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, Options{Target: addr, Requests: []*rlspb.RateLimitRequest{request("d", []string{"k"}, "v")},
		Concurrency: 4, Rate: 100, Duration: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Requests != 0 || res.Unfinished != 20 {
		t.Errorf("against a server that never answers: %d requests, %d unfinished; want 0, 20 (%v)", res.Requests, res.Unfinished, res.Codes)
	}
}

func TestRun_Errors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Run(ctx, Options{Target: "127.0.0.1:1"}); err == nil {
		t.Error("Run without requests: no error")
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	if _, err := Run(ctx, Options{Target: addr, Requests: []*rlspb.RateLimitRequest{request("d", []string{"k"}, "v")}}); err == nil {
		t.Errorf("Run against a closed port %s: no error", addr)
	}
}

func TestReply_Scan(t *testing.T) {
	resp := &rlspb.RateLimitResponse{
		OverallCode: rlspb.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlspb.RateLimitResponse_DescriptorStatus{
			{Code: rlspb.RateLimitResponse_OK, LimitRemaining: 3},
			{Code: rlspb.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlspb.RateLimitResponse_RateLimit{Name: "x", RequestsPerUnit: 5}},
		},
		RawBody: []byte("slow down"),
	}
	b, err := proto.Marshal(resp)
	if err != nil {
		t.Fatal(err)
	}
	var r reply
	if err := (rawCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:5]), mem.SliceBuffer(b[5:])}, &r); err != nil {
		t.Fatal(err)
	}
	if r.code != rlspb.RateLimitResponse_OVER_LIMIT || r.statuses != 2 {
		t.Errorf("scan = %+v, want OVER_LIMIT with 2 statuses", r)
	}
	if err := r.scan(b[:len(b)-2]); err == nil {
		t.Error("scan of a truncated reply: no error")
	}
}

func TestWorkload(t *testing.T) {
	for _, c := range []struct {
		name        string
		reqs, descs int
		key         string
	}{{"distinct", 7, 1, "k"}, {"hot", 1, 1, "hot"}, {"multi", 7, 4, "k1"}} {
		reqs, err := Workload(c.name, "bench", 7)
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != c.reqs || len(reqs[0].Descriptors) != c.descs || reqs[0].Domain != "bench" {
			t.Errorf("%s: %d requests of %d descriptors in %q, want %d of %d in bench", c.name, len(reqs), len(reqs[0].Descriptors), reqs[0].Domain, c.reqs, c.descs)
		}
		if k := reqs[0].Descriptors[0].Entries[0].Key; k != c.key {
			t.Errorf("%s: first key %q, want %q", c.name, k, c.key)
		}
		if c.reqs > 1 && proto.Equal(reqs[0], reqs[1]) {
			t.Errorf("%s: requests 0 and 1 are equal, want distinct values", c.name)
		}
	}
	if _, err := Workload("nope", "bench", 1); err == nil {
		t.Error("unknown workload: no error")
	}
	if _, err := Workload("distinct", "bench", 0); err == nil {
		t.Error("0 keys: no error")
	}
}

func TestReadRequests(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"one.json":  `{"domain": "web", "descriptors": [{"entries": [{"key": "path", "value": "/a"}]}], "hitsAddend": 2}`,
		"list.yaml": "- domain: web\n  descriptors:\n    - entries: [{key: path, value: /a}]\n  hits_addend: 2\n- domain: api\n  descriptors: [{entries: [{key: k}]}]\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := &rlspb.RateLimitRequest{Domain: "web", HitsAddend: 2, Descriptors: []*ratelimitpb.RateLimitDescriptor{
		{Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "path", Value: "/a"}}}}}
	one, err := ReadRequests(filepath.Join(dir, "one.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || !proto.Equal(one[0], want) {
		t.Errorf("one.json = %v, want [%v]", one, want)
	}
	list, err := ReadRequests(filepath.Join(dir, "list.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || !proto.Equal(list[0], want) || list[1].Domain != "api" {
		t.Errorf("list.yaml = %v, want [%v, {domain api ...}]", list, want)
	}
	if err := os.WriteFile(filepath.Join(dir, "bad.json"), []byte(`{"domian": "x"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadRequests(filepath.Join(dir, "bad.json")); err == nil {
		t.Error("misspelt field: no error")
	}
}

// BenchmarkCodec compares what the generator pays per call to encode a
// request and read a reply: raw pre-marshalled frames and a scanned reply
// against gRPC's proto codec with pre-built, reused messages.
func BenchmarkCodec(b *testing.B) {
	reqs, err := Workload("multi", "bench", 1)
	if err != nil {
		b.Fatal(err)
	}
	resp, err := Noop{}.ShouldRateLimit(context.Background(), reqs[0])
	if err != nil {
		b.Fatal(err)
	}
	wire, err := proto.Marshal(resp)
	if err != nil {
		b.Fatal(err)
	}
	in := mem.BufferSlice{mem.SliceBuffer(wire)}
	b.Run("raw", func(b *testing.B) {
		f, err := newFrame(reqs[0])
		if err != nil {
			b.Fatal(err)
		}
		var r reply
		c := rawCodec{}
		b.ReportAllocs()
		for b.Loop() {
			out, _ := c.Marshal(f)
			out.Free()
			if err := c.Unmarshal(in, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("proto", func(b *testing.B) {
		var out rlspb.RateLimitResponse
		b.ReportAllocs()
		for b.Loop() {
			enc, err := proto.Marshal(reqs[0])
			if err != nil {
				b.Fatal(err)
			}
			_ = enc
			if err := proto.Unmarshal(wire, &out); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// deadlineEcho answers OK when its caller sent a deadline (grpc-timeout)
// of 10 s, less at most 5 s in transit (a busy machine), and UNAVAILABLE
// otherwise (none, a longer one, or one in the wrong unit).
type deadlineEcho struct {
	rlspb.UnimplementedRateLimitServiceServer
}

func (deadlineEcho) ShouldRateLimit(ctx context.Context, _ *rlspb.RateLimitRequest) (*rlspb.RateLimitResponse, error) {
	if d, ok := ctx.Deadline(); !ok || time.Until(d) > 10*time.Second || time.Until(d) <= 5*time.Second {
		return nil, status.Error(codes.Unavailable, "want a deadline of 10 s")
	}
	return &rlspb.RateLimitResponse{OverallCode: rlspb.RateLimitResponse_OK}, nil
}

// TestRun_Timeout: Options.Timeout reaches the server as each call's
// grpc-timeout; without it no deadline is sent but the test context's
// 30 s. (10 s, not 1: a call that must be answered OK must not reach its
// deadline on a busy machine.)
func TestRun_Timeout(t *testing.T) {
	addr := serve(t, deadlineEcho{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reqs, err := Workload("distinct", "bench", 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		timeout time.Duration
		code    string
	}{{10 * time.Second, "OK"}, {0, "Unavailable"}} {
		res, err := Run(ctx, Options{Target: addr, Requests: reqs, Concurrency: 2, Duration: 100 * time.Millisecond, Timeout: tc.timeout})
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests == 0 || res.Codes[tc.code] != res.Requests {
			t.Errorf("timeout %v: codes %v of %d, want all %s", tc.timeout, res.Codes, res.Requests, tc.code)
		}
	}
}
