// Package storetest is the conformance suite every store.Store passes,
// and a fake clock for tests.
//
// Run(t, newStore) checks exact decisions (to the nanosecond) for every
// algorithm at fixed instants, calendar windows across months of every
// length and changes of daylight-saving time, all-or-nothing batches,
// shadow and saturating hits, checks of cost 0 (peeks) by either rule
// (store.PeekWithin and store.PeekStrict), duplicate keys in a
// batch, charges recorded whole past the limit (overshoot and debt),
// refunds, limits past 32 bits, the bounds of charged states, and
// concurrent takes and charges that must grant exactly the budget and
// lose no charge. A store that implements store.Resetter also gets its
// resets checked for every algorithm and key form; the Reset case skips
// the others.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // the calendar cases' zones, whatever the host has

	"github.com/sluicehq/sluice/store"
)

// Clock is a fake store.Clock that moves only when told. Safe for
// concurrent use.
type Clock struct{ ns atomic.Int64 }

// NewClock returns a Clock reading start (Unix nanoseconds).
func NewClock(start int64) *Clock {
	c := &Clock{}
	c.ns.Store(start)
	return c
}

// Now returns the clock's reading.
func (c *Clock) Now() int64 { return c.ns.Load() }

// Set moves the clock to ns, forwards or backwards.
func (c *Clock) Set(ns int64) { c.ns.Store(ns) }

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// T0 is the suite's reference instant, a day boundary
// (2023-11-14T00:00:00Z), so every window and quantum is aligned on it.
const T0 = int64(1_699_920_000) * int64(time.Second)

// Options size the concurrency cases and name skipped cases. The zero
// value means 16 goroutines of 10,000 takes each against a budget of
// 1,000, and no case skipped.
type Options struct {
	Goroutines int // concurrent callers
	Takes      int // takes per caller
	Budget     int // the limit they contend for; less than Goroutines*Takes
	// Skip names cases the store does not pass, each with the reason
	// (which its docs state); they are reported as skipped.
	Skip map[string]string
}

func (o Options) withDefaults() Options {
	if o.Goroutines <= 0 {
		o.Goroutines = 16
	}
	if o.Takes <= 0 {
		o.Takes = 10_000
	}
	if o.Budget <= 0 {
		o.Budget = 1_000
	}
	return o
}

// Run runs the suite with the default sizes. newStore returns a fresh
// store for each case.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	RunOptions(t, newStore, Options{})
}

// RunOptions runs the suite with the given concurrency sizes.
func RunOptions(t *testing.T, newStore func(t *testing.T) store.Store, opts Options) {
	opts = opts.withDefaults()
	cases := []struct {
		name string
		run  func(t *testing.T, st *tester)
	}{
		{"FixedWindowSteps", testFixedWindowSteps},
		{"FixedWindowClockBack", testFixedWindowClockBack},
		{"TokenBucketSteps", testTokenBucketSteps},
		{"TokenBucketRetryAfterExact", testTokenBucketRetryAfterExact},
		{"SlidingWindowSteps", testSlidingWindowSteps},
		{"SlidingWindowBatches", testSlidingWindowBatches},
		{"CostZeroChecks", testCostZero},
		{"Peeks", testPeeks},
		{"KeysIndependent", testKeysIndependent},
		{"BatchAllOrNothing", testBatchAllOrNothing},
		{"BatchDuplicateKeys", testBatchDuplicateKeys},
		{"ShadowHits", testShadowHits},
		{"SaturateHits", testSaturateHits},
		{"DecisionCount", testDecisionCount},
		{"ChargesRecordedWhole", testChargesRecordedWhole},
		{"ChargesInBatches", testChargesInBatches},
		{"TokenBucketDebt", testTokenBucketDebt},
		{"SlidingWindowDebt", testSlidingWindowDebt},
		{"Refunds", testRefunds},
		{"WideLimits", testWideLimits},
		{"ChargeBounds", testChargeBounds},
		{"CalendarMonths", testCalendarMonths},
		{"CalendarDaysAndWeeks", testCalendarDaysAndWeeks},
		{"CalendarSliding", testCalendarSliding},
		{"CalendarBatches", testCalendarBatches},
		{"Reset", testReset},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if why, ok := opts.Skip[c.name]; ok {
				t.Skip(why)
			}
			c.run(t, newTester(t, newStore(t)))
		})
	}
	for _, alg := range []store.Algorithm{store.FixedWindow, store.TokenBucket, store.SlidingWindow} {
		t.Run("ConcurrentOneKey/"+alg.String(), func(t *testing.T) {
			testConcurrentOneKey(t, newTester(t, newStore(t)), alg, opts)
		})
		t.Run("ConcurrentBatches/"+alg.String(), func(t *testing.T) {
			testConcurrentBatches(t, newTester(t, newStore(t)), alg, opts)
		})
		t.Run("ConcurrentCharges/"+alg.String(), func(t *testing.T) {
			testConcurrentCharges(t, newTester(t, newStore(t)), alg, opts)
		})
	}
	t.Run("ConcurrentOneKey/wide_fixed_window", func(t *testing.T) {
		testConcurrentWide(t, newTester(t, newStore(t)), opts)
	})
	for _, alg := range []store.Algorithm{store.FixedWindow, store.TokenBucket, store.SlidingWindow} {
		t.Run("ConcurrentResets/"+alg.String(), func(t *testing.T) {
			testConcurrentResets(t, newTester(t, newStore(t)), alg, opts)
		})
	}
}

// tester wraps a store with helpers that name keys uniquely per test (so
// stores sharing a server across tests do not collide).
type tester struct {
	t      *testing.T
	st     store.Store
	prefix string
}

var run atomic.Int64

func newTester(t *testing.T, st store.Store) *tester {
	return &tester{t: t, st: st,
		prefix: fmt.Sprintf("storetest/%d/%d/%s/", time.Now().UnixNano(), run.Add(1), t.Name())}
}

func (x *tester) key(name string) string { return x.prefix + name }

func (x *tester) take(now int64, hits ...store.Hit) []store.Decision {
	x.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out := make([]store.Decision, len(hits))
	if err := x.st.Take(ctx, now, hits, out); err != nil {
		x.t.Fatalf("Take: %v", err)
	}
	for i := range out {
		out[i].Local = false // whether a local cache answered is the store's business
	}
	return out
}

func (x *tester) hit(key string, r *store.Rule, cost uint64) store.Hit {
	return store.Hit{Key: x.key(key), Rule: r, Cost: cost, Veto: true}
}

func (x *tester) charge(key string, r *store.Rule, cost uint64) store.Hit {
	h := x.hit(key, r, cost)
	h.Mode = store.ModeCharge
	return h
}

func (x *tester) refund(key string, r *store.Rule, cost uint64) store.Hit {
	h := x.hit(key, r, cost)
	h.Mode = store.ModeRefund
	return h
}

// strict returns h as a peek under store.PeekStrict.
func strict(h store.Hit) store.Hit {
	h.Peek = store.PeekStrict
	return h
}

// op is one single-hit operation of a table: a take, a charge or a
// refund.
type op struct {
	name string
	at   time.Duration // since T0
	mode store.Mode
	cost uint64
	want store.Decision
}

func (x *tester) ops(key string, r *store.Rule, ops []op) {
	x.t.Helper()
	for i, o := range ops {
		h := x.hit(key, r, o.cost)
		h.Mode = o.mode
		if got := x.take(T0+int64(o.at), h)[0]; got != o.want {
			x.t.Errorf("op %d %q: %v %d at T0+%v = %+v, want %+v", i, o.name, o.mode, o.cost, o.at, got, o.want)
		}
	}
}

// Window returns a fixed-window rule, failing t if the numbers are invalid.
func Window(t testing.TB, limit uint64, w time.Duration) *store.Rule {
	t.Helper()
	r, err := store.NewFixedWindow(limit, w)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Sliding returns a sliding-window rule, failing t if the numbers are
// invalid.
func Sliding(t testing.TB, limit uint64, w time.Duration) *store.Rule {
	t.Helper()
	r, err := store.NewSlidingWindow(limit, w)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Bucket returns a token-bucket rule, failing t if the numbers are invalid.
func Bucket(t testing.TB, rate uint64, per time.Duration, burst uint64) *store.Rule {
	t.Helper()
	r, err := store.NewTokenBucket(rate, per, burst)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func allow(limit, remaining uint64, reset time.Duration) store.Decision {
	return store.Decision{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func deny(limit, remaining uint64, reset, retry time.Duration) store.Decision {
	return store.Decision{Limit: limit, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

// step is one single-hit take of a step table.
type step struct {
	name string
	at   time.Duration // since T0
	cost uint64
	want store.Decision
}

func (x *tester) steps(key string, r *store.Rule, steps []step) {
	x.t.Helper()
	for i, s := range steps {
		got := x.take(T0+int64(s.at), x.hit(key, r, s.cost))[0]
		if got != s.want {
			x.t.Errorf("step %d %q: take %d at T0+%v = %+v, want %+v", i, s.name, s.cost, s.at, got, s.want)
		}
	}
}

// expect compares a batch's decisions, naming the batch and the hit.
func (x *tester) expect(batch string, got []store.Decision, want ...store.Decision) {
	x.t.Helper()
	for i := range want {
		if got[i] != want[i] {
			x.t.Errorf("%s: hit %d = %+v, want %+v", batch, i, got[i], want[i])
		}
	}
}

func testFixedWindowSteps(t *testing.T, x *tester) {
	r := Window(t, 10, time.Minute)
	var steps []step
	for i := range 10 {
		steps = append(steps, step{"fill", 5 * time.Second, 1, allow(10, uint64(9-i), 55*time.Second)})
	}
	steps = append(steps,
		step{"eleventh is denied", 5 * time.Second, 1, deny(10, 0, 55*time.Second, 55*time.Second)},
		step{"last nanosecond", time.Minute - 1, 1, deny(10, 0, 1, 1)},
		step{"new window at the boundary", time.Minute, 4, allow(10, 6, time.Minute)},
		step{"over the limit consumes nothing", time.Minute + time.Second, 11, deny(10, 6, 59*time.Second, store.Never)},
		step{"7 does not fit", time.Minute + time.Second, 7, deny(10, 6, 59*time.Second, 59*time.Second)},
		step{"6 fits", time.Minute + time.Second, 6, allow(10, 0, 59*time.Second)},
	)
	x.steps("fw", r, steps)
	x.steps("zero", Window(t, 0, time.Hour), []step{
		{"limit 0 denies", 0, 1, deny(0, 0, time.Hour, store.Never)},
		{"a check of limit 0 with nothing counted passes", 0, 0, allow(0, 0, time.Hour)},
	})
	max := uint64(store.MaxFixedWindowLimit)
	x.steps("max", Window(t, max, time.Second), []step{
		{"cost 2^64-1", 0, 1<<64 - 1, deny(max, max, time.Second, store.Never)},
		{"cost limit-1", 0, max - 1, allow(max, 1, time.Second)},
		{"cost 2", 0, 2, deny(max, 1, time.Second, time.Second)},
		{"cost 1", 0, 1, allow(max, 0, time.Second)},
	})
}

// testFixedWindowClockBack: a clock stepped back into an earlier window
// keeps counting in the later window the state holds.
func testFixedWindowClockBack(t *testing.T, x *tester) {
	x.steps("fw", Window(t, 10, time.Minute), []step{
		{"fill the second window", time.Minute + time.Second, 10, allow(10, 0, 59*time.Second)},
		{"clock back into the first window counts in the second", 59 * time.Second, 1, deny(10, 0, 61*time.Second, 61*time.Second)},
		{"a check there: at the limit", 59 * time.Second, 0, allow(10, 0, 61*time.Second)},
	})
}

func testTokenBucketSteps(t *testing.T, x *tester) {
	r := Bucket(t, 8, time.Second, 40)
	const tick = 125 * time.Millisecond
	var steps []step
	for i := range 45 {
		if i < 40 {
			steps = append(steps, step{"burst", 0, 1, allow(40, uint64(39-i), time.Duration(i+1)*tick)})
		} else {
			steps = append(steps, step{"over the burst", 0, 1, deny(40, 0, 5*time.Second, tick)})
		}
	}
	steps = append(steps,
		step{"1ns before the refill", tick - 1, 1, deny(40, 0, 5*time.Second-tick+1, 1)},
		step{"refill", tick, 1, allow(40, 0, 5*time.Second)},
		step{"cost 41", tick, 41, deny(40, 0, 5*time.Second, store.Never)},
		step{"cost 3 waits", tick, 3, deny(40, 0, 5*time.Second, 3*tick)},
		step{"20 ticks later", 21 * tick, 3, allow(40, 17, 23*tick)},
		step{"clock back 3s", 21*tick - 3*time.Second, 1, deny(40, 0, 47*tick, time.Second)},
		step{"50 days idle", 50 * 24 * time.Hour, 0, allow(40, 40, 0)},
		step{"take all", 50 * 24 * time.Hour, 40, allow(40, 0, 5*time.Second)},
	)
	x.steps("tb", r, steps)

	const b32 = 1 << 32
	x.steps("big", Bucket(t, 1, time.Second, b32), []step{
		{"cost 2^64-1", 0, 1<<64 - 1, deny(b32, b32, 0, store.Never)},
		{"cost 2^32", 0, b32, allow(b32, 0, b32*time.Second)},
		{"cost 2 waits 2s", time.Second, 2, deny(b32, 1, (b32-1)*time.Second, time.Second)},
	})
}

func testTokenBucketRetryAfterExact(t *testing.T, x *tester) {
	x.steps("3ps", Bucket(t, 3, time.Second, 3), []step{
		{"drain", 0, 3, allow(3, 0, time.Second)},
		{"empty", 0, 1, deny(3, 0, time.Second, 333_333_334)},
		{"1ns early", 333_333_333, 1, deny(3, 0, 666_666_667, 1)},
		{"on time", 333_333_334, 1, allow(3, 0, time.Second)},
		{"one second in", time.Second, 1, allow(3, 1, 666_666_667)},
	})
}

// testSlidingWindowSteps: 4 per minute counts in 8 buckets of 7.5 s; a hit
// frees its slot when its bucket leaves the window.
func testSlidingWindowSteps(t *testing.T, x *tester) {
	const b = 7500 * time.Millisecond
	x.steps("sw", Sliding(t, 4, time.Minute), []step{
		{"check on a fresh key", 0, 0, allow(4, 4, 0)},
		{"one in bucket 0", time.Second, 1, allow(4, 3, 9*b-time.Second)},
		{"three in bucket 1", 10 * time.Second, 3, allow(4, 0, 9*b-10*time.Second)},
		{"past the minute still denied", time.Minute + 2*time.Second, 1, deny(4, 0, 9*b-62*time.Second, 9*b-62*time.Second)},
		{"over the limit never fits", time.Minute + 2*time.Second, 5, deny(4, 0, 9*b-62*time.Second, store.Never)},
		{"1 ns before bucket 0 leaves", 9*b - 1, 1, deny(4, 0, 1, 1)},
		{"two wait for bucket 1", 9 * b, 2, deny(4, 1, b, b)},
		{"bucket 0 has left", 9 * b, 1, allow(4, 0, b)},
		{"clock back 30 s counts in the newer bucket", 9*b - 30*time.Second, 1, deny(4, 0, b+30*time.Second, b+30*time.Second)},
		{"a check there: at the limit", 9*b - 30*time.Second, 0, allow(4, 0, b+30*time.Second)},
		{"bucket 1 has left", 10 * b, 3, allow(4, 0, 8*b)},
		{"50 days idle", 50 * 24 * time.Hour, 4, allow(4, 0, 9*b)},
	})
	x.steps("zero", Sliding(t, 0, time.Second), []step{
		{"limit 0 denies", 0, 1, deny(0, 0, 0, store.Never)},
		{"a check of limit 0 with nothing counted passes", 0, 0, allow(0, 0, 0)},
	})
	max := uint64(store.MaxSlidingWindowLimit)
	x.steps("max", Sliding(t, max, time.Hour), []step{
		{"cost 2^64-1", 0, 1<<64 - 1, deny(max, max, 0, store.Never)},
		{"cost limit-1", 30 * time.Minute, max - 1, allow(max, 1, 90*time.Minute)},
		{"the last one", 90 * time.Minute, 1, allow(max, 0, 30*time.Minute)},
		{"2 wait for the first bucket", 90 * time.Minute, 2, deny(max, 0, 30*time.Minute, 30*time.Minute)},
	})
}

// testSlidingWindowBatches: sliding windows in batches with the other
// algorithms, duplicate keys, shadow and saturating hits.
func testSlidingWindowBatches(t *testing.T, x *tester) {
	s := Sliding(t, 5, time.Second) // 8 buckets of 125 ms
	w := Window(t, 5, time.Minute)
	b := Bucket(t, 1, time.Second, 5)
	const q = 125 * time.Millisecond
	at := func(n int) int64 { return T0 + int64(n)*int64(q) }
	x.expect("three algorithms", x.take(at(0), x.hit("s", s, 2), x.hit("w", w, 2), x.hit("b", b, 2)),
		allow(5, 3, 9*q), allow(5, 3, time.Minute), allow(5, 3, 2*time.Second))
	x.expect("the sliding window denies", x.take(at(1), x.hit("w", w, 1), x.hit("s", s, 4), x.hit("b", b, 1)),
		allow(5, 3, time.Minute-q), deny(5, 3, 8*q, 8*q), allow(5, 3, 2*time.Second-q))
	x.expect("nothing consumed", x.take(at(1), x.hit("s", s, 0), x.hit("w", w, 0), x.hit("b", b, 0)),
		allow(5, 3, 8*q), allow(5, 3, time.Minute-q), allow(5, 3, 2*time.Second-q))
	x.expect("duplicates see each other, second denied", x.take(at(1), x.hit("s", s, 2), x.hit("s", s, 2)),
		allow(5, 3, 8*q), deny(5, 1, 8*q, 8*q))
	x.expect("rolled back", x.take(at(1), x.hit("s", s, 0)), allow(5, 3, 8*q))
	x.expect("a second bucket", x.take(at(1), x.hit("s", s, 1), x.hit("w", w, 0)), allow(5, 2, 8*q), allow(5, 3, time.Minute-q))

	sat := x.hit("s", s, 4)
	sat.Mode, sat.Veto = store.ModeSaturate, false
	shadow := x.hit("t", s, 6)
	shadow.Veto = false
	x.expect("denied batch drains a saturating sliding hit", x.take(at(2), x.hit("w", w, 4), sat, shadow),
		deny(5, 3, time.Minute-2*q, time.Minute-2*q), deny(5, 0, 7*q, 9*q), deny(5, 5, 0, store.Never))
	x.expect("drained", x.take(at(2), x.hit("s", s, 1)), deny(5, 0, 7*q, 7*q))
	x.expect("bucket 0 has left", x.take(at(9), x.hit("s", s, 2)), allow(5, 0, q))
}

func testCostZero(t *testing.T, x *tester) {
	w := Window(t, 3, time.Minute)
	b := Bucket(t, 1, time.Second, 3)
	for i := range 5 {
		got := x.take(T0, x.hit("w", w, 0), x.hit("b", b, 0))
		x.expect(fmt.Sprintf("check %d", i), got, allow(3, 3, time.Minute), allow(3, 3, 0))
	}
	x.take(T0, x.hit("w", w, 2), x.hit("b", b, 2))
	got := x.take(T0, x.hit("w", w, 0), x.hit("b", b, 0))
	x.expect("check with one left", got, allow(3, 1, time.Minute), allow(3, 1, 2*time.Second))
	x.take(T0, x.hit("w", w, 1), x.hit("b", b, 1))
	got = x.take(T0, x.hit("w", w, 0), x.hit("b", b, 0))
	x.expect("check when exhausted: at the limit, not past it", got, allow(3, 0, time.Minute), allow(3, 0, 3*time.Second))
	x.expect("nothing consumed by the checks", x.take(T0+int64(time.Second), x.hit("b", b, 1)), allow(3, 0, 3*time.Second))
}

// testPeeks: a peek (a hit of cost 0) on every algorithm, alone, in a
// batch and in a denied batch, by either rule. Under store.PeekWithin,
// the default and envoyproxy/ratelimit's rule, it is allowed at the limit
// (nothing remaining) and of a limit of 0 with nothing counted, and
// denied only past the limit: a window counting more, a token bucket or
// sliding window in debt. Under store.PeekStrict it is allowed only when
// one more unit fits. A peek consumes nothing either way.
func testPeeks(t *testing.T, x *tester) {
	const m, q = time.Minute, 125 * time.Millisecond
	w := Window(t, 2, m)
	b := Bucket(t, 1, time.Second, 2)
	s := Sliding(t, 2, time.Second) // 8 buckets of 125 ms
	peeks := func(peek func(store.Hit) store.Hit, mode store.Mode) []store.Hit {
		hs := []store.Hit{x.hit("w", w, 0), x.hit("b", b, 0), x.hit("s", s, 0)}
		for i := range hs {
			hs[i].Mode = mode
			hs[i] = peek(hs[i])
		}
		return hs
	}
	within := func(h store.Hit) store.Hit { return h }
	x.expect("fill each to its limit", x.take(T0, x.hit("w", w, 2), x.hit("b", b, 2), x.hit("s", s, 2)),
		allow(2, 0, m), allow(2, 0, 2*time.Second), allow(2, 0, 9*q))
	atLimit := []store.Decision{allow(2, 0, m), allow(2, 0, 2*time.Second), allow(2, 0, 9*q)}
	oneMore := []store.Decision{deny(2, 0, m, m), deny(2, 0, 2*time.Second, time.Second), deny(2, 0, 9*q, 9*q)}
	for _, mode := range []store.Mode{take, store.ModeSaturate, charge} {
		for i, h := range peeks(within, mode) {
			x.expect(fmt.Sprintf("%v of 0 at the limit, alone", mode), x.take(T0, h), atLimit[i])
		}
		for i, h := range peeks(strict, mode) {
			x.expect(fmt.Sprintf("strict %v of 0 at the limit, alone", mode), x.take(T0, h), oneMore[i])
		}
	}
	x.expect("peeks at the limit in a batch", x.take(T0, peeks(within, take)...), atLimit...)
	x.expect("strict peeks at the limit in a batch", x.take(T0, peeks(strict, take)...), oneMore...)
	x.expect("peeks in a denied batch", x.take(T0, x.hit("w", w, 1), x.hit("b", b, 0), strict(x.hit("s", s, 0)), x.hit("f", w, 1)),
		deny(2, 0, m, m), allow(2, 0, 2*time.Second), deny(2, 0, 9*q, 9*q), allow(2, 2, m))
	x.expect("a peek beside a take of fixed windows", x.take(T0, x.hit("w", w, 0), x.hit("g", w, 1)),
		allow(2, 0, m), allow(2, 1, m))
	x.expect("a strict peek beside a take of fixed windows", x.take(T0, strict(x.hit("w", w, 0)), x.hit("h", w, 1)),
		deny(2, 0, m, m), allow(2, 2, m))
	x.expect("nothing consumed", x.take(T0, x.hit("f", w, 0), x.hit("h", w, 0)), allow(2, 2, m), allow(2, 2, m))

	x.expect("charge one more", x.take(T0, x.charge("w", w, 1), x.charge("b", b, 1), x.charge("s", s, 1)),
		deny(2, 0, m, m), deny(2, 0, 3*time.Second, 2*time.Second), deny(2, 0, 9*q, 9*q))
	x.expect("peeks past the limit", x.take(T0, peeks(within, take)...),
		deny(2, 0, m, m), deny(2, 0, 3*time.Second, time.Second), deny(2, 0, 9*q, 9*q))
	x.expect("strict peeks past the limit", x.take(T0, peeks(strict, take)...),
		deny(2, 0, m, m), deny(2, 0, 3*time.Second, 2*time.Second), deny(2, 0, 9*q, 9*q))
	x.expect("a bucket exactly empty", x.take(T0+int64(time.Second), x.hit("b", b, 0)), allow(2, 0, 2*time.Second))
	x.expect("a bucket exactly empty, strict", x.take(T0+int64(time.Second), strict(x.hit("b", b, 0))), deny(2, 0, 2*time.Second, time.Second))

	// A limit of 0 admits one peek: nothing is counted until a charge.
	zw, zs := Window(t, 0, m), Sliding(t, 0, time.Second) // 8 buckets of 125 ms
	x.expect("limit 0", x.take(T0, x.hit("zw", zw, 0), x.hit("zs", zs, 0)), allow(0, 0, m), allow(0, 0, 0))
	x.expect("limit 0, strict", x.take(T0, strict(x.hit("zw", zw, 0)), strict(x.hit("zs", zs, 0))),
		deny(0, 0, m, store.Never), deny(0, 0, 0, store.Never))
	x.expect("limit 0: charge 1", x.take(T0, x.charge("zw", zw, 1), x.charge("zs", zs, 1)),
		deny(0, 0, m, store.Never), deny(0, 0, 9*q, store.Never))
	x.expect("limit 0: charged", x.take(T0, x.hit("zw", zw, 0), x.hit("zs", zs, 0)), deny(0, 0, m, m), deny(0, 0, 9*q, 9*q))
	x.expect("limit 0: the charge has left", x.take(T0+int64(9*q), x.hit("zs", zs, 0)), allow(0, 0, 0))
}

func testKeysIndependent(t *testing.T, x *tester) {
	w := Window(t, 2, time.Minute)
	x.take(T0, x.hit("a", w, 2))
	x.expect("a exhausted", x.take(T0, x.hit("a", w, 1)), deny(2, 0, time.Minute, time.Minute))
	x.expect("b fresh", x.take(T0, x.hit("b", w, 1)), allow(2, 1, time.Minute))
	b := Bucket(t, 1, time.Second, 2)
	x.expect("c fresh", x.take(T0, x.hit("c", b, 2)), allow(2, 0, 2*time.Second))
}

func testBatchAllOrNothing(t *testing.T, x *tester) {
	a := Window(t, 5, time.Minute)
	b := Bucket(t, 1, time.Second, 2)
	x.expect("both fit", x.take(T0, x.hit("a", a, 1), x.hit("b", b, 1)),
		allow(5, 4, time.Minute), allow(2, 1, time.Second))
	x.expect("b denied", x.take(T0, x.hit("a", a, 2), x.hit("b", b, 2)),
		allow(5, 4, time.Minute), deny(2, 1, time.Second, time.Second))
	x.expect("a denied first", x.take(T0, x.hit("a", a, 5), x.hit("b", b, 1)),
		deny(5, 4, time.Minute, time.Minute), allow(2, 1, time.Second))
	x.expect("nothing consumed", x.take(T0, x.hit("a", a, 0), x.hit("b", b, 0)),
		allow(5, 4, time.Minute), allow(2, 1, time.Second))
	x.expect("three keys, last denied", x.take(T0, x.hit("a", a, 4), x.hit("b", b, 1), x.hit("c", a, 6)),
		allow(5, 4, time.Minute), allow(2, 1, time.Second), deny(5, 5, time.Minute, store.Never))
	x.expect("still nothing consumed", x.take(T0, x.hit("a", a, 4), x.hit("b", b, 1), x.hit("c", a, 5)),
		allow(5, 0, time.Minute), allow(2, 0, 2*time.Second), allow(5, 0, time.Minute))
}

func testBatchDuplicateKeys(t *testing.T, x *tester) {
	w := Window(t, 5, time.Minute)
	b := Bucket(t, 1, time.Second, 5)
	x.expect("two takes see each other", x.take(T0, x.hit("w", w, 2), x.hit("w", w, 2), x.hit("b", b, 2), x.hit("b", b, 2)),
		allow(5, 3, time.Minute), allow(5, 1, time.Minute), allow(5, 3, 2*time.Second), allow(5, 1, 4*time.Second))
	got := x.take(T0, x.hit("w", w, 1), x.hit("w", w, 1))
	x.expect("second duplicate denied", got, allow(5, 1, time.Minute), deny(5, 0, time.Minute, time.Minute))
	x.expect("rolled back", x.take(T0, x.hit("w", w, 0), x.hit("b", b, 0)),
		allow(5, 1, time.Minute), allow(5, 1, 4*time.Second))
}

func testShadowHits(t *testing.T, x *tester) {
	v := Window(t, 1, time.Minute)
	s := Window(t, 1, time.Minute)
	shadow := func(cost uint64) store.Hit {
		h := x.hit("s", s, cost)
		h.Veto = false
		return h
	}
	x.expect("shadow denied, batch commits", x.take(T0, x.hit("v", v, 1), shadow(2)),
		allow(1, 0, time.Minute), deny(1, 1, time.Minute, store.Never))
	x.expect("vetoing hit denied", x.take(T0, x.hit("v", v, 1), shadow(1)),
		deny(1, 0, time.Minute, time.Minute), allow(1, 1, time.Minute))
	x.expect("shadow not consumed by a denied batch", x.take(T0, shadow(1)), allow(1, 0, time.Minute))
	x.expect("shadow consumed by a committed batch", x.take(T0, shadow(1)), deny(1, 0, time.Minute, time.Minute))
}

func testSaturateHits(t *testing.T, x *tester) {
	v := Window(t, 1, time.Minute)
	w := Window(t, 10, time.Minute)
	b := Bucket(t, 1, time.Second, 10)
	sat := func(key string, r *store.Rule, cost uint64, veto bool) store.Hit {
		h := x.hit(key, r, cost)
		h.Mode, h.Veto = store.ModeSaturate, veto
		return h
	}
	x.take(T0, x.hit("v", v, 1), x.hit("w", w, 7), x.hit("b", b, 7))
	x.expect("denied batch drains what is left", x.take(T0, x.hit("v", v, 1), sat("w", w, 5, false), sat("b", b, 5, false)),
		deny(1, 0, time.Minute, time.Minute), deny(10, 0, time.Minute, time.Minute), deny(10, 0, 10*time.Second, 5*time.Second))
	x.expect("drained", x.take(T0, x.hit("w", w, 1), x.hit("b", b, 1)),
		deny(10, 0, time.Minute, time.Minute), deny(10, 0, 10*time.Second, time.Second))
	x.expect("a saturating hit that fits consumes in a denied batch", x.take(T0, x.hit("v", v, 1), sat("x", w, 4, false)),
		deny(1, 0, time.Minute, time.Minute), allow(10, 6, time.Minute))
	x.expect("a vetoing saturating hit denies and drains", x.take(T0, sat("x", w, 7, true), x.hit("y", w, 1)),
		deny(10, 0, time.Minute, time.Minute), allow(10, 10, time.Minute))
	x.expect("after", x.take(T0, x.hit("x", w, 1), x.hit("y", w, 0)), deny(10, 0, time.Minute, time.Minute), allow(10, 10, time.Minute))
}

func testDecisionCount(t *testing.T, x *tester) {
	w := Window(t, 1, time.Minute)
	out := make([]store.Decision, 1)
	if err := x.st.Take(context.Background(), T0, []store.Hit{x.hit("a", w, 1), x.hit("b", w, 1)}, out); err == nil {
		t.Fatal("Take with fewer decisions than hits: no error")
	}
}

func rule(t testing.TB, alg store.Algorithm, budget int) *store.Rule {
	switch alg {
	case store.FixedWindow:
		return Window(t, uint64(budget), 24*time.Hour)
	case store.SlidingWindow:
		return Sliding(t, uint64(budget), 24*time.Hour)
	}
	return Bucket(t, 1, 24*time.Hour, uint64(budget))
}

// All callers take from one key at one instant: exactly the budget is
// granted.
func testConcurrentOneKey(t *testing.T, x *tester, alg store.Algorithm, o Options) {
	if g := grantedAtOnce(t, x, rule(t, alg, o.Budget), 1, o); g != int64(o.Budget) {
		t.Fatalf("granted %d of %d takes, want exactly the budget %d", g, o.Goroutines*o.Takes, o.Budget)
	}
}

// grantedAtOnce has o.Goroutines callers take cost o.Takes times each
// from one key of r at one instant, and returns how many were granted.
func grantedAtOnce(t *testing.T, x *tester, r *store.Rule, cost uint64, o Options) int64 {
	var granted atomic.Int64
	var wg sync.WaitGroup
	for range o.Goroutines {
		wg.Go(func() {
			ctx := context.Background()
			hits := []store.Hit{x.hit("one", r, cost)}
			out := make([]store.Decision, 1)
			for range o.Takes {
				if err := x.st.Take(ctx, T0, hits, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed {
					granted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return granted.Load()
}

// Callers take batches over overlapping keys: each key is granted at most
// its budget, and what is left is exactly the budget minus the committed
// batches that hit it (a rollback leaks nothing).
func testConcurrentBatches(t *testing.T, x *tester, alg store.Algorithm, o Options) {
	const nkeys = 4
	budgets := [nkeys]int{o.Budget, max(1, o.Budget/2), max(1, o.Budget/4), o.Budget}
	var rules [nkeys]*store.Rule
	for i := range rules {
		rules[i] = rule(t, alg, budgets[i])
	}
	var committed [nkeys]atomic.Int64
	var wg sync.WaitGroup
	for g := range o.Goroutines {
		wg.Go(func() {
			ctx := context.Background()
			out := make([]store.Decision, 3)
			for i := range o.Takes {
				a, b, c := (g+i)%nkeys, (g+i+1)%nkeys, (g+2*i+3)%nkeys
				hits := []store.Hit{x.hit(fmt.Sprint(a), rules[a], 1), x.hit(fmt.Sprint(b), rules[b], 1), x.hit(fmt.Sprint(c), rules[c], 1)}
				if err := x.st.Take(ctx, T0, hits, out); err != nil {
					t.Error(err)
					return
				}
				denied := false
				for _, d := range out {
					denied = denied || !d.Allowed
				}
				if !denied {
					for _, k := range []int{a, b, c} {
						committed[k].Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	for k := range nkeys {
		d := x.take(T0, x.hit(fmt.Sprint(k), rules[k], 0))[0]
		c := committed[k].Load()
		if c > int64(budgets[k]) {
			t.Errorf("key %d: %d committed, over its budget %d", k, c, budgets[k])
		}
		if want := uint64(int64(budgets[k]) - min(c, int64(budgets[k]))); d.Remaining != want {
			t.Errorf("key %d: %d remaining after %d committed of %d: consumption leaked", k, d.Remaining, c, budgets[k])
		}
	}
}

const (
	take   = store.ModeTake
	charge = store.ModeCharge
	refund = store.ModeRefund
)

// testChargesRecordedWhole: Envoy Gateway's cost, a peek before each
// request and the usage charged after it. A charge past the limit is
// recorded whole, so the peeks that follow are denied until the window
// ends.
func testChargesRecordedWhole(t *testing.T, x *tester) {
	const m = time.Minute
	x.ops("budget", Window(t, 100, m), []op{
		{"peek", 0, take, 0, allow(100, 100, m)},
		{"charge 80", time.Second, charge, 80, allow(100, 20, m-time.Second)},
		{"charge 150: over, recorded whole", 2 * time.Second, charge, 150, deny(100, 0, m-2*time.Second, m-2*time.Second)},
		{"peek: overspent", 3 * time.Second, take, 0, deny(100, 0, m-3*time.Second, m-3*time.Second)},
		{"refund 100: 130 counted, still over", 4 * time.Second, refund, 100, allow(100, 0, m-4*time.Second)},
		{"refund 40: 90 counted", 5 * time.Second, refund, 40, allow(100, 10, m-5*time.Second)},
		{"charge 10: exactly at the limit", 6 * time.Second, charge, 10, allow(100, 0, m-6*time.Second)},
		{"peek at the limit: allowed, as the reference allows it", 7 * time.Second, take, 0, allow(100, 0, m-7*time.Second)},
		{"charge 1: past the limit", 8 * time.Second, charge, 1, deny(100, 0, m-8*time.Second, m-8*time.Second)},
		{"peek past the limit", 9 * time.Second, take, 0, deny(100, 0, m-9*time.Second, m-9*time.Second)},
		{"the window ends", m, take, 0, allow(100, 100, m)},
	})
	x.ops("zero", Window(t, 0, m), []op{
		{"a limit of 0 admits one peek", 0, take, 0, allow(0, 0, m)},
		{"a charge on a limit of 0 is denied, and counted", 0, charge, 5, deny(0, 0, m, store.Never)},
		{"the next peek is denied until the window ends", time.Second, take, 0, deny(0, 0, m-time.Second, m-time.Second)},
	})
}

// testChargesInBatches: a charge applies whatever its batch's outcome; a
// charge that does not fit denies the batch, whose takes consume nothing.
func testChargesInBatches(t *testing.T, x *tester) {
	w := Window(t, 10, time.Minute)
	b := Bucket(t, 1, time.Second, 10)
	s := Sliding(t, 10, time.Minute) // 6 buckets of 10 s
	m := time.Minute
	x.expect("a charge that does not fit denies the batch", x.take(T0, x.hit("w", w, 4), x.charge("c", w, 11), x.hit("b", b, 4)),
		allow(10, 10, m), deny(10, 0, m, m), allow(10, 10, 0))
	x.expect("its takes consumed nothing, the charge is recorded", x.take(T0, x.hit("w", w, 0), x.hit("c", w, 0), x.hit("b", b, 0)),
		allow(10, 10, m), deny(10, 0, m, m), allow(10, 10, 0))
	shadow := x.charge("s", s, 4)
	shadow.Veto = false
	x.expect("a batch denied by a take still records its charges and refunds", x.take(T0,
		x.charge("b", b, 3), x.hit("c", w, 1), shadow, x.refund("w", w, 5)),
		allow(10, 7, 3*time.Second), deny(10, 0, m, m), allow(10, 6, 70*time.Second), allow(10, 10, m))
	x.expect("after", x.take(T0, x.hit("b", b, 0), x.hit("s", s, 0)), allow(10, 7, 3*time.Second), allow(10, 6, 70*time.Second))
	x.expect("a committed batch: takes and charges both count", x.take(T0, x.hit("w", w, 2), x.charge("w", w, 3), x.charge("b", b, 5)),
		allow(10, 8, m), allow(10, 5, m), allow(10, 2, 8*time.Second))
	x.expect("a charge that does not fit rolls the batch's takes back", x.take(T0, x.hit("w", w, 2), x.charge("w", w, 3), x.charge("b", b, 9)),
		allow(10, 2, m), allow(10, 0, m), deny(10, 0, 17*time.Second, 8*time.Second))
}

// testTokenBucketDebt is the example: 10 per second, burst 10,
// charged 30. The 20 past the capacity are debt: peeks are denied until
// a token is back, 2.1 s later.
func testTokenBucketDebt(t *testing.T, x *tester) {
	const tok = 100 * time.Millisecond
	x.ops("tb", Bucket(t, 10, time.Second, 10), []op{
		{"charge 30", 0, charge, 30, deny(10, 0, 3*time.Second, 21*tok)},
		{"peek at 1 s: past empty until 2 s", time.Second, take, 0, deny(10, 0, 2*time.Second, time.Second)},
		{"peek 1 ns before empty", 20*tok - 1, take, 0, deny(10, 0, 10*tok+1, 1)},
		{"peek at 2 s: empty, not past it", 20 * tok, take, 0, allow(10, 0, 10*tok)},
		{"a take at 2 s", 2 * time.Second, take, 1, deny(10, 0, time.Second, tok)},
		{"a take 1 ns early", 21*tok - 1, take, 1, deny(10, 0, 9*tok+1, 1)},
		{"peek at 2.1 s", 21 * tok, take, 0, allow(10, 1, 9*tok)},
		{"charge 5 more", 21 * tok, charge, 5, deny(10, 0, 14*tok, 5*tok)},
		{"refund 3", 21 * tok, refund, 3, allow(10, 0, 11*tok)},
		{"full again", 4 * time.Second, take, 10, allow(10, 0, time.Second)},
	})
}

// testSlidingWindowDebt: charged past its limit, a sliding window holds
// the limit in the charge's bucket and owes the rest; the debt enters as
// the window slides.
func testSlidingWindowDebt(t *testing.T, x *tester) {
	const b = 200 * time.Millisecond
	x.ops("sw", Sliding(t, 10, time.Second), []op{ // 5 buckets of 200 ms
		{"take 4", 0, take, 4, allow(10, 6, 6*b)},
		{"charge 26: full and 20 owed", b, charge, 26, deny(10, 0, 18*b, 18*b)},
		{"peek: debt until its last part enters", 2 * b, take, 0, deny(10, 0, 17*b, 11*b)},
		{"bucket 7: 10 of the debt entered", 7 * b, take, 0, deny(10, 0, 12*b, 6*b)},
		{"refund 5", 8 * b, refund, 5, allow(10, 0, 5*b)},
		{"bucket 13: the last 5 entered", 13 * b, take, 5, allow(10, 0, 6*b)},
		{"bucket 19: empty", 19 * b, take, 0, allow(10, 10, 0)},
	})
}

// testRefunds: never below empty, never above the capacity.
func testRefunds(t *testing.T, x *tester) {
	m := time.Minute
	x.ops("w", Window(t, 10, m), []op{
		{"refund on a fresh key", 0, refund, 5, allow(10, 10, m)},
		{"take 6", 0, take, 6, allow(10, 4, m)},
		{"refund 2", 0, refund, 2, allow(10, 6, m)},
		{"refund 100", 0, refund, 100, allow(10, 10, m)},
		{"take 10", 0, take, 10, allow(10, 0, m)},
	})
	x.ops("b", Bucket(t, 1, time.Second, 10), []op{
		{"drain", 0, take, 10, allow(10, 0, 10*time.Second)},
		{"refund 3", 0, refund, 3, allow(10, 3, 7*time.Second)},
		{"refund 100: full, not above", time.Second, refund, 100, allow(10, 10, 0)},
		{"take 10", time.Second, take, 10, allow(10, 0, 10*time.Second)},
	})
	const q = 200 * time.Millisecond
	x.ops("s", Sliding(t, 10, time.Second), []op{
		{"3 in bucket 0", 0, take, 3, allow(10, 7, 6*q)},
		{"4 in bucket 1", q, take, 4, allow(10, 3, 5*q)},
		{"refund 5: the oldest first", 2 * q, refund, 5, allow(10, 8, 5*q)},
		{"refund 9", 2 * q, refund, 9, allow(10, 10, 0)},
	})
}

// testWideLimits: limits past 32 bits, counted exactly.
func testWideLimits(t *testing.T, x *tester) {
	const u32, h = 1<<32 - 1, time.Hour
	x.ops("u32", Window(t, u32, h), []op{
		{"all but one", 0, take, u32 - 1, allow(u32, 1, h)},
		{"the last one", 0, take, 1, allow(u32, 0, h)},
		{"one more", 0, take, 1, deny(u32, 0, h, h)},
		{"charge 2^32 past it", 0, charge, 1 << 32, deny(u32, 0, h, h)},
		{"refund 2^32: back at the limit", 0, refund, 1 << 32, allow(u32, 0, h)},
		{"refund 5", 0, refund, 5, allow(u32, 5, h)},
	})
	const budget, step = 10_000_000_000, 3_000_000_000
	x.ops("budget", Window(t, budget, 24*h), []op{
		{"charge 3×10^9", 0, charge, step, allow(budget, budget-step, 24*h)},
		{"charge 3×10^9", 0, charge, step, allow(budget, budget-2*step, 24*h)},
		{"charge 3×10^9", 0, charge, step, allow(budget, budget-3*step, 24*h)},
		{"charge 3×10^9: over", 0, charge, step, deny(budget, 0, 24*h, 24*h)},
		{"peek", 0, take, 0, deny(budget, 0, 24*h, 24*h)},
		{"refund 2.5×10^9: 9.5×10^9 counted", 0, refund, 2_500_000_000, allow(budget, 500_000_000, 24*h)},
		{"take what is left", 0, take, 500_000_000, allow(budget, 0, 24*h)},
		{"next day", 24 * h, take, 0, allow(budget, budget, 24*h)},
	})
	x.ops("max", Window(t, store.MaxLimit, h), []op{
		{"2^53 at once", 0, take, store.MaxLimit, allow(store.MaxLimit, 0, h)},
		{"2^53+1 never fits", 0, take, store.MaxLimit + 1, deny(store.MaxLimit, 0, h, store.Never)},
		{"charge 2^64-1", 0, charge, 1<<64 - 1, deny(store.MaxLimit, 0, h, h)},
	})
	x.ops("tb", Bucket(t, 1_000_000, time.Second, store.MaxLimit), []op{
		{"take 2^53-1", 0, take, store.MaxLimit - 1, allow(store.MaxLimit, 1, (store.MaxLimit-1)*time.Microsecond)},
		{"charge 10^12 past it", 0, charge, 1_000_000_000_000, deny(store.MaxLimit, 0, (store.MaxLimit-1+1_000_000_000_000)*time.Microsecond, 1_000_000*time.Second)},
	})
}

// testChargeBounds: charges of 2^64-1 leave states at their bounds, and
// later hits decide sanely there.
func testChargeBounds(t *testing.T, x *tester) {
	m := time.Minute
	x.ops("w", Window(t, 10, m), []op{
		{"charge 2^64-1", 0, charge, 1<<64 - 1, deny(10, 0, m, m)},
		{"a refund leaves the saturated count", 0, refund, 5, allow(10, 0, m)},
		{"next window", m, take, 10, allow(10, 0, m)},
	})
	x.ops("s", Sliding(t, 10, time.Second), []op{
		{"charge 2^64-1: the debt at its bound", 0, charge, 1<<64 - 1, deny(10, 0, 1_073_741_820*200*time.Millisecond, 1_073_741_820*200*time.Millisecond)},
		{"refund 2^64-1: empty", 0, refund, 1<<64 - 1, allow(10, 10, 0)},
	})
	b := Bucket(t, 10, time.Second, 10)
	x.ops("b", b, []op{
		{"charge 2^64-1", 0, charge, 1<<64 - 1, deny(10, 0, (1<<61+1_000_000_000)*time.Nanosecond, (1<<61+100_000_000)*time.Nanosecond)},
		{"charge more: at the bound", 0, charge, 1, deny(10, 0, (1<<61+1_000_000_000)*time.Nanosecond, (1<<61+100_000_000)*time.Nanosecond)},
		{"refund 2^64-1: full", 0, refund, 1<<64 - 1, allow(10, 10, 0)},
	})
}

// Callers charge one key concurrently: no charge is lost, past the limit
// included.
func testConcurrentCharges(t *testing.T, x *tester, alg store.Algorithm, o Options) {
	r := rule(t, alg, o.Budget)
	const each = 3
	takes := min(o.Takes, 100)
	var wg sync.WaitGroup
	for range o.Goroutines {
		wg.Go(func() {
			ctx := context.Background()
			hits := []store.Hit{x.charge("one", r, each)}
			out := make([]store.Decision, 1)
			for range takes {
				if err := x.st.Take(ctx, T0, hits, out); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	// Everything charged but half the budget is refunded: half the budget
	// is left counted.
	total, keep := uint64(o.Goroutines*takes*each), uint64(o.Budget/2)
	x.take(T0, x.refund("one", r, total-keep))
	if d := x.take(T0, x.hit("one", r, 0))[0]; d.Remaining != uint64(o.Budget)-keep {
		t.Fatalf("%d charged by %d callers, all but %d refunded: %d remaining of %d, want %d", total, o.Goroutines, keep, d.Remaining, o.Budget, uint64(o.Budget)-keep)
	}
}

// Callers take from one key of a wide rule at one instant, each a cost
// of 2^23: exactly the budget is granted, counted past 32 bits.
func testConcurrentWide(t *testing.T, x *tester, o Options) {
	const cost = 1 << 23
	if g := grantedAtOnce(t, x, Window(t, uint64(o.Budget)*cost, 24*time.Hour), cost, o); g != int64(o.Budget) {
		t.Fatalf("granted %d takes of 2^23 of a limit of %d × 2^23, want exactly %d", g, o.Budget, o.Budget)
	}
}

// Calendar returns a calendar of unit periods (months per period for
// store.CalendarMonth) in the named zone, failing t if it is invalid.
func Calendar(t testing.TB, unit store.CalendarUnit, months int, zone string) *store.Calendar {
	t.Helper()
	loc, err := time.LoadLocation(zone)
	if err != nil {
		t.Fatal(err)
	}
	c, err := store.NewCalendar(unit, months, loc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// CalendarWindow returns a fixed window of limit per period of c.
func CalendarWindow(t testing.TB, limit uint64, c *store.Calendar) *store.Rule {
	t.Helper()
	r, err := store.NewCalendarWindow(limit, c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// CalendarSliding returns a sliding window of limit per period of c.
func CalendarSliding(t testing.TB, limit uint64, c *store.Calendar) *store.Rule {
	t.Helper()
	r, err := store.NewCalendarSliding(limit, c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// dated is one single-hit take of a step table at an RFC 3339 instant.
type dated struct {
	name string
	at   string
	cost uint64
	want store.Decision
}

// at parses an RFC 3339 instant into Unix nanoseconds.
func at(t testing.TB, s string) int64 {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return ts.UnixNano()
}

func (x *tester) dated(key string, r *store.Rule, steps []dated) {
	x.t.Helper()
	for i, s := range steps {
		got := x.take(at(x.t, s.at), x.hit(key, r, s.cost))[0]
		if got != s.want {
			x.t.Errorf("%s step %d %q: take %d at %s = %+v, want %+v", key, i, s.name, s.cost, s.at, got, s.want)
		}
	}
}

const day = 24 * time.Hour

// testCalendarMonths: calendar months reset on the 1st at midnight in
// their zone, whatever their length: February of a leap year and not,
// December into January, and months of summer time in Berlin, 1 h short
// (March) or long (October). The reset is exact.
func testCalendarMonths(t *testing.T, x *tester) {
	utc := CalendarWindow(t, 3, Calendar(t, store.CalendarMonth, 1, "UTC"))
	x.dated("utc", utc, []dated{
		{"Feb 29, last second", "2024-02-29T23:59:59Z", 3, allow(3, 0, time.Second)},
		{"half a second left", "2024-02-29T23:59:59.5Z", 1, deny(3, 0, 500*time.Millisecond, 500*time.Millisecond)},
		{"Mar 1", "2024-03-01T00:00:00Z", 1, allow(3, 2, 31*day)},
		{"Mar 31", "2024-03-31T12:00:00Z", 2, allow(3, 0, 12*time.Hour)},
		{"Apr 1", "2024-04-01T00:00:00Z", 0, allow(3, 3, 30*day)},
		{"Dec 31, 23:00", "2024-12-31T23:00:00Z", 1, allow(3, 2, time.Hour)},
		{"Jan 1", "2025-01-01T00:00:00Z", 3, allow(3, 0, 31*day)},
	})
	x.dated("feb23", utc, []dated{
		{"Feb 28 of a common year", "2023-02-28T12:00:00Z", 3, allow(3, 0, 12*time.Hour)},
		{"Mar 1", "2023-03-01T00:00:00Z", 3, allow(3, 0, 31*day)},
	})
	berlin := CalendarWindow(t, 2, Calendar(t, store.CalendarMonth, 1, "Europe/Berlin"))
	x.dated("berlin", berlin, []dated{
		{"Feb 29, 23:59:59 +01", "2024-02-29T22:59:59Z", 2, allow(2, 0, time.Second)},
		{"Mar 1, 00:00 +01", "2024-02-29T23:00:00Z", 1, allow(2, 1, 31*day-time.Hour)},
		{"Mar 31, 23:59:59 +02", "2024-03-31T21:59:59Z", 1, allow(2, 0, time.Second)},
		{"Apr 1, 00:00 +02", "2024-03-31T22:00:00Z", 2, allow(2, 0, 30*day)},
		{"Oct 15", "2024-10-15T12:00:00Z", 1, allow(2, 1, 16*day+11*time.Hour)},
		{"Oct 31, 23:30 +01", "2024-10-31T22:30:00Z", 2, deny(2, 1, 30*time.Minute, 30*time.Minute)},
		{"Nov 1, 00:00 +01", "2024-10-31T23:00:00Z", 2, allow(2, 0, 30*day)},
	})
	quarter := CalendarWindow(t, 1, Calendar(t, store.CalendarMonth, 3, "UTC"))
	x.dated("quarter", quarter, []dated{
		{"Mar 31", "2024-03-31T23:59:59Z", 1, allow(1, 0, time.Second)},
		{"Apr 1 starts the second quarter", "2024-04-01T00:00:00Z", 1, allow(1, 0, 91*day)},
		{"Jun 30", "2024-06-30T00:00:00Z", 1, deny(1, 0, day, day)},
	})
}

// testCalendarDaysAndWeeks: days of 23 and 25 hours and weeks of 7 days
// less or more an hour across changes of summer time; ISO weeks start on
// Monday at local midnight; a New York year starts at 05:00 UTC.
func testCalendarDaysAndWeeks(t *testing.T, x *tester) {
	d := CalendarWindow(t, 1, Calendar(t, store.CalendarDay, 1, "Europe/Berlin"))
	x.dated("day", d, []dated{
		{"Mar 30, 23:59:59 +01", "2024-03-30T22:59:59Z", 1, allow(1, 0, time.Second)},
		{"Mar 31 is 23 h long", "2024-03-30T23:00:00Z", 1, allow(1, 0, 23*time.Hour)},
		{"Mar 31, noon UTC", "2024-03-31T12:00:00Z", 1, deny(1, 0, 10*time.Hour, 10*time.Hour)},
		{"Apr 1, 00:00 +02", "2024-03-31T22:00:00Z", 1, allow(1, 0, day)},
		{"Oct 27 is 25 h long", "2024-10-26T22:00:00Z", 1, allow(1, 0, 25*time.Hour)},
		{"Oct 27, 23:59:59 +01", "2024-10-27T22:59:59Z", 1, deny(1, 0, time.Second, time.Second)},
		{"Oct 28", "2024-10-27T23:00:00Z", 1, allow(1, 0, day)},
	})
	w := CalendarWindow(t, 1, Calendar(t, store.CalendarWeek, 1, "Europe/Berlin"))
	x.dated("week", w, []dated{
		{"Sunday Mar 24, 23:59:59 +01", "2024-03-24T22:59:59Z", 1, allow(1, 0, time.Second)},
		{"Monday Mar 25 starts a week an hour short", "2024-03-24T23:00:00Z", 1, allow(1, 0, 7*day-time.Hour)},
		{"Sunday Mar 31, 23:59:59 +02", "2024-03-31T21:59:59Z", 1, deny(1, 0, time.Second, time.Second)},
		{"Monday Apr 1", "2024-03-31T22:00:00Z", 1, allow(1, 0, 7*day)},
	})
	ny := CalendarWindow(t, 1, Calendar(t, store.CalendarDay, 1, "America/New_York"))
	x.dated("ny", ny, []dated{
		{"Nov 3 is 25 h long", "2024-11-03T04:00:00Z", 1, allow(1, 0, 25*time.Hour)},
		{"Nov 3, 23:59:59 -05", "2024-11-04T04:59:59Z", 1, deny(1, 0, time.Second, time.Second)},
		{"Nov 4", "2024-11-04T05:00:00Z", 1, allow(1, 0, day)},
	})
	year := CalendarWindow(t, 1, Calendar(t, store.CalendarYear, 1, "America/New_York"))
	x.dated("year", year, []dated{
		{"Dec 31 noon UTC", "2024-12-31T12:00:00Z", 1, allow(1, 0, 17*time.Hour)},
		{"Dec 31, 23:59:59 -05", "2025-01-01T04:59:59Z", 1, deny(1, 0, time.Second, time.Second)},
		{"Jan 1, 00:00 -05", "2025-01-01T05:00:00Z", 1, allow(1, 0, 365*day)},
	})
}

// testCalendarSliding: a sliding window of 4 per calendar month counts in
// 8 buckets of each month (3.5 days in February 2023, 93 h in March, 90 h
// in April); one of 2 per day in Berlin in 8 buckets of each day (3 h, or
// 2 h 52.5 min on the 23-hour day).
func testCalendarSliding(t *testing.T, x *tester) {
	m := CalendarSliding(t, 4, Calendar(t, store.CalendarMonth, 1, "UTC"))
	x.dated("month", m, []dated{
		// February's bucket 1 leaves when March's bucket 2 starts, on
		// Mar 8 at 18:00.
		{"Feb, bucket 1", "2023-02-04T12:00:00Z", 1, allow(4, 3, 28*day+102*time.Hour)},
		{"Feb, bucket 7", "2023-02-25T12:00:00Z", 3, allow(4, 0, 270*time.Hour)},
		{"Mar 1 still counts February", "2023-03-01T00:00:00Z", 1, deny(4, 0, 186*time.Hour, 186*time.Hour)},
		// February's bucket 7 leaves when April starts.
		{"Mar, bucket 2", "2023-03-08T18:00:00Z", 1, allow(4, 0, 558*time.Hour)},
		{"Mar 31, last ns", "2023-03-31T23:59:59.999999999Z", 1, deny(4, 0, 1, 1)},
		// March's bucket 2 leaves when April's bucket 3 starts.
		{"Apr 1", "2023-04-01T00:00:00Z", 3, allow(4, 0, 270*time.Hour)},
	})
	d := CalendarSliding(t, 2, Calendar(t, store.CalendarDay, 1, "Europe/Berlin"))
	x.dated("day", d, []dated{
		// Mar 30's bucket 7 (21:00-24:00 +01) leaves when Apr 1 starts.
		{"Mar 30, 22:00 +01", "2024-03-30T21:00:00Z", 2, allow(2, 0, 25*time.Hour)},
		{"Mar 31, 14:00 +02", "2024-03-31T12:00:00Z", 1, deny(2, 0, 10*time.Hour, 10*time.Hour)},
		// Apr 1's bucket 0 leaves when Apr 2's bucket 1 starts (03:00 +02).
		{"Apr 1, 00:00 +02", "2024-03-31T22:00:00Z", 2, allow(2, 0, 27*time.Hour)},
	})
}

// testCalendarBatches: calendar windows in batches with windows aligned to
// the epoch (on Redis the batch of fixed windows runs in window.lua), and
// with a calendar sliding window; all or nothing.
func testCalendarBatches(t *testing.T, x *tester) {
	c := Calendar(t, store.CalendarMonth, 1, "Europe/Berlin")
	cw, cs := CalendarWindow(t, 5, c), CalendarSliding(t, 5, c)
	ew := Window(t, 5, time.Minute)
	// Both windows end at 22:00 UTC, the calendar one on Apr 1, 00:00 +02.
	end := "2024-03-31T21:59:30Z"
	x.expect("both fit", x.take(at(t, end), x.hit("c", cw, 2), x.hit("e", ew, 2)),
		allow(5, 3, 30*time.Second), allow(5, 3, 30*time.Second))
	x.expect("the calendar window denies", x.take(at(t, end), x.hit("e", ew, 1), x.hit("c", cw, 4)),
		allow(5, 3, 30*time.Second), deny(5, 3, 30*time.Second, 30*time.Second))
	x.expect("nothing consumed", x.take(at(t, end), x.hit("c", cw, 0), x.hit("e", ew, 0)),
		allow(5, 3, 30*time.Second), allow(5, 3, 30*time.Second))
	x.expect("April", x.take(at(t, "2024-03-31T22:00:00Z"), x.hit("c", cw, 5), x.hit("e", ew, 5)),
		allow(5, 0, 30*day), allow(5, 0, time.Minute))
	// March in Berlin is 31 days less an hour: 8 buckets of 92 h 52.5 min;
	// a take on Mar 31 counts in bucket 7, which leaves when May's bucket
	// 0 starts, 8 buckets of April (30 days) later.
	x.expect("with a sliding window", x.take(at(t, end), x.hit("s", cs, 2), x.hit("x", cw, 1)),
		allow(5, 3, 30*day+30*time.Second), allow(5, 4, 30*time.Second))
	x.expect("the sliding window denies", x.take(at(t, end), x.hit("x", cw, 1), x.hit("s", cs, 4)),
		allow(5, 4, 30*time.Second), deny(5, 3, 30*day+30*time.Second, 30*day+30*time.Second))
	x.expect("nothing consumed", x.take(at(t, end), x.hit("x", cw, 0), x.hit("s", cs, 0)),
		allow(5, 4, 30*time.Second), allow(5, 3, 30*day+30*time.Second))
}

// testReset: a reset leaves every algorithm's key fresh (narrow, wide and
// calendar windows, sliding windows, buckets in debt), touches no other
// key, and resets a key that was never hit without error.
func testReset(t *testing.T, x *tester) {
	rs, ok := x.st.(store.Resetter)
	if !ok {
		t.Skip("the store does not implement store.Resetter")
	}
	month := Calendar(t, store.CalendarMonth, 1, "Europe/Berlin")
	now := at(t, "2024-02-10T12:00:00+01:00")
	h := int64(time.Hour)
	rules := []struct {
		name string
		r    *store.Rule
		use  uint64 // what the test charges: past the limit
	}{
		{"fixed", Window(t, 3, time.Minute), 4},
		{"wide", Window(t, 10_000_000_000, time.Hour), 10_000_000_001},
		{"sliding", Sliding(t, 4, time.Minute), 9},
		{"bucket", Bucket(t, 1, time.Second, 3), 7},
		{"calendar", CalendarWindow(t, 5, month), 6},
		{"calendar-sliding", CalendarSliding(t, 5, month), 6},
	}
	var hits, untouched []store.Hit
	for _, c := range rules {
		hits = append(hits, x.hit(c.name, c.r, 0))
		untouched = append(untouched, x.hit(c.name+"/other", c.r, 0))
		x.take(now, x.charge(c.name, c.r, c.use), x.charge(c.name+"/other", c.r, c.use))
	}
	for i, d := range x.take(now+h/1000, hits...) {
		if d.Allowed {
			t.Fatalf("%s: a check after charging %d = %+v, want a denial", rules[i].name, rules[i].use, d)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rs.Reset(ctx, now+h/1000, hits); err != nil {
		t.Fatalf("Reset: %v", err)
	}
	for i, d := range x.take(now+h/1000, hits...) {
		r := rules[i].r
		if want := store.View(store.State{}, r, now+h/1000); d != want {
			t.Errorf("%s: a check after the reset = %+v, want the fresh state's %+v", rules[i].name, d, want)
		}
	}
	for i, d := range x.take(now+h/1000, untouched...) {
		if d.Allowed {
			t.Errorf("%s: another key after the reset = %+v, want it still denied", rules[i].name, d)
		}
	}
	for _, c := range rules {
		got := x.take(now+h/1000, x.hit(c.name, c.r, 1))[0]
		if !got.Allowed || got.Remaining != c.r.Capacity()-1 {
			t.Errorf("%s: a take after the reset = %+v, want allowed with %d left", c.name, got, c.r.Capacity()-1)
		}
	}
	never := []store.Hit{x.hit("never-hit", rules[0].r, 0), x.hit("never-hit-wide", rules[1].r, 0)}
	if err := rs.Reset(ctx, now, never); err != nil {
		t.Fatalf("Reset of keys never hit: %v", err)
	}
	if err := rs.Reset(ctx, now, nil); err != nil {
		t.Fatalf("Reset of no keys: %v", err)
	}
	x.expect("a key never hit, after a reset", x.take(now, never[0]), store.View(store.State{}, rules[0].r, now))
}

// testConcurrentResets: callers take from one key at one instant while
// another resets it now and then. Each reset lets at most one more budget
// through (a take lands before or after a reset, never in both states),
// and once the last reset is done the key is fresh.
func testConcurrentResets(t *testing.T, x *tester, alg store.Algorithm, o Options) {
	rs, ok := x.st.(store.Resetter)
	if !ok {
		t.Skip("the store does not implement store.Resetter")
	}
	r := rule(t, alg, o.Budget)
	const resets = 5
	var granted atomic.Int64
	var wg sync.WaitGroup
	var done atomic.Bool
	reset := []store.Hit{x.hit("one", r, 0)}
	wg.Go(func() {
		for i := 0; i < resets && !done.Load(); i++ {
			if err := rs.Reset(context.Background(), T0, reset); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var takers sync.WaitGroup
	for range o.Goroutines {
		takers.Go(func() {
			hits := []store.Hit{x.hit("one", r, 1)}
			out := make([]store.Decision, 1)
			for range o.Takes {
				if err := x.st.Take(context.Background(), T0, hits, out); err != nil {
					t.Error(err)
					return
				}
				if out[0].Allowed {
					granted.Add(1)
				}
			}
		})
	}
	takers.Wait()
	done.Store(true)
	wg.Wait()
	if g := granted.Load(); g < int64(o.Budget) || g > int64(o.Budget)*(resets+1) {
		t.Errorf("granted %d with up to %d resets, want between the budget %d and %d", g, resets, o.Budget, o.Budget*(resets+1))
	}
	if err := rs.Reset(context.Background(), T0, reset); err != nil {
		t.Fatal(err)
	}
	x.expect("after the last reset", x.take(T0, reset[0]), store.View(store.State{}, r, T0))
}
