package quota

import (
	"math"
	"testing"
)

func TestFairShares(t *testing.T) {
	cases := []struct {
		demands  []float64
		capacity float64
		want     []float64
	}{
		// Everyone wants more than an equal share: equal split.
		{[]float64{100, 200, 300}, 90, []float64{30, 30, 30}},
		// A small demand is met; the rest is split among the others.
		{[]float64{10, 200, 300}, 90, []float64{10, 40, 40}},
		// Skewed 10:1 with room for the small ones.
		{[]float64{10, 10, 100}, 60, []float64{10, 10, 40}},
		// Demand below capacity: each gets its demand plus an equal part
		// of what is left.
		{[]float64{10, 20}, 100, []float64{45, 55}},
		{[]float64{0, 0}, 10, []float64{5, 5}},
		// Bad demands count as zero.
		{[]float64{math.NaN(), -5, 100}, 30, []float64{0, 0, 30}},
		{[]float64{math.Inf(1), 10}, 30, []float64{20, 10}},
		{[]float64{5}, 0, []float64{0}},
		{[]float64{5}, -1, []float64{0}},
		{nil, 10, nil},
	}
	for i, c := range cases {
		out := make([]float64, len(c.demands))
		FairShares(c.demands, c.capacity, out)
		for j := range out {
			if math.Abs(out[j]-c.want[j]) > 1e-9 {
				t.Errorf("case %d: FairShares(%v, %v) = %v, want %v", i, c.demands, c.capacity, out, c.want)
				break
			}
		}
	}
}

func TestWhole(t *testing.T) {
	cases := []struct {
		shares []float64
		want   []uint64
	}{
		{[]float64{3.5, 3.5, 3}, []uint64{4, 3, 3}},
		{[]float64{33.3, 33.3, 33.4}, []uint64{33, 33, 34}},
		{[]float64{0.4, 0.4, 0.4}, []uint64{1, 0, 0}},
		{[]float64{0, math.NaN(), 2}, []uint64{0, 0, 2}},
	}
	for i, c := range cases {
		out := make([]uint64, len(c.shares))
		Whole(c.shares, out)
		for j := range out {
			if out[j] != c.want[j] {
				t.Errorf("case %d: Whole(%v) = %v, want %v", i, c.shares, out, c.want)
				break
			}
		}
	}
}

// FuzzFairShares checks the invariants: shares sum to at most the
// capacity; nobody gets less than min(demand, the smallest share given to
// anyone whose demand is not met) (max-min fairness); if the demands fit,
// everyone gets at least its demand; whole shares sum to at most the
// capacity and each is within one of its share.
func FuzzFairShares(f *testing.F) {
	f.Add(uint16(100), uint16(1), uint16(2), uint16(300), uint16(0), uint16(50))
	f.Add(uint16(10), uint16(10), uint16(10), uint16(10), uint16(10), uint16(10))
	f.Add(uint16(0), uint16(5), uint16(5), uint16(5), uint16(5), uint16(5))
	f.Fuzz(func(t *testing.T, c, a, b, d, e, g uint16) {
		demands := []float64{float64(a), float64(b) / 3, float64(d), float64(e), float64(g) * 7}
		capacity := float64(c)
		out := make([]float64, len(demands))
		FairShares(demands, capacity, out)
		var sum, dsum float64
		for i, v := range out {
			if v < 0 {
				t.Fatalf("share %d = %v < 0", i, v)
			}
			sum += v
			dsum += demands[i]
		}
		if sum > capacity*(1+1e-12) {
			t.Fatalf("FairShares(%v, %v) = %v: sum %v above capacity", demands, capacity, out, sum)
		}
		if dsum <= capacity {
			for i := range out {
				if out[i] < demands[i]*(1-1e-9) {
					t.Fatalf("FairShares(%v, %v) = %v: demand %d not met though all fit", demands, capacity, out, i)
				}
			}
		} else {
			// Everyone unmet has the same, largest share; the met ones have less.
			top := 0.0
			for _, v := range out {
				top = max(top, v)
			}
			for i := range out {
				if out[i] < demands[i]*(1-1e-9) && out[i] < top*(1-1e-9) {
					t.Fatalf("FairShares(%v, %v) = %v: %d is unmet with less than the top share", demands, capacity, out, i)
				}
			}
		}
		whole := make([]uint64, len(out))
		Whole(out, whole)
		var wsum uint64
		for i, w := range whole {
			if math.Abs(float64(w)-out[i]) >= 1 {
				t.Fatalf("Whole(%v) = %v: %d more than one off", out, whole, i)
			}
			wsum += w
		}
		if float64(wsum) > capacity {
			t.Fatalf("Whole(%v) = %v: sum %d above capacity %v", out, whole, wsum, capacity)
		}
	})
}
