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
			Repeat(s, hits, deadline, stop, func(_ time.Time, took time.Duration, err error) bool {
				RaiseTo(&worst, int64(took))
				return err != nil
			})
		})
	}
	wg.Wait()
	return time.Duration(worst.Load())
}

// Repeat takes hits on s again and again until stop closes, each call
// with its own deadline (none if 0), and hands each call's start, how
// long it took and its error to each. After a call for which each
// returns true, it waits a millisecond: a store that fails fast must not
// be spun on.
func Repeat(s store.Store, hits []store.Hit, deadline time.Duration, stop <-chan struct{}, each func(t0 time.Time, took time.Duration, err error) (pause bool)) {
	out := make([]store.Decision, len(hits))
	for {
		select {
		case <-stop:
			return
		default:
		}
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if deadline > 0 {
			ctx, cancel = context.WithTimeout(ctx, deadline)
		}
		t0 := time.Now()
		err := s.Take(ctx, t0.UnixNano(), hits, out)
		took := time.Since(t0)
		cancel()
		if each(t0, took, err) {
			time.Sleep(time.Millisecond)
		}
	}
}

// RaiseTo sets a to v if v is larger.
func RaiseTo(a *atomic.Int64, v int64) {
	for w := a.Load(); v > w && !a.CompareAndSwap(w, v); w = a.Load() {
	}
}
