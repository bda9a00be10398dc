package store

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// exactLog is the exact sliding window: the instants of the hits admitted
// in the last window, oldest first.
type exactLog struct {
	limit  int
	window int64
	at     []int64
}

func (l *exactLog) take(now int64) bool {
	i := 0
	for i < len(l.at) && l.at[i] <= now-l.window {
		i++
	}
	l.at = l.at[i:]
	if len(l.at) >= l.limit {
		return false
	}
	l.at = append(l.at, now)
	return true
}

// BenchmarkSlidingWindowAccuracy measures what the bucketed sliding window
// costs against an exact one (a log of every admitted instant) on the same
// arrivals: vs-exact is the hits it admits per hit the exact window admits
// (never above 1 in total, since it never admits more in any window), for
// each bucket layout and for Poisson arrivals at the limit's rate and at
// twice it, and for bursts of the whole limit at random gaps around the
// window. For comparison, fixed-vs-exact is the same for a fixed window of
// the same size, and fixed-worst the most it admits in one window of
// length T, per limit (the sliding window's is at most 1, which
// FuzzSlidingWindow checks). The figures are in docs/STORE.md.
func BenchmarkSlidingWindowAccuracy(b *testing.B) {
	const window = time.Minute
	for _, limit := range []uint64{5, 20, 50, 100, 500, 5000} {
		r, err := NewSlidingWindow(limit, window)
		if err != nil {
			b.Fatal(err)
		}
		for _, traffic := range []string{"poisson_1x", "poisson_2x", "bursts"} {
			b.Run(fmt.Sprintf("limit_%d_buckets_%d/%s", limit, r.g, traffic), func(b *testing.B) {
				fw, err := NewFixedWindow(limit, window)
				if err != nil {
					b.Fatal(err)
				}
				var ratio, fixedRatio, fixedWorst float64
				for b.Loop() {
					rng := rand.New(rand.NewPCG(limit, 1))
					exact := &exactLog{limit: int(limit), window: int64(window)}
					fixedLog := &exactLog{limit: 1 << 30, window: int64(window)} // what the fixed window admitted
					var s, f State
					now := t0
					var got, want, fixed, worst int
					take := func() {
						var d Decision
						s, d = TakeSliding(s, r, now, 1)
						got += b2i(d.Allowed)
						want += b2i(exact.take(now))
						if f, d = TakeWindow(f, fw, now, 1); d.Allowed {
							fixed++
							fixedLog.take(now)
							worst = max(worst, len(fixedLog.at))
						}
					}
					n := 100_000 // arrivals, or bursts
					if traffic == "bursts" {
						n = 2_000
					}
					for range n {
						switch traffic {
						case "bursts":
							// A whole limit at once, every 0.5 to 2 windows.
							now += int64(window/2) + rng.Int64N(int64(3*window/2))
							for range limit {
								take()
							}
							continue
						case "poisson_1x":
							now += int64(rng.ExpFloat64() * float64(window) / float64(limit))
						case "poisson_2x":
							now += int64(rng.ExpFloat64() * float64(window) / float64(2*limit))
						}
						take()
					}
					ratio = float64(got) / float64(want)
					fixedRatio = float64(fixed) / float64(want)
					fixedWorst = float64(worst) / float64(limit)
				}
				b.ReportMetric(ratio, "vs-exact")
				b.ReportMetric(fixedRatio, "fixed-vs-exact")
				b.ReportMetric(fixedWorst, "fixed-worst")
			})
		}
	}
}

func b2i(v bool) int {
	if v {
		return 1
	}
	return 0
}
