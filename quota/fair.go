package quota

import (
	"cmp"
	"math"
	"slices"

	"github.com/sluicehq/sluice/store"
)

// FairShares divides capacity among claimants max-min fairly and writes
// each one's share to out (len(out) must be len(demands)). A claimant that
// needs less than an equal share of what is left gets its demand; the rest
// is split among the others. Whatever the demands leave over is then split
// equally among all, so a claimant whose demand grows has headroom until
// the next computation. The shares sum to capacity (or less, by rounding)
// and never above it. Negative, NaN or infinite demands count as 0 and a
// non-positive capacity gives every claimant 0. It allocates only for more
// than 64 claimants.
func FairShares(demands []float64, capacity float64, out []float64) {
	n := len(demands)
	if n == 0 {
		return
	}
	if !(capacity > 0) || math.IsInf(capacity, 1) {
		if math.IsInf(capacity, 1) {
			for i := range out[:n] {
				out[i] = capacity
			}
			return
		}
		clear(out[:n])
		return
	}
	var buf [64]int
	idx := buf[:0]
	if n > len(buf) {
		idx = make([]int, 0, n)
	}
	for i := range n {
		idx = append(idx, i)
	}
	d := func(i int) float64 {
		v := demands[i]
		if !(v > 0) || math.IsInf(v, 1) {
			if math.IsInf(v, 1) {
				return capacity
			}
			return 0
		}
		return v
	}
	slices.SortFunc(idx, func(a, b int) int {
		da, db := d(a), d(b)
		switch {
		case da < db:
			return -1
		case da > db:
			return 1
		}
		return a - b
	})
	left := capacity
	for k, i := range idx {
		equal := left / float64(n-k)
		if v := d(i); v <= equal {
			out[i] = v
			left -= v
			continue
		}
		// Everyone from here on wants more than an equal split.
		for _, j := range idx[k:] {
			out[j] = equal
		}
		left = 0
		break
	}
	if left > 0 {
		extra := left / float64(n)
		for i := range out[:n] {
			out[i] += extra
		}
	}
	// Floating-point sums may exceed capacity by an ulp or so: scale down.
	var sum float64
	for _, v := range out[:n] {
		sum += v
	}
	if sum > capacity {
		f := capacity / sum
		for i := range out[:n] {
			out[i] *= f
		}
	}
}

// Whole rounds shares down to whole requests and hands the units lost to
// rounding to the largest remainders, so the whole shares sum to at most
// floor(sum of shares) and each differs from its share by less than one.
func Whole(shares []float64, out []uint64) {
	var sum, whole float64
	for i, s := range shares {
		if !(s > 0) {
			out[i] = 0
			continue
		}
		f := math.Floor(s)
		if f >= math.MaxUint64 {
			out[i] = math.MaxUint64
			continue
		}
		out[i] = uint64(f)
		sum += s
		whole += f
	}
	spare := int(math.Floor(sum+1e-9) - whole)
	if spare <= 0 {
		return
	}
	// The largest remainders first; ties to the lower index.
	var buf [64]int
	idx := buf[:0]
	if len(shares) > len(buf) {
		idx = make([]int, 0, len(shares))
	}
	for i, s := range shares {
		if rem := s - float64(out[i]); rem > 0 && rem < 1 {
			idx = append(idx, i)
		}
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Compare(shares[b]-float64(out[b]), shares[a]-float64(out[a]))
	})
	for _, i := range idx[:min(spare, len(idx))] {
		out[i]++
	}
}

// DemandOf is a claimant's demand as its recent samples show it: their
// lowest, mean and peak. Negative and NaN samples count as 0; no
// samples as a demand of 0.
func DemandOf(samples []float64) store.Demand {
	if len(samples) == 0 {
		return store.Demand{}
	}
	d := store.Demand{Low: math.Inf(1)}
	for _, v := range samples {
		if !(v > 0) {
			v = 0
		}
		d.Low, d.Peak = min(d.Low, v), max(d.Peak, v)
		d.Mean += v / float64(len(samples))
	}
	if math.IsInf(d.Peak, 1) {
		d.Mean = d.Peak
	}
	return d
}

// spread is how Level counts a demand: at its peak a fraction q of the
// time, at its lowest otherwise, so that its mean is kept; then the
// lowest and the peak are clamped to [0, capacity] (a burst above the
// capacity uses at most all of it, as often). Negative and NaN values
// count as 0.
func spread(d store.Demand, capacity float64) (lo, hi, q float64) {
	pos := func(v float64) float64 {
		if !(v > 0) {
			return 0
		}
		return v
	}
	hi = pos(d.Peak)
	lo = min(pos(d.Low), hi)
	m := min(max(pos(d.Mean), lo), hi)
	switch {
	case math.IsInf(hi, 1) && !math.IsInf(m, 1):
		q = 0
	case hi > lo && !math.IsInf(hi, 1):
		q = (m - lo) / (hi - lo)
	default:
		q = 1
	}
	if !(capacity > 0) {
		return 0, 0, q
	}
	return min(lo, capacity), min(hi, capacity), q
}

// Divider computes expected-usage shares (see Shares) with buffers it
// keeps between calls. The zero value is ready; not safe for concurrent
// use.
type Divider struct {
	steps       []levelStep
	peaks, caps []float64
}

// levelStep is a point past which a claimant's expected usage grows by
// weight less per unit of share.
type levelStep struct{ at, weight float64 }

// Level returns the water level of capacity over ds, the claimants'
// recent demands: the share s at which the claimants' expected usages
// of s (see ExpectedUse) sum to capacity. When their means fit, the
// level is +Inf and extra what they leave over per claimant.
//
// A claimant's expected usage of s is q × min(peak, s) + (1 − q) ×
// min(low, s), q the fraction of the time at its peak that keeps its
// mean: of all the ways its demand could have moved between its lowest
// and its peak with that mean, the burstiest, which uses the least of a
// share. A proxy's report straddles two of the windows its share counts
// in, so a burst of one window reads as part burst in two reports: the
// burstiest reading undoes that blur where the reports' own samples
// (the mean of min(d, s) over them) would overstate what the proxy uses
// by up to half. For a claimant whose demand is one value (low = mean =
// peak) it is min(d, s), and the level that of FairShares.
func (d *Divider) Level(ds []store.Demand, capacity float64) (level, extra float64) {
	n := len(ds)
	if n == 0 {
		return math.Inf(1), 0
	}
	if math.IsInf(capacity, 1) {
		return capacity, capacity
	}
	if !(capacity > 0) {
		return 0, 0
	}
	steps := d.steps[:0]
	var means float64
	for _, dm := range ds {
		lo, hi, q := spread(dm, capacity)
		means += q*hi + (1-q)*lo
		steps = append(steps, levelStep{lo, 1 - q}, levelStep{hi, q})
	}
	d.steps = steps
	if means <= capacity {
		return math.Inf(1), (capacity - means) / float64(n)
	}
	slices.SortFunc(steps, func(a, b levelStep) int { return cmp.Compare(a.at, b.at) })
	// Walk the piecewise linear sum of expected usages up the steps:
	// below the lowest, every claimant uses all of s.
	var used, at float64
	slope := float64(n)
	for _, st := range steps {
		next := used + slope*(st.at-at)
		if next >= capacity && slope > 0 {
			return at + (capacity-used)/slope, 0
		}
		used, at = next, st.at
		slope -= st.weight
	}
	// Rounding kept the sum just under capacity: the highest peak.
	return at, 0
}

// ExpectedUse is what a claimant of demand d is expected to use of a
// share at the water level (see Level), plus extra.
func ExpectedUse(d store.Demand, level, extra, capacity float64) float64 {
	lo, hi, q := spread(d, capacity)
	return q*min(hi, level) + (1-q)*min(lo, level) + extra
}

// Shares divides capacity among claimants by what they are expected to
// use of it (see Level), ds their recent demands, and writes each one's
// share to out (len(out) must be len(ds)). A claimant gets the water
// level, or its peak demand if that is lower, so that the expected
// usages sum to capacity: a claimant whose demand comes in bursts holds
// its burst's share, counted as used only as often as it bursts, and
// what the others leave unused between their bursts is given to those
// bursting. When the means fit, each claimant gets its peak plus an
// equal part of what the means leave over, as headroom. The shares sum
// to at most most (the bound on what the claimants may hold together,
// at least capacity to give them all of it): past it, they are the
// max-min fair shares of most over the peaks, whichever is smaller for
// each. For claimants whose demand is one value the shares are
// FairShares(demands, capacity).
func (d *Divider) Shares(ds []store.Demand, capacity, most float64, out []float64) {
	n := len(ds)
	level, extra := d.Level(ds, capacity)
	d.peaks, d.caps = grow(d.peaks, n), grow(d.caps, n)
	for i, dm := range ds {
		// (Up to most for the bound, so that it does not tighten as the
		// capacity grows.)
		_, d.peaks[i], _ = spread(dm, most)
	}
	FairShares(d.peaks, most, d.caps)
	for i, dm := range ds {
		_, peak, _ := spread(dm, capacity)
		out[i] = min(min(level, peak)+extra, d.caps[i])
	}
}
