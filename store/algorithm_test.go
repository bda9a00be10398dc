package store

import (
	"math"
	"testing"
	"time"
)

// step is one Take of a step table: at an instant, a cost, the decision
// wanted.
type step struct {
	name string
	at   time.Duration // since the table's t0
	cost uint64
	want Decision
}

// runSteps walks steps through Take from the fresh state, naming the step
// in failures, and returns the final state.
func runSteps(t *testing.T, r *Rule, t0 int64, steps []step) State {
	t.Helper()
	var s State
	for i, st := range steps {
		var d Decision
		s, d = Take(s, r, t0+int64(st.at), st.cost)
		if d != st.want {
			t.Errorf("step %d %q: Take(t0+%v, %d) = %+v, want %+v", i, st.name, st.at, st.cost, d, st.want)
		}
	}
	return s
}

func mustWindow(t testing.TB, limit uint64, w time.Duration) *Rule {
	t.Helper()
	r, err := NewFixedWindow(limit, w)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustBucket(t testing.TB, rate uint64, per time.Duration, burst uint64) *Rule {
	t.Helper()
	r, err := NewTokenBucket(rate, per, burst)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func ok(limit, remaining uint64, reset time.Duration) Decision {
	return Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func deny(limit, remaining uint64, reset, retry time.Duration) Decision {
	return Decision{Limit: limit, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

// t0 is a day boundary: 2023-11-14T00:00:00Z.
const t0 = int64(1_699_920_000) * int64(time.Second)

func TestFixedWindow_ResetsAtBoundary(t *testing.T) {
	r := mustWindow(t, 10, time.Minute)
	var steps []step
	for i := range 10 {
		steps = append(steps, step{"fill", 5 * time.Second, 1, ok(10, uint64(9-i), 55*time.Second)})
	}
	steps = append(steps,
		step{"eleventh is denied", 5 * time.Second, 1, deny(10, 0, 55*time.Second, 55*time.Second)},
		step{"a check on a full window: at the limit, not past it", 30 * time.Second, 0, ok(10, 0, 30*time.Second)},
		step{"last nanosecond of the window", time.Minute - 1, 1, deny(10, 0, 1, 1)},
		step{"boundary opens a new window", time.Minute, 1, ok(10, 9, time.Minute)},
		step{"two windows later", 3*time.Minute + 500*time.Millisecond, 4, ok(10, 6, 59*time.Second+500*time.Millisecond)},
	)
	runSteps(t, r, t0, steps)
}

func TestFixedWindow_DeniedConsumesNothing(t *testing.T) {
	r := mustWindow(t, 10, time.Second)
	runSteps(t, r, t0, []step{
		{"cost over the limit", 0, 11, deny(10, 10, time.Second, Never)},
		{"take 7", 0, 7, ok(10, 3, time.Second)},
		{"4 does not fit", 0, 4, deny(10, 3, time.Second, time.Second)},
		{"3 still fits", 0, 3, ok(10, 0, time.Second)},
		{"cost 0 on an exhausted window: at the limit, allowed", 0, 0, ok(10, 0, time.Second)},
	})
}

// A limit of 0 denies every take; a check passes until a charge counts
// (envoyproxy/ratelimit's "a limit of 0 admits one call"), then is denied
// until the window ends.
func TestFixedWindow_LimitZero(t *testing.T) {
	r := mustWindow(t, 0, time.Hour)
	s := runSteps(t, r, t0, []step{
		{"take", 0, 1, deny(0, 0, time.Hour, Never)},
		{"check", 0, 0, ok(0, 0, time.Hour)},
	})
	if s != (State{}) {
		t.Errorf("state = %#x, want 0", s)
	}
	s, d := Charge(s, r, t0, 3)
	if d != deny(0, 0, time.Hour, Never) || windowCount(s, windowEnd(r, uint64(t0))) != 3 {
		t.Fatalf("charge 3: %#x %+v, want 3 counted", s, d)
	}
	if _, d = Take(s, r, t0+int64(time.Minute), 0); d != deny(0, 0, 59*time.Minute, 59*time.Minute) {
		t.Fatalf("check after the charge: %+v", d)
	}
	if _, d = Take(s, r, t0+int64(time.Hour), 0); d != ok(0, 0, time.Hour) {
		t.Fatalf("check in the next window: %+v", d)
	}
}

func TestFixedWindow_NearIntegerLimits(t *testing.T) {
	const max = MaxFixedWindowLimit
	r := mustWindow(t, max, time.Second)
	runSteps(t, r, t0, []step{
		{"cost 2^64-1", 0, math.MaxUint64, deny(max, max, time.Second, Never)},
		{"cost 2^63", 0, 1 << 63, deny(max, max, time.Second, Never)},
		{"cost limit+1", 0, max + 1, deny(max, max, time.Second, Never)},
		{"cost limit-1", 0, max - 1, ok(max, 1, time.Second)},
		{"cost 2", 0, 2, deny(max, 1, time.Second, time.Second)},
		{"cost 1", 0, 1, ok(max, 0, time.Second)},
		{"next window", time.Second, max, ok(max, 0, time.Second)},
	})
}

// The reset matches envoyproxy/ratelimit's unit - now%unit seconds when
// rounded up, for every unit it knows.
func TestFixedWindow_ResetMatchesReference(t *testing.T) {
	units := []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour,
		7 * 24 * time.Hour, 30 * 24 * time.Hour, 365 * 24 * time.Hour}
	nows := []int64{0, 1, 999_999_999, 1_000_000_000, t0, t0 + 1, t0 + 59_999_999_999, 1_763_800_000_123_456_789}
	for _, u := range units {
		r := mustWindow(t, 5, u)
		unit := int64(u / time.Second)
		for _, now := range nows {
			_, d := Take(State{}, r, now, 1)
			want := unit - (now/1e9)%unit
			got := (int64(d.ResetAfter) + 1e9 - 1) / 1e9
			if got != want || d.ResetAfter <= 0 {
				t.Errorf("unit %v now %d: ResetAfter %v rounds to %ds, want %ds", u, now, d.ResetAfter, got, want)
			}
		}
	}
}

func TestFixedWindow_WeekStartsThursday(t *testing.T) {
	r := mustWindow(t, 1, 7*24*time.Hour)
	// 2026-11-19 is a Thursday: a new week window starts at its midnight.
	thu := time.Date(2026, 11, 19, 0, 0, 0, 0, time.UTC).UnixNano()
	s, d := Take(State{}, r, thu-1, 1)
	if !d.Allowed || d.ResetAfter != 1 {
		t.Fatalf("Wednesday's last ns: %+v", d)
	}
	if _, d = Take(s, r, thu, 1); !d.Allowed || d.ResetAfter != 7*24*time.Hour {
		t.Fatalf("Thursday 00:00: %+v, want allowed in a new week", d)
	}
}

func TestTokenBucket_BurstThenRefill(t *testing.T) {
	r := mustBucket(t, 8, time.Second, 40)
	const tick = 125 * time.Millisecond
	var steps []step
	for i := range 45 {
		if i < 40 {
			steps = append(steps, step{"burst", 0, 1, ok(40, uint64(39-i), time.Duration(i+1)*tick)})
		} else {
			steps = append(steps, step{"over the burst", 0, 1, deny(40, 0, 5*time.Second, tick)})
		}
	}
	steps = append(steps,
		step{"1ns before the first refill", tick - 1, 1, deny(40, 0, 5*time.Second-tick+1, 1)},
		step{"first refill", tick, 1, ok(40, 0, 5*time.Second)},
		step{"two tokens after 250ms", tick + 2*tick, 2, ok(40, 0, 5*time.Second)},
		step{"cost 3 waits for 3 ticks", 3 * tick, 3, deny(40, 0, 5*time.Second, 3*tick)},
		step{"half the bucket later", 3*tick + 20*tick, 3, ok(40, 17, 3*tick+20*tick)},
		step{"full again", 11 * time.Second, 0, ok(40, 40, 0)},
	)
	runSteps(t, r, t0, steps)
}

func TestTokenBucket_Burst45Into40(t *testing.T) {
	r := mustBucket(t, 8, time.Second, 40)
	for _, start := range []int64{0, t0, t0 + 1, t0 + 123_456_789} {
		var s State
		granted := 0
		for range 45 {
			var d Decision
			if s, d = Take(s, r, start, 1); d.Allowed {
				granted++
			}
		}
		if granted != 40 {
			t.Errorf("start %d: granted %d of 45, want 40", start, granted)
		}
	}
}

// Sub-token progress is kept: 8/s polled every 20ms mints a token every
// 125ms, granted at the first poll at or after it.
func TestTokenBucket_Drip(t *testing.T) {
	r := mustBucket(t, 8, time.Second, 8)
	var s State
	for range 8 {
		s, _ = Take(s, r, t0, 1)
	}
	granted := 0
	for at := 20 * time.Millisecond; at <= 10*time.Second; at += 20 * time.Millisecond {
		var d Decision
		s, d = Take(s, r, t0+int64(at), 1)
		want := at/(125*time.Millisecond) > time.Duration(granted)
		if d.Allowed != want {
			t.Fatalf("poll at %v: allowed %v, want %v (granted %d)", at, d.Allowed, want, granted)
		}
		if d.Allowed {
			granted++
		}
	}
	if granted != 80 {
		t.Fatalf("granted %d in 10s, want 80", granted)
	}
}

// 3/s does not divide a second in nanoseconds; the rate is still exact
// and retry-after rounds up.
func TestTokenBucket_RetryAfterExact(t *testing.T) {
	r := mustBucket(t, 3, time.Second, 3)
	runSteps(t, r, 0, []step{
		{"drain", 0, 3, ok(3, 0, time.Second)},
		{"empty", 0, 1, deny(3, 0, time.Second, 333_333_334)},
		{"1ns early", 333_333_333, 1, deny(3, 0, 666_666_667, 1)},
		{"on time", 333_333_334, 1, ok(3, 0, time.Second)},
		{"cost 2 needs two more thirds", 333_333_334, 2, deny(3, 0, time.Second, 666_666_666)},
		{"one second in", time.Second, 1, ok(3, 1, 666_666_667)},
	})
}

// At an instant between two quanta a full bucket still grants its whole
// burst, in one hit or one by one.
func TestTokenBucket_FullBucketBetweenQuanta(t *testing.T) {
	r := mustBucket(t, 3, time.Second, 3)
	at := t0 + 1
	if _, d := Take(State{}, r, at, 3); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("cost 3 on a full bucket at %d: %+v", at, d)
	}
	var s State
	granted := 0
	for range 5 {
		var d Decision
		if s, d = Take(s, r, at, 1); d.Allowed {
			granted++
		}
	}
	// The first take anchors the refill at the next quantum, so the
	// third token of a same-instant run comes one quantum (≈1ns) late.
	if granted != 2 {
		t.Fatalf("granted %d one by one at one instant, want 2", granted)
	}
	if _, d := Take(s, r, at+1, 1); !d.Allowed {
		t.Fatalf("third token 1ns later: %+v", d)
	}
}

func TestTokenBucket_CostOverBurst(t *testing.T) {
	r := mustBucket(t, 1, time.Second, 5)
	s := runSteps(t, r, t0, []step{
		{"cost 6", 0, 6, deny(5, 5, 0, Never)},
		{"cost 2^32", 0, 1 << 32, deny(5, 5, 0, Never)},
		{"cost 2^64-1", 0, math.MaxUint64, deny(5, 5, 0, Never)},
		{"cost 0 check", 0, 0, ok(5, 5, 0)},
		{"cost 5", 0, 5, ok(5, 0, 5*time.Second)},
	})
	if s == (State{}) {
		t.Fatal("state still fresh after an allowed take")
	}
}

func TestTokenBucket_ClockBackwards(t *testing.T) {
	r := mustBucket(t, 1, time.Second, 2)
	runSteps(t, r, t0, []step{
		{"drain at 10s", 10 * time.Second, 2, ok(2, 0, 2*time.Second)},
		{"back to 5s", 5 * time.Second, 1, deny(2, 0, 7*time.Second, 6*time.Second)},
		{"check at 5s waits until the bucket is no longer past empty", 5 * time.Second, 0, deny(2, 0, 7*time.Second, 5*time.Second)},
		{"back before the epoch", time.Duration(-t0) - time.Hour, 1, deny(2, 0, time.Duration(t0)+12*time.Second, time.Duration(t0)+11*time.Second)},
		{"11s", 11 * time.Second, 1, ok(2, 0, 2*time.Second)},
		{"13s", 13 * time.Second, 0, ok(2, 2, 0)},
	})
}

func TestTokenBucket_LongIdle(t *testing.T) {
	r := mustBucket(t, 1, time.Second, 10)
	const fifty = 50 * 24 * time.Hour
	runSteps(t, r, t0, []step{
		{"drain", 0, 10, ok(10, 0, 10*time.Second)},
		{"50 days idle", fifty, 10, ok(10, 0, 10*time.Second)},
		{"100 days idle", 2 * fifty, 1, ok(10, 9, time.Second)},
	})
}

func TestTokenBucket_NearIntegerLimits(t *testing.T) {
	const b32 = 1 << 32
	r := mustBucket(t, 1, time.Second, b32)
	runSteps(t, r, t0, []step{
		{"cost 2^32+1", 0, b32 + 1, deny(b32, b32, 0, Never)},
		{"cost 2^32", 0, b32, ok(b32, 0, b32*time.Second)},
		{"one second later", time.Second, 1, ok(b32, 0, b32*time.Second)},
		{"cost 2 waits 2s", time.Second, 2, deny(b32, 0, b32*time.Second, 2*time.Second)},
	})

	// The largest burst, one quantum per token.
	r = mustBucket(t, 1_000_000_000, time.Second, MaxLimit)
	if _, _, tol := r.Quanta(); tol != MaxLimit {
		t.Fatalf("capacity %d quanta, want 2^53", tol)
	}
	now := int64(math.MaxInt64 - 1<<40)
	s, d := Take(State{}, r, now, MaxLimit)
	if !d.Allowed || d.ResetAfter != MaxLimit || d.Remaining != 0 {
		t.Fatalf("cost 2^53 near the end of int64 time: %+v", d)
	}
	if _, d = Take(s, r, now, 1); d.Allowed || d.RetryAfter != 1 {
		t.Fatalf("empty bucket: %+v", d)
	}

	// A refill so slow that full is more than 292 years away saturates.
	r = mustBucket(t, 1, 365*24*time.Hour, 1000)
	if _, d = Take(State{}, r, t0, 1000); !d.Allowed || d.ResetAfter != Never {
		t.Fatalf("1000-year refill: %+v", d)
	}
}

func TestRollback(t *testing.T) {
	for _, r := range []*Rule{mustWindow(t, 10, time.Minute), mustBucket(t, 10, time.Minute, 10)} {
		t.Run(r.Algorithm().String(), func(t *testing.T) {
			s0, _ := Take(State{}, r, t0, 3)
			s1, d1 := Take(s0, r, t0, 4)
			if !d1.Allowed {
				t.Fatal("take 4 denied")
			}
			other, _ := Take(s1, r, t0, 2)
			back := Rollback(other, s1, r, t0, 4)
			want, _ := Take(s0, r, t0, 2)
			if back != want {
				t.Fatalf("rollback after an interleaved take: %#x, want %#x", back, want)
			}
			if _, d := Take(back, r, t0, 0); d.Remaining != 5 {
				t.Fatalf("remaining after rollback %d, want 5", d.Remaining)
			}
			if got := Rollback(s0, s0, r, t0, 10); !Fresh(got, r, t0) {
				t.Fatalf("over-rollback left %#x, want a fresh state", got)
			}
			if got := Rollback(s1, s1, r, t0, 11); got != s1 {
				t.Fatalf("rollback of a cost over the capacity changed the state %#x → %#x", s1, got)
			}
		})
	}
	// A window that has turned since the take is not rolled back into.
	r := mustWindow(t, 10, time.Second)
	s, _ := Take(State{}, r, t0, 5)
	next, _ := Take(s, r, t0+int64(time.Second), 5)
	if got := Rollback(next, s, r, t0+int64(time.Second), 5); got != next {
		t.Fatalf("rollback into the next window: %#x, want %#x", got, next)
	}
}

func TestSaturate(t *testing.T) {
	w := mustWindow(t, 10, time.Minute)
	s, _ := Take(State{}, w, t0, 7)
	s, d := Saturate(s, w, t0, 5)
	if d.Allowed || d.Remaining != 0 || d.RetryAfter != time.Minute {
		t.Fatalf("window saturate: %+v", d)
	}
	if _, d = Take(s, w, t0, 1); d.Allowed {
		t.Fatal("window not drained")
	}
	if s2, d := Saturate(State{}, w, t0, 4); !d.Allowed || d.Remaining != 6 || s2 == (State{}) {
		t.Fatalf("window saturate that fits: %+v", d)
	}

	b := mustBucket(t, 1, time.Second, 10)
	s, _ = Take(State{}, b, t0, 7)
	s, d = Saturate(s, b, t0, 5)
	if d.Allowed || d.Remaining != 0 || d.ResetAfter != 10*time.Second || d.RetryAfter != 5*time.Second {
		t.Fatalf("bucket saturate: %+v", d)
	}
	s2, d := Saturate(s, b, t0, math.MaxUint64)
	if s2 != s || d.RetryAfter != Never {
		t.Fatalf("saturating an empty bucket: state %#x → %#x, %+v", s, s2, d)
	}
	// Never lowers the TAT of a bucket in debt from a clock that went back.
	if s3, _ := Saturate(s, b, t0-int64(time.Hour), 1); s3 != s {
		t.Fatalf("saturate with a backwards clock moved the state %#x → %#x", s, s3)
	}
}

func TestFresh(t *testing.T) {
	w := mustWindow(t, 10, time.Minute)
	s, _ := Take(State{}, w, t0, 1)
	if Fresh(s, w, t0) || Fresh(s, w, t0+int64(time.Minute)-1) {
		t.Error("window with a count reported fresh inside its window")
	}
	if !Fresh(s, w, t0+int64(time.Minute)) || !Fresh(State{}, w, t0) {
		t.Error("lapsed or zero window not fresh")
	}
	b := mustBucket(t, 3, time.Second, 3)
	s, _ = Take(State{}, b, t0, 1)
	if Fresh(s, b, t0) || Fresh(s, b, t0+333_333_333) {
		t.Error("bucket in debt reported fresh")
	}
	if !Fresh(s, b, t0+333_333_334) {
		t.Error("refilled bucket not fresh")
	}
	for _, r := range []*Rule{w, b} {
		if Fresh(State{Word: Tombstone}, r, math.MaxInt64) {
			t.Errorf("%v: tombstone reported fresh", r)
		}
	}
}

// TestRollback_OwedOnly: a rollback that comes after time has passed
// returns only what the take still owes. The refilled part was there for
// others to take; returning it as well would erase their debt.
func TestRollback_OwedOnly(t *testing.T) {
	r := mustBucket(t, 1, time.Second, 10) // one token per second
	steps := []struct {
		name    string
		refund  int64 // when the rollback runs, seconds after the take
		stacked bool  // another caller took 1 token at the rollback's instant
		want    uint64
	}{
		{"at once, alone", 0, false, 10},
		{"at once, stacked", 0, true, 9},
		{"3 s later, stacked", 3, true, 9},
		{"5 s later, stacked (the take has refilled)", 5, true, 9},
		{"9 s later, alone", 9, false, 10},
	}
	for _, st := range steps {
		after, d := Take(State{}, r, t0, 5)
		if !d.Allowed {
			t.Fatalf("%s: take 5 denied", st.name)
		}
		at := t0 + st.refund*int64(time.Second)
		s := after
		if st.stacked {
			s, _ = Take(s, r, at, 1)
		}
		s = Rollback(s, after, r, at, 5)
		// Without the take, the bucket at `at` holds 10 (less the stacked 1).
		if _, d := Take(s, r, at, 0); d.Remaining != st.want {
			t.Errorf("%s: remaining %d after the rollback, want %d", st.name, d.Remaining, st.want)
		}
	}
}

func TestAllocations(t *testing.T) {
	w := mustWindow(t, 10, time.Minute)
	b := mustBucket(t, 3, time.Second, 3)
	var s State
	if n := testing.AllocsPerRun(100, func() {
		s, _ = Take(s, w, t0, 1)
		s, _ = Take(s, b, t0, 1)
		s = Rollback(s, s, b, t0, 1)
	}); n != 0 {
		t.Fatalf("%v allocations per take", n)
	}
}
