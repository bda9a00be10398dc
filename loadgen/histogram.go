package loadgen

import (
	"math"
	"math/bits"
)

// Histogram records durations in nanoseconds with a relative error below
// 1/subBuckets (under 0.8%), in the manner of an HDR histogram: values
// below 2*subBuckets are exact, and each power of two above is split into
// subBuckets equal steps. Recording is a few instructions and never
// allocates. A Histogram is not safe for concurrent use; give each worker
// its own and Merge them.
type Histogram struct {
	counts [numBuckets]uint64
	n      uint64
	sum    uint64
	max    int64
}

const (
	subBits    = 7
	subBuckets = 1 << subBits
	// maxShift covers values up to 2^(maxShift+subBits+1) ns, about 2.4
	// hours; longer values are clamped into the last bucket.
	maxShift   = 35
	numBuckets = (maxShift + 2) * subBuckets
)

// bucket returns the index of v's bucket.
func bucket(v int64) int {
	if v < 0 {
		v = 0
	}
	u := uint64(v)
	if u < 2*subBuckets {
		return int(u)
	}
	shift := bits.Len64(u) - subBits - 1 // u>>shift is in [subBuckets, 2*subBuckets)
	if shift > maxShift {
		return numBuckets - 1
	}
	return shift*subBuckets + int(u>>shift)
}

// upper returns the largest value that falls into bucket i.
func upper(i int) int64 {
	if i < 2*subBuckets {
		return int64(i)
	}
	shift := i/subBuckets - 1
	base := uint64(i-shift*subBuckets) << shift // i - shift*subBuckets is u>>shift
	return int64(base + (1 << shift) - 1)
}

// Record adds one value, in nanoseconds.
func (h *Histogram) Record(ns int64) {
	h.counts[bucket(ns)]++
	h.n++
	if ns > 0 {
		h.sum += uint64(ns)
	}
	if ns > h.max {
		h.max = ns
	}
}

// Merge adds o's values to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Max is the largest value recorded, exactly.
func (h *Histogram) Max() int64 { return h.max }

// Mean is the average of the values recorded, or 0 when there are none.
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return float64(h.sum) / float64(h.n)
}

// Quantile returns the value at or below which a fraction q of the values
// fall, as the highest value of its bucket (never above Max). It returns 0
// when the histogram is empty.
func (h *Histogram) Quantile(q float64) int64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(upper(i), h.max)
		}
	}
	return h.max
}
