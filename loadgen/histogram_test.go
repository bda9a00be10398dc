package loadgen

import (
	"math"
	"testing"
)

func TestHistogram_BucketBounds(t *testing.T) {
	for _, v := range []int64{0, 1, 127, 128, 255, 256, 257, 1000, 12345, 999_999, 1 << 30, 1<<43 - 1} {
		i := bucket(v)
		if up := upper(i); up < v {
			t.Errorf("upper(bucket(%d)) = %d, below the value", v, up)
		} else if rel := float64(up-v) / float64(max(v, 1)); rel > 1.0/subBuckets {
			t.Errorf("upper(bucket(%d)) = %d: relative error %.4f over %.4f", v, up, rel, 1.0/subBuckets)
		}
		if i > 0 && upper(i-1) >= v {
			t.Errorf("bucket(%d) = %d but the bucket below reaches %d", v, i, upper(i-1))
		}
	}
	if got := bucket(math.MaxInt64); got != numBuckets-1 {
		t.Errorf("bucket(MaxInt64) = %d, want the last bucket %d", got, numBuckets-1)
	}
	if got := bucket(-5); got != 0 {
		t.Errorf("bucket(-5) = %d, want 0", got)
	}
}

func TestHistogram_Quantiles(t *testing.T) {
	var a, b Histogram
	// 1..10000 µs, split over two histograms and merged.
	for v := int64(1); v <= 10000; v++ {
		h := &a
		if v%2 == 0 {
			h = &b
		}
		h.Record(v * 1000)
	}
	a.Merge(&b)
	if a.Count() != 10000 {
		t.Fatalf("Count = %d, want 10000", a.Count())
	}
	if a.Max() != 10_000_000 {
		t.Errorf("Max = %d, want 10000000", a.Max())
	}
	if got, want := a.Mean(), 5_000_500.0; got != want {
		t.Errorf("Mean = %v, want %v", got, want)
	}
	for _, c := range []struct {
		q    float64
		want int64
	}{{0.5, 5_000_000}, {0.9, 9_000_000}, {0.99, 9_900_000}, {0.999, 9_990_000}, {1, 10_000_000}} {
		got := a.Quantile(c.q)
		if got < c.want || float64(got-c.want) > float64(c.want)/subBuckets {
			t.Errorf("Quantile(%v) = %d, want %d within %.2f%%", c.q, got, c.want, 100.0/subBuckets)
		}
	}
	var empty Histogram
	if empty.Quantile(0.5) != 0 || empty.Mean() != 0 {
		t.Errorf("empty histogram: Quantile = %d, Mean = %v, want 0, 0", empty.Quantile(0.5), empty.Mean())
	}
}

func BenchmarkHistogram_Record(b *testing.B) {
	var h Histogram
	for i := range b.N {
		h.Record(int64(i&0xfffff) * 97)
	}
}
