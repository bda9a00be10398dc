package quota

import (
	"math"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/store"
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

// flat is claimants whose demand is one value each.
func flat(vs ...float64) []store.Demand {
	ds := make([]store.Demand, len(vs))
	for i, v := range vs {
		ds[i] = store.Demand{Low: v, Mean: v, Peak: v}
	}
	return ds
}

func TestDemandOf(t *testing.T) {
	inf := math.Inf(1)
	cases := []struct {
		samples []float64
		want    store.Demand
	}{
		{[]float64{160, 10, 10, 10}, store.Demand{Low: 10, Mean: 47.5, Peak: 160}},
		{[]float64{40}, store.Demand{Low: 40, Mean: 40, Peak: 40}},
		{[]float64{-5, math.NaN(), 20}, store.Demand{Low: 0, Mean: 20.0 / 3, Peak: 20}},
		{[]float64{inf}, store.Demand{Low: inf, Mean: inf, Peak: inf}},
		{nil, store.Demand{}},
	}
	for _, c := range cases {
		if got := DemandOf(c.samples); math.Abs(got.Mean-c.want.Mean) > 1e-9 || got.Low != c.want.Low || got.Peak != c.want.Peak {
			t.Errorf("DemandOf(%v) = %+v, want %+v", c.samples, got, c.want)
		}
	}
}

func TestDivider_Shares(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	burst := store.Demand{Low: 10, Mean: 47.5, Peak: 160} // 160 one report in four, 10 in the others
	bursts := make([]store.Demand, 50)
	for i := range bursts {
		bursts[i] = burst
	}
	cases := []struct {
		name                 string
		ds                   []store.Demand
		capacity, most       float64
		want                 []float64
		wantLevel, wantExtra float64
	}{
		// Demands of one value: FairShares.
		{"all over an equal share", flat(100, 200, 300), 90, 360, []float64{30, 30, 30}, 30, 0},
		{"a small one met", flat(10, 200, 300), 90, 360, []float64{10, 40, 40}, 40, 0},
		{"all fit: the rest split", flat(10, 20), 100, 400, []float64{45, 55}, inf, 35},
		{"bad demands count as 0, infinite as the capacity", flat(nan, -5, inf, 10), 30, 120, []float64{0, 0, 20, 10}, 20, 0},
		// Bursts in turn: each holds what is left of 980 for a quarter of
		// them, once the others' 10 are counted: 0.25 s + 0.75 × 10 per
		// claimant, 980 over 50 of them at s = 48.4.
		{"bursts in turn", bursts, 980, 4 * 980, slices.Repeat([]float64{48.4}, 50), 48.4, 0},
		// Held together to at most 2 × 980: the max-min shares of 1960.
		{"bursts, bounded", bursts, 980, 2 * 980, slices.Repeat([]float64{39.2}, 50), 48.4, 0},
		{"bursts, bound 1: the limit", bursts, 980, 980, slices.Repeat([]float64{19.6}, 50), 48.4, 0},
		// Bursts above the capacity use all of it, as often: two of them
		// beside a steady 60 on 100 level at 56.67 (0.25 s + 7.5 each,
		// and 56.67; store/redis's demand.lua is tested on the same).
		{"bursts above the capacity", []store.Demand{burst, burst, {Low: 60, Mean: 60, Peak: 60}}, 100, 400, slices.Repeat([]float64{170.0 / 3}, 3), 170.0 / 3, 0},
		// Means that fit: the peaks plus an equal part of what the means
		// leave, up to the bound.
		{"means fit", []store.Demand{{Low: 0, Mean: 5, Peak: 10}, {Low: 0, Mean: 5, Peak: 10}}, 100, 400, []float64{55, 55}, inf, 45},
		{"means fit, bounded", []store.Demand{{Low: 0, Mean: 5, Peak: 10}, {Low: 0, Mean: 5, Peak: 10}}, 100, 100, []float64{50, 50}, inf, 45},
		{"no capacity", flat(5), 0, 0, []float64{0}, 0, 0},
		{"negative capacity", flat(5), -1, 0, []float64{0}, 0, 0},
		{"no claimants", nil, 10, 10, nil, inf, 0},
	}
	var d Divider
	for _, c := range cases {
		level, extra := d.Level(c.ds, c.capacity)
		if math.Abs(level-c.wantLevel) > 1e-9 && level != c.wantLevel || math.Abs(extra-c.wantExtra) > 1e-9 {
			t.Errorf("%s: Level = %v, %v, want %v, %v", c.name, level, extra, c.wantLevel, c.wantExtra)
		}
		out := make([]float64, len(c.ds))
		d.Shares(c.ds, c.capacity, c.most, out)
		for i := range out {
			if math.Abs(out[i]-c.want[i]) > 1e-9 {
				t.Errorf("%s: Shares = %v, want %v", c.name, out, c.want)
				break
			}
		}
	}
}

// FuzzDivider_Shares checks the invariants of expected-usage shares: the
// expected usages sum to at most the capacity (to it when the means do
// not fit and the bound leaves room), the shares to at most the bound;
// demands of one value get FairShares; no share falls when the capacity
// or the bound grows, or rises when another claimant's lowest or mean
// demand grows.
func FuzzDivider_Shares(f *testing.F) {
	f.Add(uint16(980), uint16(4), uint16(10), uint16(47), uint16(160), uint16(40), uint16(5), uint16(0))
	f.Add(uint16(100), uint16(1), uint16(5), uint16(5), uint16(5), uint16(300), uint16(300), uint16(300))
	f.Add(uint16(0), uint16(2), uint16(0), uint16(0), uint16(0), uint16(1), uint16(2), uint16(3))
	f.Fuzz(func(t *testing.T, c, m, a1, a2, a3, b1, b2, b3 uint16) {
		sorted := func(x, y, z uint16) store.Demand {
			v := []float64{float64(x), float64(y), float64(z)}
			slices.Sort(v)
			return store.Demand{Low: v[0], Mean: v[1], Peak: v[2]}
		}
		ds := []store.Demand{sorted(a1, a2, a3), sorted(b1, b2, b3), sorted(a1, b2, a3), {Low: float64(b1), Mean: float64(b1), Peak: float64(b1)}}
		capacity := float64(c)
		most := capacity * (1 + float64(m%8))
		var d Divider
		shares := make([]float64, len(ds))
		d.Shares(ds, capacity, most, shares)
		var used, sum, means float64
		for i, s := range shares {
			if !(s >= 0) {
				t.Fatalf("Shares(%v, %v, %v) = %v: share %d negative", ds, capacity, most, shares, i)
			}
			used += ExpectedUse(ds[i], s, 0, capacity)
			sum += s
			means += ExpectedUse(ds[i], math.Inf(1), 0, capacity)
		}
		const eps = 1e-9
		if used > capacity*(1+eps)+eps {
			t.Fatalf("Shares(%v, %v, %v) = %v: expected usage %v above the capacity", ds, capacity, most, shares, used)
		}
		if sum > most*(1+eps)+eps {
			t.Fatalf("Shares(%v, %v, %v) = %v: sum %v above the bound", ds, capacity, most, shares, sum)
		}
		if level, _ := d.Level(ds, capacity); means > capacity && most >= float64(len(ds))*level && math.Abs(used-capacity) > 1e-6*capacity {
			t.Fatalf("Shares(%v, %v, %v) = %v: expected usage %v, want the capacity", ds, capacity, most, shares, used)
		}
		// Demands of one value: FairShares.
		vs := []float64{float64(a1), float64(b2), float64(a3), float64(b1)}
		fair := make([]float64, len(vs))
		FairShares(vs, capacity, fair)
		d.Shares(flat(vs...), capacity, most, shares)
		for i := range fair {
			if math.Abs(fair[i]-shares[i]) > 1e-9*max(1, capacity) {
				t.Fatalf("Shares(%v, %v, %v) = %v, want FairShares' %v", vs, capacity, most, shares, fair)
			}
		}
		// Monotone.
		d.Shares(ds, capacity, most, shares)
		more := make([]float64, len(ds))
		d.Shares(ds, capacity+10, most+10, more)
		for i := range more {
			if more[i] < shares[i]*(1-eps)-eps {
				t.Fatalf("Shares(%v) with capacity %v: %v, with %v: %v: share %d fell", ds, capacity, shares, capacity+10, more, i)
			}
		}
		// More of the time at its peak, or a higher lowest: more use of
		// every share. (A higher peak alone, the mean kept, is burstier:
		// less use of a share below it.)
		up := slices.Clone(ds)
		up[0].Mean = min(up[0].Mean+7, up[0].Peak)
		up[0].Low = min(up[0].Low+3, up[0].Mean)
		d.Shares(up, capacity, most, more)
		for i := 1; i < len(more); i++ {
			if more[i] > shares[i]*(1+eps)+eps {
				t.Fatalf("Shares(%v) = %v, with claimant 0 at %+v: %v: share %d rose", ds, shares, up[0], more, i)
			}
		}
	})
}
