package client

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Bucket paces a client's own outgoing requests with a token bucket: it
// holds up to burst tokens, gains rate tokens per period and starts full.
// Time below a whole token carries forward, so checking often never
// loses refill. The arithmetic is store's token bucket; the state is one
// atomic word updated by compare-and-swap, so a Bucket is safe for
// concurrent use and never grants more than the bucket allows.
type Bucket struct {
	state atomic.Uint64
	rule  *store.Rule
	clock store.Clock
}

// NewBucket returns a full bucket of burst tokens gaining rate tokens per
// period. A nil clock means store.NewWallClock(), which never steps back.
func NewBucket(rate uint64, period time.Duration, burst uint64, clock store.Clock) (*Bucket, error) {
	r, err := store.NewTokenBucket(rate, period, burst)
	if err != nil {
		return nil, fmt.Errorf("client: bucket: %w", err)
	}
	if clock == nil {
		clock = store.NewWallClock()
	}
	return &Bucket{rule: r, clock: clock}, nil
}

// Take takes n tokens at now (nanoseconds since the Unix epoch) if the
// bucket holds them, and reports the outcome: when denied, RetryAfter is
// the time until n tokens will be there (store.Never if n exceeds the
// burst), and nothing was taken. Zero tokens reports whether one token is
// there, without taking it.
func (b *Bucket) Take(now int64, n uint64) store.Decision {
	if n == 0 {
		return store.Check(store.State{Word: b.state.Load()}, b.rule, now, 1)
	}
	for {
		old := b.state.Load()
		s, d := store.TakeTokens(store.State{Word: old}, b.rule, now, n)
		if !d.Allowed || s.Word == old || b.state.CompareAndSwap(old, s.Word) {
			return d
		}
	}
}

// Allow takes one token now and reports whether there was one. It never
// waits.
func (b *Bucket) Allow() bool { return b.Take(b.clock.Now(), 1).Allowed }

// Wait takes one token, waiting for it if the bucket is empty. It returns
// ctx's error, taking nothing, if ctx has ended or ends first, and fails at once, without waiting, with
// an error wrapping context.DeadlineExceeded when the token cannot come
// before ctx's deadline. Concurrent waiters are not queued: each retries
// when a token is due, and one of them gets it.
func (b *Bucket) Wait(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var t *time.Timer
	for {
		now := b.clock.Now()
		d := b.Take(now, 1)
		if d.Allowed {
			if t != nil {
				t.Stop()
			}
			return nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d.RetryAfter {
			return fmt.Errorf("client: next token in %v is past the deadline: %w", d.RetryAfter, context.DeadlineExceeded)
		}
		if t == nil {
			t = time.NewTimer(d.RetryAfter)
		} else {
			t.Reset(d.RetryAfter)
		}
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
