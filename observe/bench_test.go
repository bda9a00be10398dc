package observe_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/storetest"
)

// BenchmarkCheck measures the limiter with the memory store, with and
// without the per-rule metrics: the difference is what metrics cost per
// request (four descriptors, like the multi workload).
func BenchmarkCheck(b *testing.B) {
	const body = `
domain: bench
descriptors:
  - {key: k1, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: k2, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: k3, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: k4, rate_limit: {unit: second, requests_per_unit: 1000000000}}
`
	tab := loadTable(b, body)
	for _, metrics := range []bool{false, true} {
		b.Run("metrics="+strconv.FormatBool(metrics), func(b *testing.B) {
			opts := limiter.Options{Clock: storetest.NewClock(t0)}
			if metrics {
				rules, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{})
				if err != nil {
					b.Fatal(err)
				}
				rules.SetTable(tab)
				opts.Observer = rules
			}
			lim := limiter.New(tables{tab}, memory.New(memory.Options{}), opts)
			var worker atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				v := strconv.FormatInt(worker.Add(1), 10) // keys of its own: no contention on counters' state
				req := &limiter.Request{Domain: "bench", Descriptors: []limiter.Descriptor{
					desc("k1", v), desc("k2", v), desc("k3", v), desc("k4", v)}}
				resp := new(limiter.Response)
				ctx := context.Background()
				for pb.Next() {
					if err := lim.Check(ctx, req, resp); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkObserve is the observer's own cost per descriptor.
func BenchmarkObserve(b *testing.B) {
	rules, err := observe.NewRules(prometheus.NewRegistry(), observe.Options{})
	if err != nil {
		b.Fatal(err)
	}
	tab := loadTable(b, limits)
	rules.SetTable(tab)
	rule, entries := tab.Rules()[0], []config.Entry{{Key: "k", Value: "a"}}
	st := &limiter.Status{Code: limiter.OK, Limited: true, Decision: store.Decision{Allowed: true, Limit: 10, Remaining: 1}}
	b.ReportAllocs()
	for b.Loop() {
		rules.Observe("web", entries, rule, st)
	}
}
