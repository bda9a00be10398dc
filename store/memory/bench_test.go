package memory

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

// The figures these produce on the 2-core CI machine are in docs/STORE.md.

var sink int64

func BenchmarkTimeNow(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		sink += time.Now().UnixNano()
	}
}

func BenchmarkWallClockNow(b *testing.B) {
	c := store.NewWallClock()
	b.ReportAllocs()
	for b.Loop() {
		sink += c.Now()
	}
}

// rules that keep granting for the length of a benchmark.
func benchRules(b *testing.B) map[string]*store.Rule {
	return map[string]*store.Rule{
		"fixed_window": storetest.Window(b, store.MaxFixedWindowLimit, time.Hour),
		// A wide rule (a limit past 32 bits): its state is a pair behind a
		// pointer, one allocation per change.
		"fixed_window_wide": storetest.Window(b, store.MaxLimit, time.Hour),
		"token_bucket":      storetest.Bucket(b, 1_000_000_000, time.Second, 1<<32),
	}
}

// BenchmarkTake is one existing key, uncontended, with and without the
// clock read.
func BenchmarkTake(b *testing.B) {
	for name, r := range benchRules(b) {
		for _, withClock := range []bool{false, true} {
			n := name
			if withClock {
				n += "+clock"
			}
			b.Run(n, func(b *testing.B) {
				s := New(Options{})
				c := store.NewWallClock()
				ctx := context.Background()
				hits := []store.Hit{{Key: "domain|path_value|minute|fw", Rule: r, Cost: 1, Veto: true}}
				out := make([]store.Decision, 1)
				now := c.Now()
				s.Take(ctx, now, hits, out)
				b.ReportAllocs()
				for b.Loop() {
					if withClock {
						now = c.Now()
					}
					s.Take(ctx, now, hits, out)
				}
				if !out[0].Allowed {
					b.Fatal("denied: the benchmark measures the wrong path")
				}
			})
		}
	}
}

// BenchmarkTakeSliding compares a take on an existing sliding-window key
// with one on a fixed window, uncontended, the clock read included. Each
// take moves now by step, so that the window keeps granting (and with 8
// buckets every take moves the state to a later bucket, the dearest case).
func BenchmarkTakeSliding(b *testing.B) {
	for _, c := range []struct {
		name string
		r    *store.Rule
		step time.Duration
	}{
		{"fixed_window", storetest.Window(b, store.MaxFixedWindowLimit, time.Hour), 40 * time.Microsecond},
		{"sliding_window/1_bucket", storetest.Sliding(b, store.MaxSlidingWindowLimit, time.Second), 40 * time.Microsecond},
		{"sliding_window/2_buckets", storetest.Sliding(b, 1000, time.Minute), 150 * time.Millisecond},
		{"sliding_window/8_buckets", storetest.Sliding(b, 7, time.Second), 175 * time.Millisecond},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := New(Options{})
			clock := store.NewWallClock()
			ctx := context.Background()
			hits := []store.Hit{{Key: "domain|path_value|sw:7/1s", Rule: c.r, Cost: 1, Veto: true}}
			out := make([]store.Decision, 1)
			now := clock.Now()
			s.Take(ctx, now, hits, out)
			b.ReportAllocs()
			for b.Loop() {
				now += int64(c.step) + clock.Now()&1 // (the clock read, as a server pays it)
				s.Take(ctx, now, hits, out)
				if !out[0].Allowed {
					b.Fatal("denied: the benchmark measures the wrong path")
				}
			}
		})
	}
}

// BenchmarkTakeParallel takes under RunParallel, with and without the
// clock read: all callers on one key, each on its own key, and spread
// over a million keys.
func BenchmarkTakeParallel(b *testing.B) {
	r := storetest.Bucket(b, 1_000_000_000, time.Second, 1<<32)
	c := store.NewWallClock()
	ctx := context.Background()
	run := func(b *testing.B, s *Store, withClock bool, key func(worker, i int) string) {
		var workers atomic.Int64
		now := c.Now()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			w := int(workers.Add(1))
			hits := []store.Hit{{Rule: r, Cost: 1, Veto: true}}
			out := make([]store.Decision, 1)
			for i := 0; pb.Next(); i++ {
				hits[0].Key = key(w, i)
				if withClock {
					s.Take(ctx, c.Now(), hits, out)
				} else {
					s.Take(ctx, now, hits, out)
				}
			}
		})
	}
	workerKeys := make([]string, 64)
	for i := range workerKeys {
		workerKeys[i] = fmt.Sprint("worker", i)
	}
	const n = 1 << 20
	var million *Store
	var millionKeys []string
	for _, withClock := range []bool{false, true} {
		suffix := ""
		if withClock {
			suffix = "+clock"
		}
		b.Run("one_key"+suffix, func(b *testing.B) {
			run(b, New(Options{}), withClock, func(int, int) string { return "one" })
		})
		b.Run("distinct_keys"+suffix, func(b *testing.B) {
			run(b, New(Options{}), withClock, func(w, _ int) string { return workerKeys[w%len(workerKeys)] })
		})
		b.Run("1M_keys"+suffix, func(b *testing.B) {
			if million == nil {
				millionKeys = make([]string, n)
				million = New(Options{})
				out := make([]store.Decision, 1)
				for i := range millionKeys {
					millionKeys[i] = fmt.Sprintf("domain|path_%016d|minute", i)
					million.Take(ctx, c.Now(), []store.Hit{{Key: millionKeys[i], Rule: r, Cost: 1, Veto: true}}, out)
				}
				b.ResetTimer()
			}
			run(b, million, withClock, func(w, i int) string { return millionKeys[(uint(i)*2654435761+uint(w)*40503)%n] })
		})
	}
}

// BenchmarkMemoryPerKey reports the heap held per idle key at a million
// keys, beyond the key string itself (32 bytes here, a size class).
func BenchmarkMemoryPerKey(b *testing.B) {
	r := storetest.Bucket(b, 1, time.Second, 10)
	const n = 1 << 20
	ctx := context.Background()
	for b.Loop() {
		keys := make([]string, n)
		for i := range keys {
			keys[i] = fmt.Sprintf("domain|path|v_%014d|min", i)
		}
		var m0, m1 runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&m0)
		s := New(Options{})
		hits := make([]store.Hit, 1)
		out := make([]store.Decision, 1)
		for i := range keys {
			hits[0] = store.Hit{Key: keys[i], Rule: r, Cost: 1, Veto: true}
			s.Take(ctx, t0, hits, out)
		}
		runtime.GC()
		runtime.ReadMemStats(&m1)
		if s.Len() != n || len(keys[0]) != 32 {
			b.Fatalf("%d keys of %d bytes", s.Len(), len(keys[0]))
		}
		perKey := float64(m1.HeapAlloc-m0.HeapAlloc) / n
		b.ReportMetric(perKey, "B/key")
		b.ReportMetric(perKey-32, "B/key-beyond-string")
		runtime.KeepAlive(s)
	}
}
