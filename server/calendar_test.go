package server_test

import (
	"context"
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
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

const calendarLimits = `
domain: e2e
descriptors:
  - key: budget
    rate_limit: {unit: month, requests_per_unit: 3, calendar: true, time_zone: Europe/Berlin, name: monthly}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 2, calendar: true, time_zone: America/New_York}
`

// TestShouldRateLimit_Calendar: over a real loopback, calendar months and
// days reset at local midnight, and duration_until_reset counts the whole
// seconds to it exactly (rounded up, never 0): February 2024 in Berlin
// ends on Mar 1 at 00:00 +01, March an hour short; New York's Mar 10,
// 2024 is 23 hours long. On the memory store, on Redis and on memcached.
func TestShouldRateLimit_Calendar(t *testing.T) {
	p := filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(p, []byte(calendarLimits), 0o644); err != nil {
		t.Fatal(err)
	}
	table, err := config.Load(p, config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	mc := memcachetest.Start(t)
	for _, c := range []struct {
		name string
		open func(t *testing.T) store.Store
	}{
		{"memory", func(*testing.T) store.Store { return memory.New(memory.Options{}) }},
		{"redis", func(t *testing.T) store.Store {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			s, err := redis.New(ctx, redis.Options{URL: "redis://" + srv.Addr, KeyPrefix: t.Name() + ":", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
		{"memcache", func(t *testing.T) store.Store {
			s, err := memcache.New(context.Background(), memcache.Options{Servers: []string{mc.Addr}, KeyPrefix: t.Name() + ":", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := storetest.NewClock(0)
			lim := limiter.New(tables{table}, c.open(t), limiter.Options{Clock: clock})
			rls := rlspb.NewRateLimitServiceClient(serveLoopback(t, server.NewGRPC(lim, server.NewHealth(), server.GRPCOptions{})))
			const (
				month = rlspb.RateLimitResponse_RateLimit_MONTH
				day   = rlspb.RateLimitResponse_RateLimit_DAY
			)
			for _, s := range []struct {
				name string
				at   string
				in   *rlspb.RateLimitRequest
				want *resp
			}{
				{"Feb 29, 23:59:58.5 +01", "2024-02-29T22:59:58.5Z", req(0, d("budget", "a")), overall(ok, st(ok, "monthly", 3, month, 2, 2*time.Second))},
				{"two more", "2024-02-29T22:59:58.5Z", req(2, d("budget", "a")), overall(ok, st(ok, "monthly", 3, month, 0, 2*time.Second))},
				{"half a second left", "2024-02-29T22:59:59.5Z", req(0, d("budget", "a")), overall(over, st(over, "monthly", 3, month, 0, time.Second))},
				{"Mar 1, 00:00 +01", "2024-02-29T23:00:00Z", req(0, d("budget", "a")), overall(ok, st(ok, "monthly", 3, month, 2, 31*24*time.Hour-time.Hour))},
				{"Mar 31, 23:59:59.999 +02", "2024-03-31T21:59:59.999Z", req(2, d("budget", "a")), overall(ok, st(ok, "monthly", 3, month, 0, time.Second))},
				{"Apr 1, 00:00 +02", "2024-03-31T22:00:00Z", req(0, d("budget", "a")), overall(ok, st(ok, "monthly", 3, month, 2, 30*24*time.Hour))},
				{"Mar 10 in New York is 23 h", "2024-03-10T05:00:00Z", req(2, d("daily", "a")), overall(ok, st(ok, "", 2, day, 0, 23*time.Hour))},
				{"Mar 10, 23:59:59 -04", "2024-03-11T03:59:59Z", req(0, d("daily", "a")), overall(over, st(over, "", 2, day, 0, time.Second))},
				{"Mar 11", "2024-03-11T04:00:00Z", req(0, d("daily", "a")), overall(ok, st(ok, "", 2, day, 1, 24*time.Hour))},
			} {
				ts, err := time.Parse(time.RFC3339Nano, s.at)
				if err != nil {
					t.Fatal(err)
				}
				clock.Set(ts.UnixNano())
				got, err := rls.ShouldRateLimit(ctx(t), s.in)
				if err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if !proto.Equal(got, s.want) {
					t.Errorf("%s:\n got %s\nwant %s", s.name, protojson.Format(got), protojson.Format(s.want))
				}
			}
		})
	}
}
