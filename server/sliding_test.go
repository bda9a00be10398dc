package server_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

const slidingLimits = `
domain: e2e
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 2, algorithm: sliding_window, name: rolling}
  - key: half_minute
    rate_limit: {unit: second, requests_per_unit: 1, unit_multiplier: 30}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 1, unit_multiplier: 10, algorithm: token_bucket, burst: 2}
`

// TestShouldRateLimit_SlidingWindowAndMultiplier: a sliding window does not
// reset at the minute (2 per minute in buckets of 7.5 s), and a rule's
// unit_multiplier reaches current_limit.
func TestShouldRateLimit_SlidingWindowAndMultiplier(t *testing.T) {
	p := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte(slidingLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	table, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clock := storetest.NewClock(t0)
	lim := limiter.New(tables{table}, memory.New(memory.Options{}), limiter.Options{Clock: clock})
	rls := rlspb.NewRateLimitServiceClient(serveLoopback(t, server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{})))
	steps := []struct {
		name    string
		advance time.Duration
		in      *rlspb.RateLimitRequest
		want    *resp
	}{
		{"first, late in a minute", 50 * time.Second, req(0, d("sliding", "a")), overall(ok, st(ok, "rolling", 2, minute, 1, 63*time.Second))},
		{"second, next minute", 10 * time.Second, req(0, d("sliding", "a")), overall(ok, st(ok, "rolling", 2, minute, 0, 53*time.Second))},
		{"third: a fixed window would allow it", 10 * time.Second, req(0, d("sliding", "a")), overall(over, st(over, "rolling", 2, minute, 0, 43*time.Second))},
		{"the first hit's bucket has left", 42500 * time.Millisecond, req(0, d("sliding", "a")), overall(ok, st(ok, "rolling", 2, minute, 0, 15*time.Second))},
		{"30 s window", 0, req(0, d("half_minute", "a")), overall(ok, withMultiplier(st(ok, "", 1, second, 0, 8*time.Second), 30))},
		{"30 s window full", 0, req(0, d("half_minute", "a")), overall(over, withMultiplier(st(over, "", 1, second, 0, 8*time.Second), 30))},
		{"30 s window turns", 7500 * time.Millisecond, req(0, d("half_minute", "a")), overall(ok, withMultiplier(st(ok, "", 1, second, 0, 30*time.Second), 30))},
		{"bucket refills a token per 10 minutes", 0, req(2, d("bucket", "a")), overall(ok, withMultiplier(st(ok, "", 1, minute, 0, 20*time.Minute), 10))},
		{"bucket empty", 9 * time.Minute, req(0, d("bucket", "a")), overall(over, withMultiplier(st(over, "", 1, minute, 0, 11*time.Minute), 10))},
		{"bucket refilled one", time.Minute, req(0, d("bucket", "a")), overall(ok, withMultiplier(st(ok, "", 1, minute, 0, 20*time.Minute), 10))},
	}
	for _, s := range steps {
		clock.Advance(s.advance)
		got, err := rls.ShouldRateLimit(ctx(t), s.in)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if !proto.Equal(got, s.want) {
			t.Errorf("%s:\n got %s\nwant %s", s.name, protojson.Format(got), protojson.Format(s.want))
		}
	}
}
