package ui_test

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/observe/ui"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/server"
)

// quotaRig is a page over a real quota service served on a loopback gRPC
// listener, and a proxy's stream to it.
type quotaRig struct {
	*rig
	q      *quota.Service
	stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
}

func newQuotaRig(t *testing.T) *quotaRig {
	t.Helper()
	r := newRig(t)
	q := quota.New(r.reload, quota.Options{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, server.NewRLQS(q))
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	page, err := ui.New(ui.Options{Tables: r.reload, Reload: r.reload, Quota: q})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(page.Handler())
	t.Cleanup(srv.Close)
	r.url = srv.URL
	return &quotaRig{rig: r, q: q, stream: stream}
}

// report sends one report of the buckets (key=value each) and waits for
// the answer to each new one.
func (r *quotaRig) report(t *testing.T, domain string, buckets ...string) {
	t.Helper()
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: domain}
	for _, b := range buckets {
		k, v, _ := strings.Cut(b, "=")
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: map[string]string{k: v}}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 1})
	}
	if err := r.stream.Send(m); err != nil {
		t.Fatal(err)
	}
	for n := 0; n < len(buckets); {
		res, err := r.stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		n += len(res.BucketAction)
	}
}

// TestQuota_PerRule: a proxy's buckets, reported over a real RLQS stream,
// are listed under their rules with the service's counts; the bucket ids
// appear only under the detailed_metric rule, and in no other answer.
func TestQuota_PerRule(t *testing.T) {
	r := newQuotaRig(t)
	r.report(t, "web", "remote_address=10.9.8.7", "api_key=sk-alice", "health=probe-secret")
	if err := r.q.Tick(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	var v ui.QuotaView
	body := getJSON(t, r.url+"/ui/api/rlqs", &v)
	if !v.Enabled || v.Streams != 1 || v.Buckets != 3 || v.Shared || v.Reports != 1 || v.Total != 3 || v.Truncated {
		t.Errorf("rlqs %+v: want enabled, 1 stream, 3 buckets, not shared, 1 report, 3 rules", v.QuotaSummary)
	}
	got := map[string]ui.RuleQuota{}
	for _, q := range v.Rules {
		got[q.Domain+"/"+q.Rule] = q
	}
	if q := got["web/remote_address"]; q.Streams != 1 || q.Buckets != 1 || q.Groups != 1 || q.Limit != 2 || q.Per != "minute" ||
		q.Assigned <= 0 || q.Assigned > 2 || q.BucketIDs != nil {
		t.Errorf("remote_address: %+v, want 1 stream, 1 bucket, 1 group, a share of the limit 2 per minute, no ids", q)
	}
	if q := got["web/api_key"]; q.Buckets != 1 || q.Limit != 100 || len(q.BucketIDs) != 1 || q.BucketIDs[0]["api_key"] != "sk-alice" {
		t.Errorf("api_key (detailed_metric): %+v, want its bucket id listed", q)
	}
	if q := got["web/health"]; q.Buckets != 1 || q.Groups != 0 || q.Assigned != 0 {
		t.Errorf("health (unlimited): %+v, want 1 bucket, nothing divided", q)
	}
	for _, secret := range []string{"10.9.8.7", "probe-secret"} {
		if strings.Contains(body, secret) {
			t.Errorf("the rlqs JSON shows the bucket value %q of a rule without detailed_metric: %s", secret, body)
		}
	}
	for _, p := range []string{"/ui/api/overview", "/ui/api/limits", "/ui/api/traffic", "/"} {
		_, b := get(t, r.url+p)
		for _, secret := range []string{"10.9.8.7", "probe-secret", "sk-alice"} {
			if strings.Contains(b, secret) {
				t.Errorf("GET %s shows the bucket value %q", p, secret)
			}
		}
	}
	var o ui.Overview
	getJSON(t, r.url+"/ui/api/overview", &o)
	if o.RLQS == nil || o.RLQS.Streams != 1 || o.RLQS.Buckets != 3 {
		t.Errorf("overview rlqs %+v, want 1 stream, 3 buckets", o.RLQS)
	}

	// The stream ends: its buckets leave at the next interval.
	r.stream.CloseSend()
	for {
		if _, err := r.stream.Recv(); err != nil {
			break // the server ended the stream
		}
	}
	if err := r.q.Tick(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	v = ui.QuotaView{}
	getJSON(t, r.url+"/ui/api/rlqs", &v)
	if v.Streams != 0 || v.Buckets != 0 || len(v.Rules) != 0 {
		t.Errorf("after the stream ended: %+v, want nothing", v)
	}
}

// TestQuota_Bounded: at most MaxRules rules, at most MaxStatBuckets ids
// per rule, each key and value cut.
func TestQuota_Bounded(t *testing.T) {
	r := newQuotaRig(t)
	var b strings.Builder
	b.WriteString("domain: web\ndescriptors:\n  - {key: user, detailed_metric: true, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for i := range ui.MaxRules + 3 {
		fmt.Fprintf(&b, "  - {key: k%d, rate_limit: {unit: second, requests_per_unit: 1}}\n", i)
	}
	write(t, r.dir, "limits.yaml", b.String())
	if err := r.reload.Reload(); err != nil {
		t.Fatal(err)
	}
	st, err := r.q.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var us []quota.Usage
	for i := range ui.MaxRules + 3 {
		us = append(us, quota.Usage{Bucket: map[string]string{fmt.Sprint("k", i): "v"}, Elapsed: time.Second})
	}
	long := strings.Repeat("x", quota.MaxValueBytes-3)
	for i := range 2 * quota.MaxStatBuckets {
		us = append(us, quota.Usage{Bucket: map[string]string{"user": fmt.Sprint(i, long)}, Elapsed: time.Second})
	}
	if err := st.Report(time.Now(), "web", us); err != nil {
		t.Fatal(err)
	}
	if err := r.q.Tick(t.Context(), time.Now()); err != nil {
		t.Fatal(err)
	}
	var v ui.QuotaView
	body := getJSON(t, r.url+"/ui/api/rlqs", &v)
	if v.Total != ui.MaxRules+4 || len(v.Rules) != ui.MaxRules || !v.Truncated {
		t.Fatalf("total %d, %d listed, truncated %v; want %d, %d, true", v.Total, len(v.Rules), v.Truncated, ui.MaxRules+4, ui.MaxRules)
	}
	for _, q := range v.Rules {
		if q.Rule != "user" {
			continue
		}
		if q.Buckets != 2*quota.MaxStatBuckets || len(q.BucketIDs) != quota.MaxStatBuckets {
			t.Errorf("user: %d buckets, %d ids; want %d, %d", q.Buckets, len(q.BucketIDs), 2*quota.MaxStatBuckets, quota.MaxStatBuckets)
		}
		for _, id := range q.BucketIDs {
			if n := len(id["user"]); n > 260 {
				t.Errorf("a bucket id value of %d bytes listed", n)
			}
		}
	}
	if len(body) > 1<<20 {
		t.Errorf("rlqs JSON of %d bytes", len(body))
	}
}

// TestQuota_Off: without a quota service the page says so.
func TestQuota_Off(t *testing.T) {
	r := newRig(t)
	var v ui.QuotaView
	getJSON(t, r.url+"/ui/api/rlqs", &v)
	if v.Enabled || v.Rules == nil || len(v.Rules) != 0 {
		t.Errorf("rlqs without RLQS: %+v", v)
	}
	var o ui.Overview
	getJSON(t, r.url+"/ui/api/overview", &o)
	if o.RLQS != nil {
		t.Errorf("overview rlqs %+v without RLQS, want null", o.RLQS)
	}
}
