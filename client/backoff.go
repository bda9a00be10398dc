package client

import (
	"math/rand/v2"
	"time"
)

// Default backoff bounds.
const (
	DefaultBackoffBase = 250 * time.Millisecond
	DefaultBackoffCap  = 30 * time.Second
)

// Backoff draws the delays before successive retries of one operation
// with decorrelated jitter: each delay is uniform in
// [Base, min(previous × 3, Cap)], both ends included, where previous is
// the last draw (Base before the first). Once the bound reaches Cap the
// delay keeps jittering over [Base, Cap]; it never settles on Cap.
//
// The zero value is ready to use with the defaults. A Backoff holds the
// state of one retry sequence and is not safe for concurrent use; give
// each operation its own.
type Backoff struct {
	// Base is the shortest delay; zero means DefaultBackoffBase.
	Base time.Duration
	// Cap bounds the drawn delay; zero means DefaultBackoffCap. A Cap
	// below Base is raised to Base.
	Cap time.Duration
	// Rand returns a uniform integer in [0, n) for n > 0. Nil means
	// math/rand/v2's Int64N. A Rand shared between goroutines must be
	// safe for concurrent use.
	Rand func(n int64) int64

	prev time.Duration // last draw; zero before the first
}

// Next returns the delay before the next retry. retryAfter is the wait the
// server asked for, or zero: it is a floor for the delay, even above Cap,
// but the following draw still seeds from the drawn value, so one long
// server hint does not inflate every later delay.
func (b *Backoff) Next(retryAfter time.Duration) time.Duration {
	base, limit := b.bounds()
	prev := b.prev
	if prev == 0 {
		prev = base
	}
	hi := limit
	if prev <= limit/3 {
		hi = prev * 3
	}
	if hi < base {
		hi = base
	}
	draw := base + time.Duration(b.randN(int64(hi-base)+1))
	b.prev = draw
	return max(draw, retryAfter)
}

// Reset starts a new sequence: the next draw is again from [Base, 3 × Base].
// Call it after a success.
func (b *Backoff) Reset() { b.prev = 0 }

func (b *Backoff) bounds() (base, limit time.Duration) {
	base, limit = b.Base, b.Cap
	if base <= 0 {
		base = DefaultBackoffBase
	}
	if limit <= 0 {
		limit = DefaultBackoffCap
	}
	return base, max(limit, base)
}

func (b *Backoff) randN(n int64) int64 {
	if b.Rand != nil {
		return b.Rand(n)
	}
	return rand.Int64N(n)
}
