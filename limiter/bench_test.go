package limiter_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// allowStore grants every hit without state, so the limiter's own cost
// shows.
type allowStore struct{}

func (allowStore) Take(_ context.Context, _ int64, hits []store.Hit, out []store.Decision) error {
	for i, h := range hits {
		out[i] = store.Decision{Allowed: true, Limit: h.Rule.Capacity(), Remaining: h.Rule.Capacity() - 1}
	}
	return nil
}

func benchRequest() *limiter.Request {
	return &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{
		desc("fw", "client-1"), desc("path", "/api", "method", "GET"), desc("none", "x"),
	}}
}

// TestCheck_NoAllocs pins the limiter's hot path at zero allocations: a
// reused Request and Response, pooled key and hit buffers.
func TestCheck_NoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	lim := limiter.New(tables{loadTable(t, limits)}, allowStore{}, limiter.Options{})
	req, resp := benchRequest(), new(limiter.Response)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := lim.Check(ctx, req, resp); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Check allocates %.1f times per request, want 0", allocs)
	}
	// Several limits per descriptor, with an observer: still none.
	lim = limiter.New(tables{loadTable(t, multiLimits)}, allowStore{}, limiter.Options{Observer: &countObserver{}})
	req = &limiter.Request{Domain: "test", Descriptors: []limiter.Descriptor{desc("user", "u"), desc("both", "x")}}
	allocs = testing.AllocsPerRun(1000, func() {
		if err := lim.Check(ctx, req, resp); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Check with several limits allocates %.1f times per request, want 0", allocs)
	}
	// The reference's keys: none either.
	lim = limiter.New(tables{loadTable(t, limits)}, allowStore{}, limiter.Options{ReferenceKeys: true})
	req = benchRequest()
	allocs = testing.AllocsPerRun(1000, func() {
		if err := lim.Check(ctx, req, resp); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Check with the reference's keys allocates %.1f times per request, want 0", allocs)
	}
}

// countObserver counts observations without retaining anything.
type countObserver struct{ n int }

func (o *countObserver) Observe(string, []config.Entry, *config.Rule, *limiter.Status) { o.n++ }
func (o *countObserver) StoreFailed(string, limiter.FailureMode, error)                {}

const benchLimits = `
domain: bench
descriptors:
  - key: one
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: three
    rate_limits:
      - {unit: second, requests_per_unit: 4000000000}
      - {unit: minute, requests_per_unit: 4000000000}
      - {unit: hour, requests_per_unit: 4000000000}
`

// BenchmarkCheckLimits compares a descriptor with one limit and one with
// three (rate_limits) on the memory store, existing keys, a fixed
// instant: the three-limit rule's target is at most 3× the one-limit one.
func BenchmarkCheckLimits(b *testing.B) {
	for _, key := range []string{"one", "three"} {
		b.Run(key, func(b *testing.B) {
			clock := &fakeClock{}
			clock.now.Store(t0 + int64(time.Millisecond))
			lim := limiter.New(tables{loadTable(b, benchLimits)}, memory.New(memory.Options{}), limiter.Options{Clock: clock})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := &limiter.Request{Domain: "bench", Descriptors: []limiter.Descriptor{desc(key, "client")}}
				resp := new(limiter.Response)
				ctx := context.Background()
				for pb.Next() {
					if err := lim.Check(ctx, req, resp); err != nil || resp.Overall != limiter.OK {
						b.Fatal(err, resp.Overall)
					}
				}
			})
		})
	}
}

func BenchmarkCheck(b *testing.B) { benchCheck(b, limiter.Options{}) }

// BenchmarkCheck_ReferenceKeys is BenchmarkCheck with the reference's keys
// (--key-format reference).
func BenchmarkCheck_ReferenceKeys(b *testing.B) { benchCheck(b, limiter.Options{ReferenceKeys: true}) }

func benchCheck(b *testing.B, opts limiter.Options) {
	lim := limiter.New(tables{loadTable(b, limits)}, allowStore{}, opts)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req, resp := benchRequest(), new(limiter.Response)
		ctx := context.Background()
		for pb.Next() {
			if err := lim.Check(ctx, req, resp); err != nil {
				b.Fatal(err)
			}
		}
	})
}
