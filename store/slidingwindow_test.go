package store

import (
	"math"
	"math/bits"
	"testing"
	"time"
)

func mustSliding(t testing.TB, limit uint64, w time.Duration) *Rule {
	t.Helper()
	r, err := NewSlidingWindow(limit, w)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestNewSlidingWindow_Layout(t *testing.T) {
	for _, c := range []struct {
		limit  uint64
		window time.Duration
		g      uint64
		bucket time.Duration
	}{
		{0, time.Second, 8, 125 * time.Millisecond},
		{7, time.Second, 8, 125 * time.Millisecond},
		{8, time.Second, 5, 200 * time.Millisecond},
		{8, time.Minute, 6, 10 * time.Second},
		{31, time.Minute, 5, 12 * time.Second},
		{63, time.Hour, 4, 15 * time.Minute},
		{64, time.Second, 2, 500 * time.Millisecond},
		{100, time.Minute, 3, 20 * time.Second},
		{255, 7 * time.Second, 2, 3500 * time.Millisecond},
		{1023, 30 * time.Second, 2, 15 * time.Second},
		{1024, time.Second, 1, time.Second},
		{MaxSlidingWindowLimit, 24 * time.Hour, 1, 24 * time.Hour},
	} {
		r := mustSliding(t, c.limit, c.window)
		if g, b, bits := r.Buckets(); g != c.g || b != c.bucket || (g+1)*bits > 32 || c.limit >= 1<<bits {
			t.Errorf("limit %d per %v: %d buckets of %v, %d bits; want %d of %v", c.limit, c.window, g, b, bits, c.g, c.bucket)
		}
	}
	for _, c := range []struct {
		limit  uint64
		window time.Duration
	}{{10, 0}, {10, 1500 * time.Millisecond}, {MaxSlidingWindowLimit + 1, time.Second}, {1, (math.MaxUint32 + 1) * time.Second}} {
		if _, err := NewSlidingWindow(c.limit, c.window); err == nil {
			t.Errorf("NewSlidingWindow(%d, %v) accepted", c.limit, c.window)
		}
	}
}

// TestSlidingWindow_NoBurstAcrossBoundary: 4 per minute counted in 8
// buckets of 7.5 s. A fixed window would allow 4 at the end of a minute
// and 4 more at the start of the next; the sliding window frees each hit's
// slot when its bucket leaves the window.
func TestSlidingWindow_NoBurstAcrossBoundary(t *testing.T) {
	r := mustSliding(t, 4, time.Minute)
	const b = 7500 * time.Millisecond
	runSteps(t, r, t0, []step{
		{"check on the fresh state", 0, 0, ok(4, 4, 0)},
		{"first hit in bucket 0", 1 * time.Second, 1, ok(4, 3, 9*b-time.Second)},
		{"three more in bucket 1", 10 * time.Second, 3, ok(4, 0, 9*b-10*time.Second)},
		{"denied until bucket 0 leaves", 20 * time.Second, 1, deny(4, 0, 9*b-20*time.Second, 9*b-20*time.Second)},
		{"past the minute still denied", time.Minute + 2*time.Second, 1, deny(4, 0, 9*b-62*time.Second, 9*b-62*time.Second)},
		{"1 ns before bucket 0 leaves", 9*b - 1, 1, deny(4, 0, 1, 1)},
		{"two do not fit before bucket 1 leaves", 9 * b, 2, deny(4, 1, 10*b-9*b, 10*b-9*b)},
		{"bucket 0 has left", 9 * b, 1, ok(4, 0, b)},
		{"one more fits when bucket 1 leaves", 10*b - 1, 1, deny(4, 0, 1, 1)},
		{"a check on the full window: at the limit, allowed", 10*b - 1, 0, ok(4, 0, 1)},
		{"bucket 1 has left", 10 * b, 3, ok(4, 0, 8*b)}, // bucket 9's hit is the oldest now
		{"idle for 50 days", 50 * 24 * time.Hour, 4, ok(4, 0, 9*b)},
	})
}

func TestSlidingWindow_DeniedConsumesNothing(t *testing.T) {
	r := mustSliding(t, 10, time.Second) // 5 buckets of 200 ms
	const b = 200 * time.Millisecond
	runSteps(t, r, t0, []step{
		{"take 6", 0, 6, ok(10, 4, 6*b)},
		{"11 never fits", 0, 11, deny(10, 4, 6*b, Never)},
		{"7 does not fit now", 0, 7, deny(10, 4, 6*b, 6*b)},
		{"4 still fits", 0, 4, ok(10, 0, 6*b)},
	})
}

// A limit of 0 denies every take; a check passes until a charge marks a
// bucket, then is denied until that bucket leaves the window.
func TestSlidingWindow_LimitZero(t *testing.T) {
	r := mustSliding(t, 0, time.Second) // 8 buckets of 125 ms
	const b = 125 * time.Millisecond
	s := runSteps(t, r, t0, []step{
		{"check", 0, 0, ok(0, 0, 0)},
		{"take", time.Second, 1, deny(0, 0, 0, Never)},
	})
	s, d := Charge(s, r, t0+int64(b), 5)
	if d != deny(0, 0, 9*b, Never) {
		t.Fatalf("charge 5 in bucket 1: %+v", d)
	}
	if _, d = Take(s, r, t0+int64(10*b), 0); d != ok(0, 0, 0) {
		t.Fatalf("check once bucket 1 has left: %+v", d)
	}
	runOps(t, r, []op{
		{"charge 5 in bucket 1", b, ModeCharge, 5, deny(0, 0, 9*b, Never)},
		{"check in bucket 2: denied until bucket 1 leaves", 2 * b, ModeTake, 0, deny(0, 0, 8*b, 8*b)},
		{"charge in bucket 3", 3 * b, ModeCharge, 1, deny(0, 0, 7*b, Never)},
		{"bucket 1 has left: bucket 3 still counts", 10 * b, ModeTake, 0, deny(0, 0, 2*b, 2*b)},
		{"refund 1: nothing counted", 10 * b, ModeRefund, 1, ok(0, 0, 0)},
		{"check", 10 * b, ModeTake, 0, ok(0, 0, 0)},
	})
}

func TestSlidingWindow_ClockBackwards(t *testing.T) {
	r := mustSliding(t, 2, time.Second) // 8 buckets of 125 ms
	const b = 125 * time.Millisecond
	runSteps(t, r, t0, []step{
		{"take 1 in bucket 8", 8 * b, 1, ok(2, 1, 9*b)},
		{"clock back 5 s: counts in bucket 8", 8*b - 5*time.Second, 1, ok(2, 0, 9*b+5*time.Second)},
		{"still full", 8*b - 5*time.Second, 1, deny(2, 0, 9*b+5*time.Second, 9*b+5*time.Second)},
		{"both leave together", 17 * b, 2, ok(2, 0, 9*b)},
	})
}

func TestSlidingWindow_WideCounts(t *testing.T) {
	r := mustSliding(t, MaxSlidingWindowLimit, time.Hour) // 1 bucket: 2 of an hour
	runSteps(t, r, t0, []step{
		{"all but one", 30 * time.Minute, MaxSlidingWindowLimit - 1, ok(MaxSlidingWindowLimit, 1, 90*time.Minute)},
		{"the last one, next bucket", 90 * time.Minute, 1, ok(MaxSlidingWindowLimit, 0, 30*time.Minute)},
		{"full until the first bucket leaves", 90 * time.Minute, 2, deny(MaxSlidingWindowLimit, 0, 30*time.Minute, 30*time.Minute)},
		{"room for all but one", 2 * time.Hour, MaxSlidingWindowLimit - 1, ok(MaxSlidingWindowLimit, 0, time.Hour)},
		{"beyond the limit", 2 * time.Hour, math.MaxUint64, deny(MaxSlidingWindowLimit, 0, time.Hour, Never)},
	})
}

func TestSlidingWindow_RefundSaturateFresh(t *testing.T) {
	r := mustSliding(t, 10, time.Second) // 5 buckets of 200 ms
	const b = int64(200 * time.Millisecond)
	s0, _ := Take(State{}, r, t0, 3)
	s1, _ := Take(s0, r, t0+b, 4)
	other, _ := Take(s1, r, t0+2*b, 2)
	if got, want := Rollback(other, s1, r, t0+2*b, 4), func() State { s, _ := Take(s0, r, t0+2*b, 2); return s }(); got != want {
		t.Fatalf("rollback after an interleaved take in a later bucket: %#x, want %#x", got, want)
	}
	if got := Rollback(s1, s1, r, t0, 11); got != s1 {
		t.Fatalf("rollback of a cost over the limit changed the state")
	}
	// A bucket that has left the window is not rolled back into.
	late, _ := Take(s1, r, t0+7*b, 1)
	if got := Rollback(late, s1, r, t0+7*b, 4); got != late {
		t.Fatalf("rollback into a bucket that left: %#x, want %#x", got, late)
	}

	s, d := Saturate(s1, r, t0+b, 5)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != time.Duration(6*b) {
		t.Fatalf("saturate: %+v", d)
	}
	if _, d = Take(s, r, t0+b, 1); d.Allowed {
		t.Fatal("not drained by saturate")
	}

	if Fresh(s1, r, t0+6*b-1) || !Fresh(s1, r, t0+7*b) || !Fresh(State{}, r, t0) {
		t.Error("fresh: wrong around the last bucket's exit")
	}
	if Fresh(s1, r, t0-int64(time.Hour)) {
		t.Error("a state ahead of a backwards clock reported fresh")
	}
	if Fresh(State{Word: Tombstone}, r, math.MaxInt64) {
		t.Error("tombstone reported fresh")
	}
}

// slidingModel is the sliding window without packing: a count per
// absolute bucket index and, once charged past the limit, a debt.
type slidingModel struct {
	r      *Rule
	n      uint64 // newest bucket written (a clock stepping back counts there)
	counts map[uint64]uint64
	// debt > 0: the window holds the limit, all in bucket debtAt, and
	// debt more units wait.
	debt, debtAt uint64
	cal          *oracle // a calendar rule's periods; nil for buckets aligned to the epoch
}

// bucket is the index of the bucket holding t.
func (m *slidingModel) bucket(t uint64) uint64 {
	if m.cal == nil {
		return t / m.r.bucket
	}
	k := m.cal.index(int64(t))
	s, e := m.cal.start(k), m.cal.start(k+1)
	return uint64(k)*m.r.g + (t-uint64(s))*m.r.g/uint64(e-s)
}

// start is when bucket i starts: G equal shares of each calendar period;
// false past 2^64-1 ns.
func (m *slidingModel) start(i uint64) (uint64, bool) {
	if m.cal == nil {
		hi, lo := bits.Mul64(i, m.r.bucket)
		return lo, hi == 0
	}
	k, j := int64(i/m.r.g), i%m.r.g
	s, e := m.cal.start(k), m.cal.start(k+1)
	if e == math.MaxInt64 {
		return 0, false
	}
	return uint64(s) + (j*uint64(e-s)+m.r.g-1)/m.r.g, true
}

// take is apply for a take.
func (m *slidingModel) take(now int64, cost uint64) Decision { return m.apply(now, cost, ModeTake) }

// settle lets the window's slides repay the debt by bucket j.
func (m *slidingModel) settle(j uint64) {
	r := m.r
	if m.debt == 0 || j < m.debtAt+r.g+1 {
		return
	}
	k := (j - m.debtAt) / (r.g + 1)
	if m.debt > k*r.limit {
		m.debt -= k * r.limit
		m.debtAt += k * (r.g + 1)
		return
	}
	k = (m.debt + r.limit - 1) / r.limit
	last := m.debt - (k-1)*r.limit
	m.n = m.debtAt + k*(r.g+1)
	m.counts = map[uint64]uint64{m.n: last}
	m.debt = 0
}

// apply is Apply by the definitions, on unpacked numbers.
func (m *slidingModel) apply(now int64, cost uint64, mode Mode) Decision {
	r := m.r
	t := clampNow(now)
	j := m.bucket(t)
	m.settle(j)
	need := cost
	d := Decision{Limit: r.limit}
	if m.debt > 0 {
		switch mode {
		case ModeCharge:
			m.debt += min(cost, slidingDebtBound(r)-m.debt)
		case ModeRefund:
			if cost < m.debt {
				m.debt -= cost
			} else {
				m.n = m.debtAt
				m.counts = map[uint64]uint64{m.n: r.limit - min(r.limit, cost-m.debt)}
				m.debt = 0
			}
			cost = 0 // given back
		}
	}
	if m.debt > 0 {
		if mode == ModeCharge {
			need = 1 // (a charge reports what a check of the charged state does)
		}
		k := (m.debt + r.limit - 1) / r.limit
		last := m.debt - (k-1)*r.limit
		b0 := m.debtAt + k*(r.g+1)
		at := func(i uint64) time.Duration {
			if at, ok := m.start(i); ok && at-t < uint64(Never) {
				return time.Duration(at - t)
			}
			return Never // (a debt repaid in more than 292 years)
		}
		switch {
		case need > r.limit:
			d.RetryAfter = Never
		case last+need <= r.limit:
			d.RetryAfter = at(b0)
		default:
			d.RetryAfter = at(b0 + r.g + 1)
		}
		d.ResetAfter = at(b0 + r.g + 1)
		if last < r.limit {
			d.ResetAfter = at(b0)
		}
		if mode == ModeRefund {
			d.Allowed, d.RetryAfter = true, 0
		}
		return d
	}
	sum := func(from, to uint64) (s uint64) {
		for i := from; i <= to; i++ {
			s += m.counts[i]
		}
		return s
	}
	n := max(j, m.n)
	used := sum(n-r.g, n)
	fit := used <= r.limit && cost <= r.limit-used
	add := func(x uint64) {
		m.counts[n] += x
		m.n = n
		used += x
	}
	switch {
	case mode == ModeRefund:
		if used > 0 && cost > 0 {
			for i := n - r.g; i <= n; i++ {
				x := min(m.counts[i], cost)
				m.counts[i] -= x
				used -= x
				cost -= x
			}
			m.n = n
		}
	case fit && cost > 0:
		add(cost)
	case fit:
	case mode == ModeCharge && r.limit > 0 && cost > 0:
		m.debt = min(cost-(r.limit-used), slidingDebtBound(r))
		m.debtAt, m.n = n, n
		m.counts = map[uint64]uint64{}
		return m.apply(now, 0, ModeCharge)
	case mode == ModeCharge && cost > 0:
		// A limit of 0 marks now's bucket used.
		used += 1 - m.counts[n]
		m.counts[n], m.n = 1, n
	case mode == ModeSaturate && used < r.limit && cost > 0:
		add(min(cost, r.limit-used))
	}
	if mode == ModeCharge && !fit {
		need = 1 // (a charge reports what a take of one unit of the charged state does)
	}
	switch {
	case fit || mode == ModeRefund:
		d.Allowed = true
	case need > r.limit:
		d.RetryAfter = Never
	default:
		for k := uint64(1); ; k++ {
			if sum(n+k-r.g, n)+need <= r.limit {
				at, _ := m.start(n + k)
				d.RetryAfter = time.Duration(at - t)
				break
			}
		}
	}
	if used < r.limit {
		d.Remaining = r.limit - used
	}
	for i := n - r.g; i <= n; i++ {
		if m.counts[i] > 0 {
			at, _ := m.start(i + r.g + 1)
			d.ResetAfter = time.Duration(at - t)
			break
		}
	}
	return d
}

// FuzzSlidingWindow checks every decision against an unpacked model, and,
// for programs of takes alone, that no window of length T ever admits
// more than the limit: each admitted hit is placed at its instant, or at
// the start of the later bucket it counted in when the clock had stepped
// back, and every window ending at an admitted hit is summed.
func FuzzSlidingWindow(f *testing.F) {
	f.Add(uint64(4), uint8(1), []byte{0, 1, 0, 10, 3, 0, 11, 250, 0, 9, 1, 0, 8, 1, 0})
	f.Add(uint64(10), uint8(0), []byte{8, 6, 0, 0, 11, 0, 8, 4, 1, 14, 5, 0, 14, 5, 0, 11, 250, 0})
	f.Add(uint64(0), uint8(0), []byte{0, 0, 0, 0, 1, 0})
	f.Add(uint64(MaxSlidingWindowLimit), uint8(2), []byte{0, 250, 0, 11, 254, 1, 12, 252, 0})
	f.Add(uint64(1000), uint8(4), []byte{11, 254, 0, 12, 254, 0, 15, 9, 0, 10, 250, 0})
	f.Add(uint64(10), uint8(0), []byte{0, 4, 0, 8, 251, 2, 8, 0, 0, 10, 5, 4, 10, 0, 0, 10, 3, 6, 11, 252, 2, 14, 9, 4, 13, 1, 0})
	f.Add(uint64(7), uint8(1), []byte{0, 3, 0, 10, 250, 2, 14, 0, 0, 12, 251, 2, 12, 2, 4, 13, 0, 0, 10, 6, 6})
	f.Fuzz(func(t *testing.T, limit uint64, window uint8, prog []byte) {
		w := periods[int(window)%len(periods)]
		r, err := NewSlidingWindow(limit, w)
		if err != nil || len(prog) > 3*200 {
			t.Skip() // (the window check is cubic in the program's length)
		}
		m := &slidingModel{r: r, counts: map[uint64]uint64{}}
		now := t0 + int64(limit%1_000_000_007)
		var s State
		type hit struct {
			at   uint64
			cost uint64
		}
		var admitted []hit
		takesOnly := true
		for i := 0; i+2 < len(prog); i += 3 {
			now += int64(steps[prog[i]%byte(len(steps))])
			cost := fuzzCost(prog[i+1], limit)
			mode := opMode(prog[i+2])
			takesOnly = takesOnly && mode == ModeTake
			s0 := s
			var d Decision
			s, d = Apply(s, r, now, cost, mode)
			if want := m.apply(now, cost, mode); d != want {
				t.Fatalf("op %d: %v %d on %#x at %d = %+v, model %+v", i/3, mode, cost, s0, now, d, want)
			}
			if s.High != 0 || s.Word == Tombstone {
				t.Fatalf("op %d: state %#x", i/3, s)
			}
			if mode == ModeTake && !d.Allowed && s != s0 {
				t.Fatalf("op %d: a denial consumed", i/3)
			}
			if mode != ModeTake || !d.Allowed || cost == 0 {
				continue
			}
			if prog[i+2]&1 == 1 {
				s = Rollback(s, s, r, now, cost)
				_, before := TakeSliding(s0, r, now, 0)
				if _, after := TakeSliding(s, r, now, 0); after.Remaining != before.Remaining {
					t.Fatalf("op %d: rollback left remaining %d, before the take %d", i/3, after.Remaining, before.Remaining)
				}
				m.counts[m.n] -= cost
				continue
			}
			if !takesOnly {
				continue
			}
			at, _ := m.start(m.n)
			admitted = append(admitted, hit{max(uint64(now), at), cost})
			for _, x := range admitted {
				var sum uint64
				for _, h := range admitted {
					if h.at <= x.at && h.at+uint64(r.period) > x.at {
						sum += h.cost
					}
				}
				if sum > limit {
					t.Fatalf("op %d: %d admitted in the window of %v ending at %d, limit %d", i/3, sum, r.period, x.at, limit)
				}
			}
		}
	})
}

func TestSlidingWindow_Allocations(t *testing.T) {
	r := mustSliding(t, 10, time.Second)
	var s State
	if n := testing.AllocsPerRun(100, func() {
		s, _ = Take(s, r, t0, 1)
		s = Rollback(s, s, r, t0, 1)
	}); n != 0 {
		t.Fatalf("%v allocations per take", n)
	}
}
