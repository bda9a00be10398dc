package split_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/split"
)

// BenchmarkTake measures what the split adds to a request of two hits,
// one of a second and one of an hour (limits no run reaches): over two
// memory stores (the split's own cost), and over a local Redis against
// the same request split over two local Redis. cpu-µs/op is this
// process's CPU per Take (Redis's not included).
func BenchmarkTake(b *testing.B) {
	sec, err := store.NewFixedWindow(store.MaxFixedWindowLimit, time.Second)
	if err != nil {
		b.Fatal(err)
	}
	hour, err := store.NewTokenBucket(1e9, time.Hour, 1e9)
	if err != nil {
		b.Fatal(err)
	}
	openRedis := func(b *testing.B) store.Store {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := redis.New(ctx, redis.Options{URL: "redis://" + redistest.Start(b).Addr})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	route := func(h *store.Hit) bool { return h.Rule.Period() < time.Minute }
	for _, c := range []struct {
		name string
		open func(b *testing.B) store.Store
	}{
		{"memory", func(*testing.B) store.Store { return memory.New(memory.Options{}) }},
		{"memory/split", func(*testing.B) store.Store {
			return split.New(memory.New(memory.Options{}), memory.New(memory.Options{}), route, split.Options{})
		}},
		{"redis", openRedis},
		{"redis/split", func(b *testing.B) store.Store { return split.New(openRedis(b), openRedis(b), route, split.Options{}) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := c.open(b)
			var seq atomic.Int64
			cpu := cputime.Process()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				g := strconv.FormatInt(seq.Add(1), 10)
				hits := []store.Hit{{Key: "s" + g, Rule: sec, Cost: 1, Veto: true}, {Key: "h" + g, Rule: hour, Cost: 1, Veto: true}}
				out := make([]store.Decision, len(hits))
				for pb.Next() {
					if err := s.Take(context.Background(), time.Now().UnixNano(), hits, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}
