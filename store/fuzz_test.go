package store

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// Fuzz inputs are a rule's numbers and a program of 3-byte operations:
// a time step, a cost, and a flag byte: bit 0 rolls the hit back if it was
// an allowed take, bits 1-2 choose its mode (opMode).

// opMode is the mode of a fuzz operation's flag byte.
func opMode(flag byte) Mode {
	return [...]Mode{ModeTake, ModeCharge, ModeRefund, ModeSaturate}[flag>>1&3]
}

var steps = [...]time.Duration{0, 0, 1, 7, 999, time.Microsecond, time.Millisecond, 20 * time.Millisecond,
	125 * time.Millisecond, 333_333_333, time.Second, time.Minute, time.Hour, 50 * 24 * time.Hour, -time.Second, -1}

func fuzzCost(b byte, capacity uint64) uint64 {
	switch b {
	case 250:
		return capacity
	case 251:
		return capacity + 1
	case 252:
		return math.MaxUint64
	case 253:
		return 1 << 32
	case 254:
		return capacity / 2
	}
	return uint64(b % 16)
}

var periods = [...]time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour, 3 * time.Second, 7, 1000, 365 * 24 * time.Hour}

func FuzzTokenBucket(f *testing.F) {
	f.Add(uint64(8), uint8(0), uint64(40), []byte{0, 1, 0, 8, 1, 0, 7, 3, 1})
	f.Add(uint64(3), uint8(0), uint64(3), []byte{0, 250, 0, 9, 1, 0, 2, 1, 0, 14, 1, 0})
	f.Add(uint64(1_000_000_000), uint8(0), uint64(MaxLimit), []byte{0, 250, 0, 1, 1, 1, 13, 252, 0})
	f.Add(uint64(10), uint8(0), uint64(10), []byte{0, 3, 2, 0, 251, 2, 6, 0, 0, 10, 1, 0, 0, 5, 4, 10, 1, 0, 11, 252, 2, 0, 252, 4, 13, 250, 6})
	f.Fuzz(func(t *testing.T, rate uint64, period uint8, burst uint64, prog []byte) {
		p := periods[int(period)%len(periods)]
		r, err := NewTokenBucket(rate, p, burst)
		if err != nil {
			t.Skip()
		}
		now := t0 + int64(rate%1_000_000_007)
		earliest, latest := now, now
		var s State
		// used is what the bucket consumed since it was last full by a
		// refund, in quanta: takes and charges add, refunds subtract.
		used := new(big.Int)
		forgiven := false // a charge reached the debt's bound
		for i := 0; i+2 < len(prog); i += 3 {
			now += int64(steps[prog[i]%byte(len(steps))])
			earliest, latest = min(earliest, now), max(latest, now)
			cost := fuzzCost(prog[i+1], burst)
			mode := opMode(prog[i+2])
			s0 := s
			var d Decision
			s, d = Apply(s, r, now, cost, mode)
			nowF, nowC := quanta(r, clampNow(now))
			base := s0.Word
			if base <= nowF {
				base = nowC
			}
			switch mode {
			case ModeTake:
				checkTokenDecision(t, i/3, r, s0, s, now, cost, d)
			case ModeRefund:
				if !d.Allowed || s.Word > s0.Word {
					t.Fatalf("op %d: refund %d: %+v, TAT %d → %d", i/3, cost, d, s0.Word, s.Word)
				}
			default:
				if _, fit := TakeTokens(s0, r, now, cost); fit.Allowed != d.Allowed || s.Word < s0.Word {
					t.Fatalf("op %d: %v %d: %+v, a take %+v; TAT %d → %d", i/3, mode, cost, d, fit, s0.Word, s.Word)
				}
			}
			switch {
			case mode == ModeRefund && s == (State{}) && s0 != (State{}):
				used.SetUint64(0) // full: what the bucket holds starts over
				earliest, latest = now, now
			case mode == ModeRefund:
				used.Sub(used, new(big.Int).SetUint64(s0.Word-s.Word))
			case d.Allowed && prog[i+2]&1 == 1 && mode == ModeTake:
				if s = Rollback(s, s, r, now, cost); s.Word < s0.Word {
					t.Fatalf("op %d: rollback moved the TAT from %d to %d, before the take", i/3, s0.Word, s.Word)
				}
				continue
			case s.Word > s0.Word:
				used.Add(used, new(big.Int).SetUint64(s.Word-base))
			}
			if mode == ModeCharge && s.Word == nowC+r.tol+MaxDebt {
				forgiven = true
			}
			// Whenever a hit is granted, what the bucket consumed is at
			// most its capacity plus the refill over the span of instants
			// used (a clock stepping back included), in exact arithmetic:
			// used×period ≤ tol×period + rk×span. Charges may go past it
			// (that is their debt) but nothing is granted until the refill
			// has caught up.
			lhs := new(big.Int).Mul(used, big.NewInt(int64(p)))
			rhs := new(big.Int).Mul(new(big.Int).SetUint64(r.tol), big.NewInt(int64(p)))
			rhs.Add(rhs, new(big.Int).Mul(new(big.Int).SetUint64(r.rk), big.NewInt(latest-earliest)))
			if d.Allowed && cost > 0 && mode != ModeRefund && !forgiven && lhs.Cmp(rhs) > 0 {
				t.Fatalf("op %d: %v %d granted with %v quanta used in %v at %d per %v, burst %d", i/3, mode, cost, used, time.Duration(latest-earliest), rate, p, burst)
			}
			_, nowC = quanta(r, clampNow(latest))
			if s.Word > nowC+r.tol+MaxDebt || s.Word == Tombstone {
				t.Fatalf("op %d: state %d beyond the capacity %d and the debt bound past now %d", i/3, s.Word, r.tol, nowC)
			}
		}
	})
}

// checkTokenDecision checks one decision against the bucket's own
// definitions: retry-after, remaining and reset-after are exact.
func checkTokenDecision(t *testing.T, op int, r *Rule, s0, s State, now int64, cost uint64, d Decision) {
	t.Helper()
	if s.Word < s0.Word {
		t.Fatalf("op %d: TAT lowered from %d to %d", op, s0, s)
	}
	if d.Allowed != (d.RetryAfter == 0) || d.Limit != r.burst || d.Remaining > r.burst {
		t.Fatalf("op %d: inconsistent %+v", op, d)
	}
	if !d.Allowed {
		if s != s0 {
			t.Fatalf("op %d: a denial consumed", op)
		}
		if (d.RetryAfter == Never) != (cost > r.burst) && d.RetryAfter != Never {
			t.Fatalf("op %d: cost %d burst %d retry %v", op, cost, r.burst, d.RetryAfter)
		}
		if d.RetryAfter != Never && int64(d.RetryAfter) <= math.MaxInt64-now {
			at := now + int64(d.RetryAfter)
			if _, e := TakeTokens(s, r, at, cost); !e.Allowed {
				t.Fatalf("op %d: cost %d denied at retry-after %v: %+v", op, cost, d.RetryAfter, e)
			}
			if _, e := TakeTokens(s, r, at-1, cost); e.Allowed {
				t.Fatalf("op %d: cost %d allowed 1ns before retry-after %v", op, cost, d.RetryAfter)
			}
		}
	}
	if d.Remaining > 0 {
		if _, e := TakeTokens(s, r, now, d.Remaining); !e.Allowed {
			t.Fatalf("op %d: remaining %d not takeable", op, d.Remaining)
		}
	}
	if _, e := TakeTokens(s, r, now, d.Remaining+1); e.Allowed {
		t.Fatalf("op %d: remaining %d but %d takeable", op, d.Remaining, d.Remaining+1)
	}
	// (Instants past 2262 do not fit the int64 nanoseconds of now.)
	if d.ResetAfter != Never && now >= 0 && int64(d.ResetAfter) <= math.MaxInt64-now {
		if !Fresh(s, r, now+int64(d.ResetAfter)) {
			t.Fatalf("op %d: not full after reset-after %v", op, d.ResetAfter)
		}
		if d.ResetAfter > 0 && Fresh(s, r, now+int64(d.ResetAfter)-1) {
			t.Fatalf("op %d: full 1ns before reset-after %v", op, d.ResetAfter)
		}
	}
}

// windowModel is the fixed window without packing: the end (Unix
// seconds) of the window the state holds, 0 for none, and its count.
type windowModel struct {
	r          *Rule
	end, count uint64
}

// apply is Apply by the definitions, on unpacked numbers.
func (m *windowModel) apply(now int64, cost uint64, mode Mode) Decision {
	r, t := m.r, clampNow(now)
	end := windowEnd(r, t)
	if m.end > t/nsPerSec {
		end = m.end
	}
	count := uint64(0)
	if m.end == end {
		count = m.count
	}
	bound := uint64(MaxFixedWindowLimit + 1)
	if r.limit > MaxFixedWindowLimit {
		bound = MaxLimit
	}
	exact := count < bound || bound == r.limit
	fit := count <= r.limit && cost <= r.limit-count
	write := func(c uint64) { m.end, m.count, count = end, c, c }
	switch {
	case fit && cost > 0 && mode != ModeRefund:
		write(count + cost)
	case mode == ModeCharge && !fit && count < bound && cost > 0:
		write(count + min(cost, bound-count))
	case mode == ModeSaturate && !fit && count < r.limit && cost > 0:
		write(count + min(cost, r.limit-count))
	case mode == ModeRefund && count > 0 && exact:
		write(count - min(cost, count))
	}
	d := Decision{Limit: r.limit, ResetAfter: time.Duration(end*nsPerSec - t)}
	if count < r.limit {
		d.Remaining = r.limit - count
	}
	switch {
	case mode == ModeRefund || fit:
		d.Allowed = mode == ModeRefund || fit
	case mode == ModeCharge && r.limit > 0, mode != ModeCharge && cost <= r.limit:
		// (A charge that does not fit reports what a take of one unit
		// of the charged state does.)
		d.RetryAfter = d.ResetAfter
	default:
		d.RetryAfter = Never
	}
	return d
}

func FuzzFixedWindow(f *testing.F) {
	f.Add(uint64(10), uint8(1), []byte{0, 1, 0, 10, 3, 0, 11, 250, 0, 11, 1, 1})
	f.Add(uint64(0), uint8(0), []byte{0, 0, 0, 0, 1, 0})
	f.Add(uint64(MaxFixedWindowLimit), uint8(0), []byte{0, 250, 0, 0, 252, 0, 10, 254, 1})
	f.Add(uint64(100), uint8(1), []byte{0, 0, 0, 8, 254, 2, 8, 251, 2, 8, 0, 0, 8, 253, 4, 8, 250, 6, 11, 3, 0})
	f.Add(uint64(math.MaxUint32), uint8(2), []byte{0, 250, 0, 0, 253, 2, 0, 252, 4, 0, 254, 0, 12, 253, 2, 0, 252, 2, 0, 1, 4})
	f.Add(uint64(10_000_000_000), uint8(3), []byte{0, 253, 2, 0, 253, 2, 0, 254, 2, 0, 253, 4, 0, 250, 6, 13, 1, 1})
	f.Add(uint64(MaxLimit), uint8(0), []byte{0, 250, 0, 0, 252, 2, 0, 1, 4, 10, 251, 6})
	f.Fuzz(func(t *testing.T, limit uint64, window uint8, prog []byte) {
		w := periods[int(window)%len(periods)]
		r, err := NewFixedWindow(limit, w)
		if err != nil {
			t.Skip()
		}
		m := &windowModel{r: r}
		now := t0 + int64(limit%1_000_000_007)
		var s State
		granted := map[uint64]uint64{} // window end → granted by takes
		takesOnly := true              // (charges and refunds move counts too)
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
			end := currentWindow(s, r, clampNow(now))
			if got := windowCount(s, end); got != m.count && m.end == end {
				t.Fatalf("op %d: state %#x counts %d, model %d", i/3, s, got, m.count)
			}
			if !r.wide && (s.High != 0 || s.Word == Tombstone) {
				t.Fatalf("op %d: a narrow rule's state %#x", i/3, s)
			}
			if mode == ModeTake {
				checkWindowDecision(t, i/3, r, s0, s, now, cost, d)
			}
			if mode != ModeTake || !d.Allowed {
				continue
			}
			if prog[i+2]&1 == 1 {
				s = Rollback(s, s, r, now, cost)
				m.count -= min(cost, m.count) // (a count just taken is exact)
				// A take clamped into a later window by a backwards
				// clock is not rolled back (that only denies more).
				nowEnd := windowEnd(r, clampNow(now))
				if _, e := TakeWindow(s, r, now, 0); end == nowEnd && e.Remaining != limit-windowCount(s0, end) {
					t.Fatalf("op %d: rollback left remaining %d, before the take %d", i/3, e.Remaining, limit-windowCount(s0, end))
				}
				continue
			}
			granted[end] += cost
			if takesOnly && granted[end] > limit || windowCount(s, end) > limit {
				t.Fatalf("op %d: window ending %d granted %d, count %d, limit %d", i/3, end, granted[end], windowCount(s, end), limit)
			}
		}
	})
}

func checkWindowDecision(t *testing.T, op int, r *Rule, s0, s State, now int64, cost uint64, d Decision) {
	t.Helper()
	if d.Allowed != (d.RetryAfter == 0) || d.Limit != r.limit || d.Remaining > r.limit {
		t.Fatalf("op %d: inconsistent %+v", op, d)
	}
	if d.ResetAfter <= 0 || d.ResetAfter > r.period && s.Word>>32 <= uint64(now)/nsPerSec+uint64(r.period/time.Second) {
		t.Fatalf("op %d: reset-after %v outside (0, %v]", op, d.ResetAfter, r.period)
	}
	if !d.Allowed {
		if s != s0 {
			t.Fatalf("op %d: a denial consumed", op)
		}
		if (d.RetryAfter == Never) != (cost > r.limit) {
			t.Fatalf("op %d: cost %d limit %d retry %v", op, cost, r.limit, d.RetryAfter)
		}
		if d.RetryAfter != Never {
			at := now + int64(d.RetryAfter)
			if _, e := TakeWindow(s, r, at, cost); !e.Allowed {
				t.Fatalf("op %d: cost %d denied at retry-after %v", op, cost, d.RetryAfter)
			}
			if _, e := TakeWindow(s, r, at-1, cost); e.Allowed {
				t.Fatalf("op %d: cost %d allowed 1ns before retry-after %v", op, cost, d.RetryAfter)
			}
		}
	}
	if d.Remaining > 0 {
		if _, e := TakeWindow(s, r, now, d.Remaining); !e.Allowed {
			t.Fatalf("op %d: remaining %d not takeable", op, d.Remaining)
		}
	}
	if _, e := TakeWindow(s, r, now, d.Remaining+1); e.Allowed {
		t.Fatalf("op %d: remaining %d but %d takeable", op, d.Remaining, d.Remaining+1)
	}
}
