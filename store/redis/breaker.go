package redis

import (
	"sync/atomic"
	"time"
)

// breaker fails calls fast after consecutive failures. Once open, it lets
// one call through per cooldown as a probe; the first success closes it.
// Safe for concurrent use.
type breaker struct {
	threshold int64
	cooldown  time.Duration
	now       func() time.Time

	fails     atomic.Int64
	openUntil atomic.Int64 // unix ns until the next probe; 0 when closed
}

func newBreaker(threshold int, cooldown time.Duration, now func() time.Time) *breaker {
	return &breaker{threshold: int64(threshold), cooldown: cooldown, now: now}
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
	if b.fails.Load() != 0 {
		b.fails.Store(0)
	}
	if b.openUntil.Load() != 0 {
		b.openUntil.Store(0)
	}
}

func (b *breaker) failure() {
	if b.fails.Add(1) >= b.threshold {
		b.openUntil.Store(b.now().UnixNano() + int64(b.cooldown))
	}
}
