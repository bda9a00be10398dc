package quota

import (
	"cmp"
	"math"
	"slices"
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

// StretchDeadband is how far below capacity the proxies may admit before
// Stretch raises the factor: the noise of one interval's reports.
const StretchDeadband = 0.02

// Stretch returns the factor by which to stretch what a limit's proxies
// hold, from the factor f in force during their last reports, so that
// what some leave unused of their shares goes to the others: the proxies
// that want the limit may change faster than their demand is reported.
// limited is what the proxies recently denied admitted, free what the
// others admitted (requests per period, in their last reports), capacity
// what is divided. When the proxies admitted less than capacity, the
// factor rises, when more it falls: to f × capacity / admitted at least,
// and to the factor that would have admitted capacity if only the limited
// proxies admit in proportion to it, f × (capacity − free) / limited,
// when that goes further (the first step falls short: the free proxies
// do not take more). It rises at most to twice f, and only while some
// proxy is limited, and by more than StretchDeadband of capacity: a
// fleet that admitted nearly capacity keeps its factor. Without a limited
// proxy there is no demand left to meet, and the factor falls halfway
// back to 1. The result is in [1, most] (1 for most ≤ 1, a capacity that
// is not positive and finite, or NaN inputs).
func Stretch(f, free, limited, capacity, most float64) float64 {
	if !(most > 1) || !(capacity > 0) || math.IsInf(capacity, 1) || math.IsNaN(f) || math.IsNaN(free) || math.IsNaN(limited) {
		return 1
	}
	f = min(max(f, 1), most)
	free, limited = max(free, 0), max(limited, 0)
	admitted := free + limited
	var next float64
	switch {
	case !(limited > 0) && admitted < capacity:
		next = 1 + (f-1)/2
	case !(admitted > 0):
		next = 1
	case admitted >= (1-StretchDeadband)*capacity && admitted <= capacity:
		next = f
	case admitted < capacity:
		next = max(f*capacity/admitted, f*(capacity-free)/limited)
	case free >= capacity:
		next = 1
	default:
		next = min(f*capacity/admitted, f*(capacity-free)/limited)
	}
	return min(max(next, 1), 2*f, most)
}
