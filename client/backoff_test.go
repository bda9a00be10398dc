package client

import (
	"math/rand/v2"
	"testing"
	"time"
)

// script returns a Rand that answers pick(n) for each draw.
func script(pick func(n int64) int64) func(int64) int64 { return pick }

func TestBackoff_Steps(t *testing.T) {
	top := script(func(n int64) int64 { return n - 1 }) // always the upper bound
	bottom := script(func(int64) int64 { return 0 })    // always Base
	ms := time.Millisecond
	steps := []struct {
		name  string
		rand  func(int64) int64
		hint  time.Duration
		want  time.Duration
		reset bool
	}{
		{"first draw tops at 3×base", top, 0, 750 * ms, false},
		{"grows ×3", top, 0, 2250 * ms, false},
		{"grows ×3", top, 0, 6750 * ms, false},
		{"grows ×3", top, 0, 20250 * ms, false},
		{"capped", top, 0, 30 * time.Second, false},
		{"stays capped", top, 0, 30 * time.Second, false},
		{"low end is base even at the cap", bottom, 0, 250 * ms, false},
		{"seeds from the last draw", top, 0, 750 * ms, false},
		{"retry-after above the draw is a floor", bottom, 45 * time.Second, 45 * time.Second, false},
		{"the floor does not seed the next draw", top, 0, 750 * ms, false},
		{"retry-after below the draw is ignored", top, time.Second, 2250 * ms, false},
		{"reset starts over", top, 0, 750 * ms, true},
	}
	b := Backoff{}
	for i, s := range steps {
		if s.reset {
			b.Reset()
		}
		b.Rand = s.rand
		if got := b.Next(s.hint); got != s.want {
			t.Fatalf("step %d (%s): Next(%v) = %v, want %v", i, s.name, s.hint, got, s.want)
		}
	}
}

// With a seeded source, every draw lies in [base, min(prev×3, cap)] and
// both ends of the range are reached.
func TestBackoff_InclusiveBounds(t *testing.T) {
	const base, limit = 4, 40 // nanoseconds: a small range, so both ends come up
	b := Backoff{Base: base, Cap: limit, Rand: rand.New(rand.NewPCG(1, 2)).Int64N}
	prev := time.Duration(base)
	sawBase, sawTop, sawCap := false, false, false
	for i := range 10000 {
		hi := min(prev*3, limit)
		got := b.Next(0)
		if got < base || got > hi {
			t.Fatalf("draw %d: %v outside [%d, %v]", i, got, base, hi)
		}
		sawBase = sawBase || got == base
		sawTop = sawTop || (got == hi && hi < limit)
		sawCap = sawCap || got == limit
		prev = got
	}
	if !sawBase || !sawTop || !sawCap {
		t.Fatalf("ends reached: base %v, prev×3 %v, cap %v; want all", sawBase, sawTop, sawCap)
	}
}

// At the cap the delay keeps jittering: many draws, never all the cap.
func TestBackoff_JittersAtCap(t *testing.T) {
	b := Backoff{Rand: rand.New(rand.NewPCG(3, 4)).Int64N}
	for range 10 {
		b.Next(0)
	}
	seen := map[time.Duration]bool{}
	for range 100 {
		d := b.Next(0)
		if d > DefaultBackoffCap || d < DefaultBackoffBase {
			t.Fatalf("delay %v outside [%v, %v]", d, DefaultBackoffBase, DefaultBackoffCap)
		}
		seen[d] = true
	}
	if len(seen) < 90 {
		t.Fatalf("%d distinct delays in 100 draws near the cap; want jitter", len(seen))
	}
}

func TestBackoff_CapBelowBase(t *testing.T) {
	b := Backoff{Base: time.Second, Cap: time.Millisecond, Rand: script(func(n int64) int64 { return n - 1 })}
	for i := range 3 {
		if got := b.Next(0); got != time.Second {
			t.Fatalf("draw %d: %v, want the base 1s when Cap < Base", i, got)
		}
	}
}

// FuzzBackoff: every delay is at least Base and the hint, and at most
// the larger of the bound and the hint, whatever Rand answers in range.
func FuzzBackoff(f *testing.F) {
	f.Add(int64(250e6), int64(30e9), int64(0), uint64(1), uint8(10))
	f.Add(int64(1), int64(2), int64(5), uint64(7), uint8(50))
	f.Add(int64(5e9), int64(1), int64(1e9), uint64(3), uint8(3))
	f.Fuzz(func(t *testing.T, base, limit, hint int64, seed uint64, steps uint8) {
		base, limit, hint = base%int64(time.Hour), limit%int64(24*time.Hour), hint%int64(24*time.Hour)
		src := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
		b := Backoff{Base: time.Duration(base), Cap: time.Duration(limit), Rand: func(n int64) int64 {
			if n <= 0 {
				t.Fatalf("Rand(%d): want n > 0", n)
			}
			return src.Int64N(n)
		}}
		lo, hi := b.bounds()
		prev := lo
		for i := range int(steps) {
			h := max(time.Duration(hint), 0)
			d := b.Next(h)
			bound := min(prev*3, hi)
			if prev > hi/3 {
				bound = hi
			}
			if d < lo || d < h || d > max(bound, h) {
				t.Fatalf("step %d: Next(%v) = %v outside [%v, max(%v, hint)]", i, h, d, lo, bound)
			}
			prev = b.prev
		}
	})
}
