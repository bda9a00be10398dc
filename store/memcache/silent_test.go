package memcache

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/storetest"
)

// TestDeadline_MemcachedSilent is issue 34's item 10 on memcached: the
// client takes no context, so with memcached stopped (SIGSTOP: it accepts
// connections and answers nothing) a round trip waited for the store's
// Timeout (500 ms, the default) whatever the caller's deadline. 32
// callers with 20 ms deadlines run fixed windows (INCR) and token buckets
// (gets/cas) through two seconds of silence: the slowest answer must come
// within the deadline plus 150 ms plus the longest the test's own timer
// was late (a stall of this process; measured again on a miss, up to 3
// times: the bug is late by ~500 ms every time). It logs the slowest
// answer and the most goroutines seen: the takes left running past their
// deadline are bounded by MaxIdleConns (beyond it a take fails at once),
// and they end once memcached continues.
func TestDeadline_MemcachedSilent(t *testing.T) {
	if testing.Short() {
		t.Skip("stops memcached for two seconds, up to three times")
	}
	const callers, deadline = 32, 20 * time.Millisecond
	srv := memcachetest.Start(t)
	s := open(t, Options{Servers: []string{srv.Addr}, MaxIdleConns: 64})
	tb, err := store.NewTokenBucket(1_000_000, time.Second, 1_000_000)
	if err != nil {
		t.Fatal(err)
	}
	fw, err := store.NewFixedWindow(1_000_000_000, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	keys := make([]string, callers)
	for g := range keys {
		keys[g] = fmt.Sprint("k", g)
	}
	base := runtime.NumGoroutine()
	// ready waits until every caller's key answers (the takes left past
	// their deadline by an outage fail new ones at once until they end).
	ready := func() {
		t.Helper()
		out := make([]store.Decision, 1)
		end := time.Now().Add(time.Minute)
		for g := 0; g < callers; {
			r := tb
			if g%2 == 1 {
				r = fw
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			err := s.Take(ctx, time.Now().UnixNano(), []store.Hit{{Key: keys[g], Rule: r, Veto: true}}, out)
			cancel()
			switch {
			case err == nil:
				g++
			case time.Now().After(end):
				t.Fatalf("memcached does not answer: %v", err)
			default:
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	ready()

	var slowest, slip time.Duration
	var most int
	for attempt := 1; ; attempt++ {
		srv.Pause()
		stop := make(chan struct{})
		done := make(chan time.Duration, 1)
		go func() { done <- storetest.Callers(s, keys, []*store.Rule{tb, fw}, deadline, stop) }()
		// The most goroutines, and this process's worst stall: how late
		// a 10 ms tick fires.
		most, slip = 0, 0
		tick := time.NewTicker(10 * time.Millisecond)
		end := time.After(2 * time.Second)
	sample:
		for {
			most = max(most, runtime.NumGoroutine())
			select {
			case <-end:
				break sample
			case fired := <-tick.C:
				slip = max(slip, time.Since(fired))
			}
		}
		tick.Stop()
		close(stop)
		slowest = <-done
		srv.Resume()
		t.Logf("memcached stopped for 2s under %d callers with %v deadlines: slowest answer %v, at most %d goroutines (%d before), %d takes left waiting at the end",
			callers, deadline, slowest, most, base, s.left.Load())
		if bound := deadline + 150*time.Millisecond + slip; slowest <= bound {
			break
		} else if attempt == 3 {
			t.Fatalf("in each of 3 outages a call answered %v after it began, past its %v deadline plus 150ms plus the worst stall %v",
				slowest, deadline, slip)
		}
		ready()
	}
	// Takes left past their deadline finish once memcached answers.
	for end := time.Now().Add(30 * time.Second); s.left.Load() != 0 || runtime.NumGoroutine() > base+8; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("30 s after memcached continued: %d takes still left waiting, %d goroutines (%d before)", s.left.Load(), runtime.NumGoroutine(), base)
		}
	}
	// The callers, each one's take, the takes left (MaxIdleConns, which
	// callers leaving at once may pass by one each) and the test's own.
	if bound := base + 3*callers + 64 + 16; most > bound {
		t.Errorf("at most %d goroutines while memcached was stopped, want at most %d: %d before, %d callers, their takes, 64 takes left (MaxIdleConns) and as many more, 16 others",
			most, bound, base, callers)
	}
}

// TestDeadline_KeysOwned: a Take whose ctx ends while memcached is
// silent goes on in its own goroutine, but its caller may reuse the
// buffer its hits' keys point into once Take returns (the limiter
// does). The take left running must count on the key it was given:
// it used to build its memcached key from the hit's Key after the
// caller had overwritten it, counting on another key (a data race).
func TestDeadline_KeysOwned(t *testing.T) {
	srv := memcachetest.Start(t)
	// A round trip waits as long as memcached is stopped.
	s := open(t, Options{Servers: []string{srv.Addr}, Timeout: time.Minute})
	tb, err := store.NewTokenBucket(10, time.Second, 10)
	if err != nil {
		t.Fatal(err)
	}
	// The take may not have reached memcached before its deadline (then
	// it counts nowhere): up to 3 attempts, each on keys of its own.
	for attempt := 1; ; attempt++ {
		given, other := fmt.Sprint("owned/a", attempt), fmt.Sprint("owned/b", attempt)
		buf := []byte(given)
		hits := []store.Hit{{Key: unsafe.String(&buf[0], len(buf)), Rule: tb, Cost: 1, Veto: true}}
		srv.Pause()
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := s.Take(ctx, time.Now().UnixNano(), hits, make([]store.Decision, 1))
		cancel()
		copy(buf, other) // the caller's next request
		srv.Resume()
		if err == nil {
			t.Fatal("a Take answered while memcached was stopped")
		}
		for end := time.Now().Add(30 * time.Second); s.left.Load() != 0; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatal("30 s after memcached continued, the take left running has not ended")
			}
		}
		keys := srv.Keys()
		if slices.Contains(keys, other) {
			t.Fatalf("the take left running counted on %q, the key the caller wrote after Take returned, not on %q (keys %q)", other, given, keys)
		}
		if slices.Contains(keys, given) {
			return
		}
		if attempt == 3 {
			t.Fatalf("in 3 attempts the take left running never counted on %q (keys %q)", given, keys)
		}
	}
}
