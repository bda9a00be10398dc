package redis

import (
	"sync/atomic"
	"time"
)

// breaker fails calls fast while Redis is down. It opens after threshold
// failures in a row with no success for window: concurrent calls that time
// out together in a hiccup (a GC pause, a busy CPU) while others succeed
// do not open it, a Redis that answers nothing does. Once open, it lets
// one call through per cooldown as a probe; the first success closes it.
// Safe for concurrent use.
type breaker struct {
	threshold int64
	cooldown  time.Duration
	window    time.Duration
	now       func() time.Time

	fails     atomic.Int64
	lastOK    atomic.Int64 // unix ns of the latest success
	openUntil atomic.Int64 // unix ns until the next probe; 0 when closed
}

func newBreaker(threshold int, cooldown, window time.Duration, now func() time.Time) *breaker {
	b := &breaker{threshold: int64(threshold), cooldown: cooldown, window: window, now: now}
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

func (b *breaker) success() {
	b.lastOK.Store(b.now().UnixNano())
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
	}
}

func (b *breaker) failure() {
	t := b.now().UnixNano()
	if b.fails.Add(1) >= b.threshold && t-b.lastOK.Load() >= int64(b.window) {
		b.openUntil.Store(t + int64(b.cooldown))
	}
}
