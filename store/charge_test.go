package store

import (
	"math"
	"testing"
	"time"
)

// op is one hit of a table: at an instant, a mode and a cost, the
// decision wanted.
type op struct {
	name string
	at   time.Duration // since t0
	mode Mode
	cost uint64
	want Decision
}

// runOps walks ops through Apply from the fresh state, naming the op in
// failures, and returns the final state.
func runOps(t *testing.T, r *Rule, ops []op) State {
	t.Helper()
	var s State
	for i, o := range ops {
		var d Decision
		s, d = Apply(s, r, t0+int64(o.at), o.cost, o.mode)
		if d != o.want {
			t.Errorf("op %d %q: %v %d at t0+%v = %+v, want %+v", i, o.name, o.mode, o.cost, o.at, d, o.want)
		}
	}
	return s
}

// The scenario: a budget of 100 per minute, a peek before each
// request and the usage charged after it. Once overspent, every peek is
// denied until the window ends.
func TestCharge_FixedWindowOverspent(t *testing.T) {
	r := mustWindow(t, 100, time.Minute)
	const m = time.Minute
	runOps(t, r, []op{
		{"peek on a fresh budget", 0, ModeTake, 0, ok(100, 100, m)},
		{"charge 80", time.Second, ModeCharge, 80, ok(100, 20, m-time.Second)},
		{"peek: 20 left", 2 * time.Second, ModeTake, 0, ok(100, 20, m-2*time.Second)},
		{"charge 150: recorded whole", 3 * time.Second, ModeCharge, 150, deny(100, 0, m-3*time.Second, m-3*time.Second)},
		{"peek: overspent", 4 * time.Second, ModeTake, 0, deny(100, 0, m-4*time.Second, m-4*time.Second)},
		{"a plain request of 1 is denied", 5 * time.Second, ModeTake, 1, deny(100, 0, m-5*time.Second, m-5*time.Second)},
		{"refund 100 of the 230: still past the limit", 6 * time.Second, ModeRefund, 100, ok(100, 0, m-6*time.Second)},
		{"peek: still overspent", 7 * time.Second, ModeTake, 0, deny(100, 0, m-7*time.Second, m-7*time.Second)},
		{"refund 40: 90 counted", 8 * time.Second, ModeRefund, 40, ok(100, 10, m-8*time.Second)},
		{"peek: 10 left", 8 * time.Second, ModeTake, 0, ok(100, 10, m-8*time.Second)},
		{"last nanosecond of the window", m - 1, ModeCharge, 1000, deny(100, 0, 1, 1)},
		{"peek in the next window", m, ModeTake, 0, ok(100, 100, m)},
	})
}

// A peek exactly at the limit is allowed by default, as the reference
// allows it (used + 0 is not over the limit), with nothing remaining;
// under PeekStrict it asks whether one more unit fits: it does not. One
// unit past the limit, both deny. A peek never changes the state.
func TestCharge_PeekAtTheLimit(t *testing.T) {
	for _, r := range []*Rule{mustWindow(t, 5, time.Minute), mustSliding(t, 5, time.Minute), mustBucket(t, 5, time.Minute, 5)} {
		t.Run(r.Algorithm().String(), func(t *testing.T) {
			s, d := Apply(State{}, r, t0, 5, ModeCharge)
			if !d.Allowed || d.Remaining != 0 {
				t.Fatalf("charge 5 of 5: %+v", d)
			}
			for _, mode := range []Mode{ModeTake, ModeSaturate, ModeCharge} {
				within := Hit{Rule: r, Mode: mode}
				strict := Hit{Rule: r, Mode: mode, Peek: PeekStrict}
				if s2, d := within.Apply(s, t0); d != View(s, r, t0) || d.Remaining != 0 || s2 != s {
					t.Fatalf("%v peek at the limit: %+v, want allowed with nothing left", mode, d)
				}
				if s2, d := strict.Apply(s, t0); d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || s2 != s {
					t.Fatalf("%v strict peek at the limit: %+v, want denied with a retry", mode, d)
				}
				if d := strict.Check(s, t0); d.Allowed {
					t.Fatalf("%v strict peek in a denied batch: %+v", mode, d)
				}
				if d := within.Check(s, t0); !d.Allowed {
					t.Fatalf("%v peek in a denied batch: %+v", mode, d)
				}
			}
			over, _ := Apply(s, r, t0, 1, ModeCharge)
			for _, p := range []Peek{PeekWithin, PeekStrict} {
				h := Hit{Rule: r, Peek: p}
				if s2, d := h.Apply(over, t0); d.Allowed || d.RetryAfter <= 0 || s2 != over {
					t.Fatalf("peek %d one past the limit: %+v, want denied", p, d)
				}
			}
			// A refund of 0 is a refund under either rule.
			if _, d := (&Hit{Rule: r, Mode: ModeRefund, Peek: PeekStrict}).Apply(s, t0); !d.Allowed {
				t.Fatalf("strict refund of 0: %+v", d)
			}
		})
	}
}

// The token-bucket example: 10 per second, burst 10, charged 30
// at once. The 20 past the capacity are debt: peeks are denied until the
// bucket holds a token again, 2.1 s later (the bucket is full again 3 s
// later, and holds one token 0.9 s before that).
func TestCharge_TokenBucketDebt(t *testing.T) {
	r := mustBucket(t, 10, time.Second, 10)
	const tok = 100 * time.Millisecond
	runOps(t, r, []op{
		{"charge 30", 0, ModeCharge, 30, deny(10, 0, 3*time.Second, 21*tok)},
		{"peek at 1 s: past empty until 2 s", time.Second, ModeTake, 0, deny(10, 0, 2*time.Second, time.Second)},
		{"peek 1 ns before empty", 20*tok - 1, ModeTake, 0, deny(10, 0, 10*tok+1, 1)},
		{"peek at 2 s: empty, not past it", 20 * tok, ModeTake, 0, ok(10, 0, 10*tok)},
		{"a request of 1 at 2 s", 2 * time.Second, ModeTake, 1, deny(10, 0, time.Second, tok)},
		{"a request 1 ns before a token", 21*tok - 1, ModeTake, 1, deny(10, 0, 9*tok+1, 1)},
		{"peek at 2.1 s", 21 * tok, ModeTake, 0, ok(10, 1, 9*tok)},
		{"take the token", 21 * tok, ModeTake, 1, ok(10, 0, time.Second)},
		{"3 s later: full", 41 * tok, ModeTake, 0, ok(10, 10, 0)},
	})
	// Admitted usage over time never exceeds the rate: with 31 charged
	// every 3 s and takes polled every 10 ms, the usage when a take is
	// granted stays within the burst plus 10 per second.
	var s State
	used, granted := 0, 0
	for at := time.Duration(0); at < time.Minute; at += 10 * time.Millisecond {
		if at%(3*time.Second) == 0 {
			s, _ = Charge(s, r, t0+int64(at), 31)
			used += 31
		}
		var d Decision
		if s, d = Take(s, r, t0+int64(at), 1); d.Allowed {
			used++
			granted++
			if limit := 10 + int(at/tok); used > limit {
				t.Fatalf("at %v: %d used, over the %d the rate allows", at, used, limit)
			}
		}
	}
	if granted == 0 || granted > 10 {
		t.Fatalf("granted %d in a minute beside 31 charged every 3 s at 10 per second, want 1..10", granted)
	}
}

// A sliding window charged past its limit: the window holds its limit in
// the charge's bucket and the rest is debt, entering as the window slides.
func TestCharge_SlidingWindowDebt(t *testing.T) {
	r := mustSliding(t, 10, time.Second) // 5 buckets of 200 ms
	const b = 200 * time.Millisecond
	runOps(t, r, []op{
		{"take 4 in bucket 0", 0, ModeTake, 4, ok(10, 6, 6*b)},
		{"charge 26 in bucket 1: full and 20 owed", b, ModeCharge, 26, deny(10, 0, 18*b, 18*b)},
		{"peek: debt, until its last part enters", 2 * b, ModeTake, 0, deny(10, 0, 17*b, 11*b)},
		{"bucket 7: 10 of the debt entered", 7 * b, ModeTake, 0, deny(10, 0, 12*b, 6*b)},
		{"a request of 1 waits for the window to free", 7 * b, ModeTake, 1, deny(10, 0, 12*b, 12*b)},
		{"refund 5 of the debt", 8 * b, ModeRefund, 5, ok(10, 0, 5*b)},
		{"bucket 13: the last 5 entered, 5 left", 13 * b, ModeTake, 5, ok(10, 0, 6*b)},
		{"bucket 19: empty", 19 * b, ModeTake, 0, ok(10, 10, 0)},
	})
	runOps(t, r, []op{
		{"charge 35 in bucket 0", 0, ModeCharge, 35, deny(10, 0, 18*b, 18*b)},
		{"refund 30: the window's 10 less 5", b, ModeRefund, 30, ok(10, 5, 5*b)},
		{"a charge of 0 is a check", 2 * b, ModeCharge, 0, ok(10, 5, 4*b)},
	})
}

func TestRefund_NeverBelowEmptyNorAboveCapacity(t *testing.T) {
	w := mustWindow(t, 10, time.Minute)
	runOps(t, w, []op{
		{"refund on a fresh window", 0, ModeRefund, 5, ok(10, 10, time.Minute)},
		{"take 6", 0, ModeTake, 6, ok(10, 4, time.Minute)},
		{"refund 2", 0, ModeRefund, 2, ok(10, 6, time.Minute)},
		{"refund 100: empty, not below", 0, ModeRefund, 100, ok(10, 10, time.Minute)},
		{"take 10", 0, ModeTake, 10, ok(10, 0, time.Minute)},
		{"next window: the refund does not reach back", time.Minute, ModeRefund, 3, ok(10, 10, time.Minute)},
	})
	b := mustBucket(t, 1, time.Second, 10)
	runOps(t, b, []op{
		{"drain", 0, ModeTake, 10, ok(10, 0, 10*time.Second)},
		{"refund 3", 0, ModeRefund, 3, ok(10, 3, 7*time.Second)},
		{"refund 100: full, not above", time.Second, ModeRefund, 100, ok(10, 10, 0)},
		{"charge 25: 15 owed", 2 * time.Second, ModeCharge, 25, deny(10, 0, 25*time.Second, 16*time.Second)},
		{"refund 20: 5 left of the 10", 2 * time.Second, ModeRefund, 20, ok(10, 5, 5*time.Second)},
	})
	s := mustSliding(t, 10, time.Second) // 5 buckets of 200 ms
	const q = 200 * time.Millisecond
	runOps(t, s, []op{
		{"3 in bucket 0", 0, ModeTake, 3, ok(10, 7, 6*q)},
		{"4 in bucket 1", q, ModeTake, 4, ok(10, 3, 5*q)},
		{"refund 5: bucket 0's 3 first, then 2 of bucket 1", 2 * q, ModeRefund, 5, ok(10, 8, 5*q)},
		{"refund 9: empty", 2 * q, ModeRefund, 9, ok(10, 10, 0)},
	})
}

// A count saturated at the narrow bound is no longer exact: refunds and
// rollbacks leave it; it denies until the window ends, as any count past
// the limit would.
func TestCharge_FixedWindowBounds(t *testing.T) {
	r := mustWindow(t, 10, time.Minute)
	s, d := Charge(State{}, r, t0, math.MaxUint64)
	if d.Allowed || windowCount(s, windowEnd(r, uint64(t0))) != MaxFixedWindowLimit+1 || s.High != 0 || s.Word == Tombstone {
		t.Fatalf("charge 2^64-1: %#x %+v, want the count at %d", s, d, uint64(MaxFixedWindowLimit+1))
	}
	if s2, _ := Charge(s, r, t0, 5); s2 != s {
		t.Fatal("a charge moved a saturated count")
	}
	if s2, _ := Refund(s, r, t0, 5); s2 != s {
		t.Fatal("a refund moved a saturated count")
	}
	if s2 := Rollback(s, s, r, t0, 5); s2 != s {
		t.Fatal("a rollback moved a saturated count")
	}
	if _, d := Take(s, r, t0+int64(time.Minute), 0); !d.Allowed || d.Remaining != 10 {
		t.Fatalf("next window: %+v", d)
	}
}

// Token-bucket debt is bounded: a charge of 2^64-1 owes MaxDebt quanta past
// the capacity, and the arithmetic stays exact there and at the end of
// int64 time.
func TestCharge_TokenBucketBounds(t *testing.T) {
	for _, r := range []*Rule{mustBucket(t, 10, time.Second, 10), mustBucket(t, 3, time.Second, MaxLimit), mustBucket(t, 1_000_000_000, time.Second, MaxLimit)} {
		for _, now := range []int64{t0, math.MaxInt64 - int64(time.Hour)} {
			s, d := Charge(State{}, r, now, math.MaxUint64)
			_, nowC := quanta(r, uint64(now))
			if d.Allowed || s.Word != nowC+r.tol+MaxDebt || s.Word == Tombstone {
				t.Fatalf("%v at %d: charge 2^64-1 left %#x %+v, want TAT %d", r, now, s, d, nowC+r.tol+MaxDebt)
			}
			if s2, _ := Charge(s, r, now, math.MaxUint64); s2 != s {
				t.Fatalf("%v: charging at the bound moved the TAT", r)
			}
			for _, cost := range []uint64{0, 1, r.burst, r.burst + 1, math.MaxUint64} {
				if s2, d := Take(s, r, now, cost); d.Allowed || s2 != s || d.RetryAfter <= 0 {
					t.Fatalf("%v: take %d at the bound: %+v", r, cost, d)
				}
			}
			if s2, d := Saturate(s, r, now, r.burst); s2 != s || d.Allowed {
				t.Fatalf("%v: saturate at the bound moved the TAT", r)
			}
			if s2, _ := Refund(s, r, now, math.MaxUint64); s2 != (State{}) {
				t.Fatalf("%v: refund of 2^64-1 left %#x, want a full bucket", r, s2)
			}
		}
	}
}

func TestCharge_SlidingDebtBound(t *testing.T) {
	r := mustSliding(t, MaxSlidingWindowLimit, time.Second)
	s, _ := Charge(State{}, r, t0, math.MaxUint64)
	if s.Word&lowMask != maxSlidingDebt || s.Word&debtBit == 0 || s.Word == Tombstone {
		t.Fatalf("charge 2^64-1: %#x, want the debt at its bound", s)
	}
	if s2, _ := Charge(s, r, t0, 7); s2 != s {
		t.Fatal("a charge moved a debt at its bound")
	}
	// 65,537 windows later (each repays the limit) it is repaid.
	later := t0 + int64(2*time.Second)*65_537
	if _, d := Take(s, r, later, 0); !d.Allowed {
		t.Fatalf("after the debt's repayment: %+v", d)
	}
	if _, d := Take(s, r, later-int64(2*time.Second), 1); d.Allowed {
		t.Fatalf("a window before: %+v", d)
	}
}

// Wide rules: limits from 2^32-1 to 2^53 are counted exactly, their
// counts past 32 bits in High.
func TestWide_FixedWindow(t *testing.T) {
	const u32 = math.MaxUint32
	r := mustWindow(t, u32, time.Hour)
	if !r.Wide() || !mustWindow(t, MaxFixedWindowLimit+1, time.Hour).Wide() || mustWindow(t, MaxFixedWindowLimit, time.Hour).Wide() {
		t.Fatal("wide: 2^32-1 and 2^32-2 should be, 2^32-3 not")
	}
	h := time.Hour
	runOps(t, r, []op{
		{"all but one", 0, ModeTake, u32 - 1, ok(u32, 1, h)},
		{"the last one", 0, ModeTake, 1, ok(u32, 0, h)},
		{"one more is denied", 0, ModeTake, 1, deny(u32, 0, h, h)},
		{"peek at the limit", 0, ModeTake, 0, ok(u32, 0, h)},
		{"charge 2^32 past it", 0, ModeCharge, 1 << 32, deny(u32, 0, h, h)},
		{"refund 2^33-1: empty", 0, ModeRefund, 1<<33 - 1, ok(u32, u32, h)},
	})

	// A budget of 10^10 charged in steps of 3×10^9.
	const budget = 10_000_000_000
	r = mustWindow(t, budget, 24*h)
	var s State
	for i, want := range []uint64{budget - 3e9, budget - 6e9, budget - 9e9} {
		var d Decision
		if s, d = Charge(s, r, t0, 3e9); !d.Allowed || d.Remaining != want {
			t.Fatalf("charge %d: %+v, want %d left", i+1, d, want)
		}
	}
	s, d := Charge(s, r, t0, 3e9)
	if d.Allowed || windowCount(s, windowEnd(r, uint64(t0))) != 12e9 {
		t.Fatalf("fourth charge: %+v, count %d, want 1.2×10^10 counted", d, windowCount(s, windowEnd(r, uint64(t0))))
	}
	if _, d = Refund(s, r, t0, 25e8); !d.Allowed || d.Remaining != 5e8 {
		t.Fatalf("refund 2.5×10^9: %+v, want 5×10^8 left", d)
	}

	r = mustWindow(t, MaxLimit, h)
	runOps(t, r, []op{
		{"all of 2^53", 0, ModeTake, MaxLimit, ok(MaxLimit, 0, h)},
		{"charge past it: nothing kept past 2^53", 0, ModeCharge, math.MaxUint64, deny(MaxLimit, 0, h, h)},
		{"the count stays exact", 0, ModeRefund, 1, ok(MaxLimit, 1, h)},
	})
	if _, err := NewFixedWindow(MaxLimit+1, h); err == nil {
		t.Fatal("a limit of 2^53+1 accepted")
	}
}
