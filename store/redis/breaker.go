package redis

import (
	"sync/atomic"
	"time"
)

// breaker fails calls fast while Redis is down. It opens on evidence that
// Redis cannot be reached: threshold connection failures in a row with no
// success for window (a connection that breaks fails every call on it at
// once, and one that comes back at once should not open it), or a failed
// health probe (trip). A call that merely ran out of time is no evidence:
// on a starved machine that is this process being slow, and Run's probe
// decides. Once open, it lets one call through per cooldown as a probe;
// the first success closes it. Safe for concurrent use.
type breaker struct {
	threshold int64
	cooldown  time.Duration
	window    time.Duration
	now       func() time.Time
	changed   func(open bool) // told of each transition, by the caller that made it

	fails     atomic.Int64
	lastOK    atomic.Int64 // unix ns of the latest success
	openUntil atomic.Int64 // unix ns until the next probe; 0 when closed
	openedAt  atomic.Int64 // unix ns of the latest opening
	opens     atomic.Uint64
	closes    atomic.Uint64
}

// newBreaker returns a closed breaker. changed, if not nil, is called
// after each transition (it must be cheap: it runs in a request).
func newBreaker(threshold int, cooldown, window time.Duration, now func() time.Time, changed func(open bool)) *breaker {
	b := &breaker{threshold: int64(threshold), cooldown: cooldown, window: window, now: now, changed: changed}
	b.lastOK.Store(now().UnixNano())
	return b
}

// allow reports whether a call may go to Redis now.
func (b *breaker) allow() bool {
	u := b.openUntil.Load()
	if u == 0 {
		return true
	}
	t := b.now().UnixNano()
	// Past the cooldown, the caller that moves the deadline is the probe.
	return t >= u && b.openUntil.CompareAndSwap(u, t+int64(b.cooldown))
}

// closed reports whether the breaker lets every call through.
func (b *breaker) closed() bool { return b.openUntil.Load() == 0 }

// success records that Redis answered; it closes the breaker.
func (b *breaker) success() {
	b.lastOK.Store(b.now().UnixNano())
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if b.openUntil.Load() != 0 && b.openUntil.Swap(0) != 0 {
		b.closes.Add(1)
		if b.changed != nil {
			b.changed(false)
		}
	}
}

// failure records a call that could not reach Redis (a refused, reset or
// broken connection).
func (b *breaker) failure() {
	t := b.now().UnixNano()
	if b.fails.Add(1) >= b.threshold && t-b.lastOK.Load() >= int64(b.window) {
		b.open(t)
	}
}

// trip opens the breaker now: a health probe failed.
func (b *breaker) trip() { b.open(b.now().UnixNano()) }

func (b *breaker) open(t int64) {
	for {
		u := b.openUntil.Load()
		if u != 0 {
			// Already open: a failed probe call waits a cooldown again.
			b.openUntil.CompareAndSwap(u, max(u, t+int64(b.cooldown)))
			return
		}
		if b.openUntil.CompareAndSwap(0, t+int64(b.cooldown)) {
			b.openedAt.Store(t)
			b.opens.Add(1)
			if b.changed != nil {
				b.changed(true)
			}
			return
		}
	}
}
