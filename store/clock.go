package store

import (
	"sync/atomic"
	"time"
)

// WallClock is the production Clock: wall time read through the monotonic
// clock. It anchors a wall-clock reading once and afterwards adds only the
// monotonic time elapsed (time.Since on a reading with a monotonic part
// reads the monotonic clock alone, cheaper than time.Now). So it never
// steps backwards, and token-bucket elapsed time never goes negative.
//
// Fixed windows align to the anchored wall time. A step of the system's
// wall clock (NTP, an operator) is not followed until Reanchor, which the
// store's sweeper calls periodically; Reanchor follows forward steps and
// holds still through backward ones. Safe for concurrent use.
type WallClock struct {
	a atomic.Pointer[anchor]
}

type anchor struct {
	mono time.Time // a reading with a monotonic part
	wall int64     // mono's Unix nanoseconds, or later
}

// NewWallClock returns a WallClock anchored now.
func NewWallClock() *WallClock {
	now := time.Now()
	c := &WallClock{}
	c.a.Store(&anchor{mono: now, wall: now.UnixNano()})
	return c
}

// Now returns nanoseconds since the Unix epoch, never less than an earlier
// call returned.
func (c *WallClock) Now() int64 {
	a := c.a.Load()
	return a.wall + int64(time.Since(a.mono))
}

// Reanchor re-reads the wall clock. If it moved forward relative to the
// monotonic clock, Now jumps forward with it; if it moved back, Now keeps
// counting from its current value (it never goes back).
func (c *WallClock) Reanchor() {
	for {
		old := c.a.Load()
		now := time.Now()
		wall := max(now.UnixNano(), old.wall+int64(now.Sub(old.mono)))
		if c.a.CompareAndSwap(old, &anchor{mono: now, wall: wall}) {
			return
		}
	}
}

// AtLeast moves the clock forward so that Now returns t or later from now
// on, counting on from there; if Now already reads t or later it changes
// nothing (the clock never goes back). A process that restores state
// saved by an earlier one calls it with the earlier clock's reading at
// the save plus the wall-clock time elapsed since, so that time continues
// across the restart even if the earlier clock was ahead of the system's
// wall clock (it had held still through a backward step).
func (c *WallClock) AtLeast(t int64) {
	for {
		old := c.a.Load()
		now := time.Now()
		if old.wall+int64(now.Sub(old.mono)) >= t {
			return
		}
		if c.a.CompareAndSwap(old, &anchor{mono: now, wall: t}) {
			return
		}
	}
}
