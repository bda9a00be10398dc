package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/store"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) Now() int64          { return c.ns.Load() }
func (c *fakeClock) Add(d time.Duration) { c.ns.Add(int64(d)) }
func (c *fakeClock) Set(t int64)         { c.ns.Store(t) }
func newFakeClock(t0 int64) *fakeClock   { c := &fakeClock{}; c.Set(t0); return c }

// t0 is an arbitrary instant far from the epoch, so the math sees large
// clock values as it does in production.
const t0 = int64(1_763_800_000) * int64(time.Second)

func newTestBucket(t *testing.T, clock *fakeClock) *Bucket {
	t.Helper()
	b, err := NewBucket(8, time.Second, 40, clock)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBucket_BurstThenWait(t *testing.T) {
	clock := newFakeClock(t0)
	b := newTestBucket(t, clock)
	admitted := 0
	for i := 1; i <= 45; i++ {
		d := b.Take(clock.Now(), 1)
		if d.Allowed {
			admitted++
		}
		if want := i <= 40; d.Allowed != want {
			t.Fatalf("request %d: allowed = %v, want %v", i, d.Allowed, want)
		}
		if i > 40 && d.RetryAfter != 125*time.Millisecond {
			t.Errorf("request %d: RetryAfter = %v, want 125ms", i, d.RetryAfter)
		}
	}
	if admitted != 40 {
		t.Fatalf("admitted %d of 45, want 40", admitted)
	}
}

func TestBucket_Steps(t *testing.T) {
	clock := newFakeClock(t0)
	b := newTestBucket(t, clock)
	ms := func(n int64) int64 { return t0 + n*int64(time.Millisecond) }
	steps := []struct {
		at      int64
		n       uint64
		allowed bool
		remain  uint64
		retry   time.Duration
	}{
		{ms(0), 40, true, 0, 0},
		{ms(0), 1, false, 0, 125 * time.Millisecond},
		{ms(124), 1, false, 0, time.Millisecond},
		{ms(125), 1, true, 0, 0},
		{ms(125), 0, false, 0, 125 * time.Millisecond}, // zero cost checks for one token, taking none
		{ms(250), 0, true, 1, 0},                       // (one is there)
		{ms(375), 3, false, 2, 125 * time.Millisecond}, // denied takes nothing
		{ms(375), 2, true, 0, 0},
		{ms(5375), 41, false, 40, store.Never},          // more than the burst never fits
		{ms(5375), 40, true, 0, 0},                      // refilled to the burst, not beyond
		{ms(5000), 1, false, 0, 500 * time.Millisecond}, // clock backwards: no free tokens
	}
	for i, s := range steps {
		d := b.Take(s.at, s.n)
		if d.Allowed != s.allowed || d.Remaining != s.remain || d.RetryAfter != s.retry {
			t.Errorf("step %d: Take(t0+%v, %d) = allowed %v remaining %d retry %v; want %v %d %v",
				i, time.Duration(s.at-t0), s.n, d.Allowed, d.Remaining, d.RetryAfter, s.allowed, s.remain, s.retry)
		}
	}
}

// Polling every 20 ms from empty still mints a token every 125 ms: the
// time between a token and the poll that takes it carries forward.
func TestBucket_Drip(t *testing.T) {
	clock := newFakeClock(t0)
	b := newTestBucket(t, clock)
	if d := b.Take(clock.Now(), 40); !d.Allowed {
		t.Fatal("full bucket refused its burst")
	}
	var got []time.Duration
	for elapsed := time.Duration(0); elapsed <= 2*time.Second; elapsed += 20 * time.Millisecond {
		clock.Set(t0 + int64(elapsed))
		if b.Allow() {
			got = append(got, elapsed)
		}
	}
	// The first poll at or after each multiple of 125 ms.
	var want []time.Duration
	for k := time.Duration(1); k*125*time.Millisecond <= 2*time.Second; k++ {
		due := k * 125 * time.Millisecond
		want = append(want, (due+19*time.Millisecond)/(20*time.Millisecond)*(20*time.Millisecond))
	}
	if len(got) != 16 || len(got) != len(want) {
		t.Fatalf("admitted at %v, want %v (16 tokens in 2 s)", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("token %d at %v, want %v (all: %v)", i+1, got[i], want[i], got)
		}
	}
}

func TestBucket_ConcurrentExactlyBurst(t *testing.T) {
	clock := newFakeClock(t0)
	b := newTestBucket(t, clock)
	var wg sync.WaitGroup
	var admitted atomic.Int64
	for range 200 {
		wg.Go(func() {
			if b.Allow() {
				admitted.Add(1)
			}
		})
	}
	wg.Wait()
	if admitted.Load() != 40 {
		t.Fatalf("%d of 200 concurrent callers admitted, want exactly 40", admitted.Load())
	}
}

func TestBucket_Wait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := NewBucket(8, time.Second, 40, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		start := time.Now()
		for range 40 {
			if err := b.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if waited := time.Since(start); waited != 0 {
			t.Fatalf("burst of 40 waited %v, want 0", waited)
		}
		for i := 1; i <= 5; i++ {
			if err := b.Wait(ctx); err != nil {
				t.Fatal(err)
			}
			if waited, want := time.Since(start), time.Duration(i)*125*time.Millisecond; waited != want {
				t.Fatalf("request %d admitted after %v, want %v", 40+i, waited, want)
			}
		}
	})
}

func TestBucket_WaitFailsFastPastDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := NewBucket(8, time.Second, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		b.Allow()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		err = b.Wait(ctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want DeadlineExceeded", err)
		}
		if time.Since(start) != 0 {
			t.Fatalf("Wait blocked %v before failing; want at once", time.Since(start))
		}
	})
}

func TestBucket_WaitCancelled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, err := NewBucket(1, time.Hour, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		gone, cancelGone := context.WithCancel(context.Background())
		cancelGone()
		if err := b.Wait(gone); !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait on an ended context = %v, want Canceled", err)
		}
		if !b.Allow() {
			t.Fatal("Wait on an ended context took the token")
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- b.Wait(ctx) }()
		time.Sleep(time.Minute)
		synctest.Wait()
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait = %v, want Canceled", err)
		}
	})
}

func TestNewBucket_Invalid(t *testing.T) {
	for _, c := range []struct {
		rate, burst uint64
		period      time.Duration
	}{{0, 1, time.Second}, {1, 0, time.Second}, {1, 1, 0}, {2, 1, time.Nanosecond}} {
		if _, err := NewBucket(c.rate, c.period, c.burst, nil); err == nil {
			t.Errorf("NewBucket(%d, %v, %d) succeeded, want an error", c.rate, c.period, c.burst)
		}
	}
}
