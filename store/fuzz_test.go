package store

import (
	"math"
	"math/big"
	"testing"
	"time"
)

// Fuzz inputs are a rule's numbers and a program of 3-byte operations:
// a time step, a cost, and a flag byte (bit 0: refund the take if it was
// allowed).

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
	f.Add(uint64(1_000_000_000), uint8(0), uint64(1<<62), []byte{0, 250, 0, 1, 1, 1, 13, 252, 0})
	f.Fuzz(func(t *testing.T, rate uint64, period uint8, burst uint64, prog []byte) {
		p := periods[int(period)%len(periods)]
		r, err := NewTokenBucket(rate, p, burst)
		if err != nil {
			t.Skip()
		}
		now := t0 + int64(rate%1_000_000_007)
		earliest, latest := now, now
		var s uint64
		granted := new(big.Int)
		for i := 0; i+2 < len(prog); i += 3 {
			now += int64(steps[prog[i]%byte(len(steps))])
			earliest, latest = min(earliest, now), max(latest, now)
			cost := fuzzCost(prog[i+1], burst)
			s0 := s
			var d Decision
			s, d = TakeTokens(s, r, now, cost)
			checkTokenDecision(t, i/3, r, s0, s, now, cost, d)
			if d.Allowed {
				if prog[i+2]&1 == 1 {
					if s = Refund(s, s, r, now, cost); s < s0 {
						t.Fatalf("op %d: refund moved the TAT from %d to %d, before the take", i/3, s0, s)
					}
				} else {
					granted.Add(granted, new(big.Int).SetUint64(cost))
				}
			}
			// Granted tokens ≤ burst + rate × elapsed / period over the
			// span of instants used (a clock stepping back included), in
			// exact arithmetic: granted×period ≤ burst×period + rate×span.
			lhs := new(big.Int).Mul(granted, big.NewInt(int64(p)))
			rhs := new(big.Int).Mul(new(big.Int).SetUint64(burst), big.NewInt(int64(p)))
			rhs.Add(rhs, new(big.Int).Mul(new(big.Int).SetUint64(rate), big.NewInt(latest-earliest)))
			if lhs.Cmp(rhs) > 0 {
				t.Fatalf("op %d: granted %v tokens in %v at %d per %v, burst %d", i/3, granted, time.Duration(latest-earliest), rate, p, burst)
			}
			_, nowC := quanta(r, clampNow(latest))
			if s > nowC+r.tol || s == Tombstone {
				t.Fatalf("op %d: state %d beyond the capacity %d past now %d", i/3, s, r.tol, nowC)
			}
		}
	})
}

// checkTokenDecision checks one decision against the bucket's own
// definitions: retry-after, remaining and reset-after are exact.
func checkTokenDecision(t *testing.T, op int, r *Rule, s0, s uint64, now int64, cost uint64, d Decision) {
	t.Helper()
	if s < s0 {
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

func FuzzFixedWindow(f *testing.F) {
	f.Add(uint64(10), uint8(1), []byte{0, 1, 0, 10, 3, 0, 11, 250, 0, 11, 1, 1})
	f.Add(uint64(0), uint8(0), []byte{0, 0, 0, 0, 1, 0})
	f.Add(uint64(MaxFixedWindowLimit), uint8(0), []byte{0, 250, 0, 0, 252, 0, 10, 254, 1})
	f.Fuzz(func(t *testing.T, limit uint64, window uint8, prog []byte) {
		w := periods[int(window)%len(periods)]
		r, err := NewFixedWindow(limit, w)
		if err != nil {
			t.Skip()
		}
		now := t0 + int64(limit%1_000_000_007)
		var s uint64
		granted := map[uint64]uint64{} // window end → granted
		for i := 0; i+2 < len(prog); i += 3 {
			now += int64(steps[prog[i]%byte(len(steps))])
			cost := fuzzCost(prog[i+1], limit)
			s0 := s
			var d Decision
			s, d = TakeWindow(s, r, now, cost)
			end := currentWindow(s, r, clampNow(now))
			checkWindowDecision(t, i/3, r, s0, s, now, cost, d)
			if d.Allowed {
				if prog[i+2]&1 == 1 {
					s = Refund(s, s, r, now, cost)
					// A take clamped into a later window by a backwards
					// clock is not refunded (that only denies more).
					nowEnd := windowEnd(r, clampNow(now))
					if _, e := TakeWindow(s, r, now, 0); end == nowEnd && e.Remaining != limit-windowCount(s0, end) {
						t.Fatalf("op %d: refund left remaining %d, before the take %d", i/3, e.Remaining, limit-windowCount(s0, end))
					}
				} else {
					granted[end] += cost
				}
			}
			if granted[end] > limit || windowCount(s, end) > limit {
				t.Fatalf("op %d: window ending %d granted %d, count %d, limit %d", i/3, end, granted[end], windowCount(s, end), limit)
			}
		}
	})
}

func checkWindowDecision(t *testing.T, op int, r *Rule, s0, s uint64, now int64, cost uint64, d Decision) {
	t.Helper()
	if d.Allowed != (d.RetryAfter == 0) || d.Limit != r.limit || d.Remaining > r.limit {
		t.Fatalf("op %d: inconsistent %+v", op, d)
	}
	if d.ResetAfter <= 0 || d.ResetAfter > r.period && s>>32 <= uint64(now)/nsPerSec+uint64(r.period/time.Second) {
		t.Fatalf("op %d: reset-after %v outside (0, %v]", op, d.ResetAfter, r.period)
	}
	if !d.Allowed {
		if s != s0 {
			t.Fatalf("op %d: a denial consumed", op)
		}
		if (d.RetryAfter == Never) != (cost > r.limit || r.limit == 0) {
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
