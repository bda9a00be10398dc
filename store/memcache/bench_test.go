package memcache

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
)

// BenchmarkTake measures Take on a local memcached: a fixed window is one
// INCR per hit, a token bucket a gets and a cas, by GOMAXPROCS callers or,
// for the c50 cases, 50, each on keys of its own (the contended case
// shares one token bucket among all callers); the ctx cases pass a ctx
// that can end, so each Take runs detached. Every hit is allowed.
// cpu-µs/op is this process's CPU per Take, memcached's not included.
func BenchmarkTake(b *testing.B) {
	srv := memcachetest.Start(b)
	fw := must(store.NewFixedWindow(store.MaxFixedWindowLimit, time.Hour))
	tb := must(store.NewTokenBucket(1e9, time.Second, 1e9))
	for _, c := range []struct {
		name    string
		rules   []*store.Rule
		callers int
		shared  bool
		cancel  bool // a ctx that can end: the Take runs detached
	}{
		{"1hit/fixed_window", []*store.Rule{fw}, 0, false, false},
		{"1hit/token_bucket", []*store.Rule{tb}, 0, false, false},
		{"1hit/token_bucket/shared", []*store.Rule{tb}, 0, true, false},
		{"4hits/fixed_window", []*store.Rule{fw, fw, fw, fw}, 0, false, false},
		{"4hits/mixed", []*store.Rule{fw, tb, fw, tb}, 0, false, false},
		{"1hit/fixed_window/c50", []*store.Rule{fw}, 50, false, false},
		{"1hit/token_bucket/shared/c50", []*store.Rule{tb}, 50, true, false},
		{"1hit/fixed_window/ctx", []*store.Rule{fw}, 0, false, true},
		{"4hits/mixed/ctx", []*store.Rule{fw, tb, fw, tb}, 0, false, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.callers > 0 {
				b.SetParallelism((c.callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			}
			s := open(b, Options{Servers: []string{srv.Addr}, CASAttempts: 1000})
			var seq atomic.Int64
			run := strconv.FormatInt(time.Now().UnixNano(), 10)
			cpu := cputime.Process()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				g := "shared"
				if !c.shared {
					g = strconv.FormatInt(seq.Add(1), 10)
				}
				hits := make([]store.Hit, len(c.rules))
				for i, r := range c.rules {
					hits[i] = store.Hit{Key: "bench/" + run + "/" + g + "/" + strconv.Itoa(i), Rule: r, Cost: 1, Veto: true}
				}
				out := make([]store.Decision, len(hits))
				ctx := context.Background()
				if c.cancel {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					defer cancel()
				}
				for pb.Next() {
					if err := s.Take(ctx, time.Now().UnixNano(), hits, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			b.ReportMetric(float64(s.Stats().CASRetries)/float64(b.N), "cas-retries/op")
		})
	}
}
