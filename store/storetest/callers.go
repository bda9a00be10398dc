package storetest

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Callers runs a goroutine per key, each taking a cost of 1 on its key,
// keys[g], from rules[g%len(rules)] again and again, every call with its
// own deadline, until stop closes. It returns, once every goroutine has
// ended, how long the slowest call took to answer (what a store's outage
// tests bound). A call that fails waits a millisecond before the next: a
// store that fails fast must not be spun on.
func Callers(s store.Store, keys []string, rules []*store.Rule, deadline time.Duration, stop <-chan struct{}) time.Duration {
	var worst atomic.Int64
	var wg sync.WaitGroup
	for g, key := range keys {
		hits := []store.Hit{{Key: key, Rule: rules[g%len(rules)], Cost: 1, Veto: true}}
		wg.Go(func() {
			out := make([]store.Decision, 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				t0 := time.Now()
				err := s.Take(ctx, t0.UnixNano(), hits, out)
				took := time.Since(t0)
				cancel()
				for w := worst.Load(); int64(took) > w && !worst.CompareAndSwap(w, int64(took)); w = worst.Load() {
				}
				if err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	return time.Duration(worst.Load())
}
