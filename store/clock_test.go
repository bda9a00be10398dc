package store

import (
	"testing"
	"time"
)

func TestWallClock(t *testing.T) {
	c := NewWallClock()
	// (Within a second of the time.Now readings around it, not of the one
	// before: a busy machine can stall between the two calls.)
	before := time.Now().UnixNano()
	a := c.Now()
	after := time.Now().UnixNano()
	if a < before-int64(time.Second) || a > after+int64(time.Second) {
		t.Fatalf("Now() = %d, time.Now() = %d before and %d after", a, before, after)
	}
	prev := a
	for i := range 1000 {
		if i%100 == 0 {
			c.Reanchor()
		}
		n := c.Now()
		if n < prev {
			t.Fatalf("clock went back: %d after %d", n, prev)
		}
		prev = n
	}
	// A wall clock stepped back (simulated by an anchor in the future)
	// is not followed.
	future := c.Now() + int64(time.Hour)
	c.a.Store(&anchor{mono: time.Now(), wall: future})
	c.Reanchor()
	if n := c.Now(); n < future {
		t.Fatalf("after reanchoring under a backward step Now() = %d, want ≥ %d", n, future)
	}
}

func TestWallClock_AtLeast(t *testing.T) {
	c := NewWallClock()
	now := c.Now()
	// Behind the clock: nothing changes.
	c.AtLeast(now - int64(time.Hour))
	if n := c.Now(); n < now || n-now > int64(time.Minute) {
		t.Fatalf("AtLeast(an hour ago) moved the clock: %d, was %d", n, now)
	}
	// Ahead: the clock jumps there and counts on; Reanchor keeps it.
	ahead := c.Now() + int64(time.Hour)
	c.AtLeast(ahead)
	a := c.Now()
	if a < ahead || a-ahead > int64(time.Minute) {
		t.Fatalf("after AtLeast(+1h) Now() = %d, want just ≥ %d", a, ahead)
	}
	c.Reanchor()
	if b := c.Now(); b < a {
		t.Fatalf("Reanchor after AtLeast went back: %d < %d", b, a)
	}
}
