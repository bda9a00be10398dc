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
