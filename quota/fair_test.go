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

// TestStretch steps a limit of capacity 980 whose 50 proxies are a
// quarter at 160/s and the rest at 10/s, the busy ones changing every
// interval: at a stretch f the light ones admit 375 and the busy ones
// 245 × f.
func TestStretch(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		name                             string
		f, free, limited, capacity, most float64
		want                             float64
	}{
		{"rises, at most twice", 1, 375, 245, 980, 4, 2},
		{"rises to what would have admitted capacity", 2, 375, 490, 980, 4, 605.0 / 245},
		{"at capacity: stays", 605.0 / 245, 375, 605, 980, 4, 605.0 / 245},
		{"within 2 % below capacity: stays", 1, 400, 570, 980, 4, 1},
		{"just above capacity: falls", 1.5, 400, 590, 980, 4, 1.5 * 580 / 590},
		{"above capacity: falls", 3, 375, 735, 980, 4, 3 * 605.0 / 735},
		{"only the free ones fill it: 1", 3, 1000, 10, 980, 4, 1},
		{"no one limited: halfway back to 1", 3, 500, 0, 980, 4, 2},
		{"bounded by most", 3, 100, 100, 980, 4, 4},
		{"most 1: off", 2, 375, 245, 980, 1, 1},
		{"never below 1", 1, 375, 900, 980, 4, 1},
		{"nothing admitted yet", 1, 0, 0, 980, 4, 1},
		{"NaN", nan, 375, 245, 980, 4, 1},
		{"no capacity", 2, 375, 245, 0, 4, 1},
		{"infinite capacity", 2, 375, 245, math.Inf(1), 4, 1},
	}
	for _, c := range cases {
		if got := Stretch(c.f, c.free, c.limited, c.capacity, c.most); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("%s: Stretch(%v, %v, %v, %v, %v) = %v, want %v", c.name, c.f, c.free, c.limited, c.capacity, c.most, got, c.want)
		}
	}
}

// FuzzStretch: the stretch stays in [1, most], at most doubles, never
// rises when the proxies admitted more than capacity or none was
// limited, and never falls when they admitted less with some limited.
func FuzzStretch(f *testing.F) {
	f.Add(1.0, 375.0, 245.0, 980.0, 4.0)
	f.Add(3.0, 1000.0, 10.0, 980.0, 4.0)
	f.Add(2.0, 0.0, 0.0, 1.0, 100.0)
	f.Fuzz(func(t *testing.T, x, free, limited, capacity, most float64) {
		got := Stretch(x, free, limited, capacity, most)
		if !(got >= 1) || got > max(most, 1) {
			t.Fatalf("Stretch(%v, %v, %v, %v, %v) = %v: outside [1, %v]", x, free, limited, capacity, most, got, most)
		}
		if !(x >= 1 && x <= most && free >= 0 && limited >= 0 && capacity > 0 && !math.IsInf(capacity, 1)) {
			return
		}
		if got > 2*x*(1+1e-12) {
			t.Fatalf("Stretch(%v, %v, %v, %v, %v) = %v: more than doubles", x, free, limited, capacity, most, got)
		}
		admitted := free + limited
		if (admitted > capacity || limited == 0) && got > x*(1+1e-12) {
			t.Fatalf("Stretch(%v, %v, %v, %v, %v) = %v: rises", x, free, limited, capacity, most, got)
		}
		if admitted < capacity && limited > 0 && got < x*(1-1e-12) {
			t.Fatalf("Stretch(%v, %v, %v, %v, %v) = %v: falls", x, free, limited, capacity, most, got)
		}
	})
}
