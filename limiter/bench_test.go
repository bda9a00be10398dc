package limiter_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
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
}

func BenchmarkCheck(b *testing.B) {
	lim := limiter.New(tables{loadTable(b, limits)}, allowStore{}, limiter.Options{})
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
