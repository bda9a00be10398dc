package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

// load runs takes from n goroutines until stop is closed and records the
// latency of each failed one and the time of each success.
type load struct {
	mu        sync.Mutex
	failLat   []time.Duration
	lastOK    atomic.Int64 // unix ns at which the latest-begun success began
	successes atomic.Int64
	failures  atomic.Int64
	fast      atomic.Int64 // failures the open breaker answered (ErrOpen)
}

func (l *load) run(t *testing.T, s *Store, n int, stop <-chan struct{}) *sync.WaitGroup {
	r := must(store.NewFixedWindow(1_000_000_000, time.Hour))
	var wg sync.WaitGroup
	for g := range n {
		hits := []store.Hit{{Key: "load" + string(rune('a'+g)), Rule: r, Cost: 1, Veto: true}}
		wg.Go(func() {
			storetest.Repeat(s, hits, 0, stop, func(t0 time.Time, took time.Duration, err error) bool {
				if err == nil {
					l.successes.Add(1)
					storetest.RaiseTo(&l.lastOK, t0.UnixNano())
					return false
				}
				l.failures.Add(1)
				l.mu.Lock()
				l.failLat = append(l.failLat, took)
				l.mu.Unlock()
				if errors.Is(err, ErrOpen) {
					l.fast.Add(1)
					return false
				}
				return true // (not failing fast: do not spin the CPU)
			})
		})
	}
	return &wg
}

func (l *load) p99() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.failLat) == 0 {
		return 0
	}
	slices.Sort(l.failLat)
	return l.failLat[len(l.failLat)*99/100]
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > timeout {
			t.Fatalf("%s: not after %v", what, timeout)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// stalls measures how long this process's goroutines wait to run once
// their timer fires: on a busy machine (other builds, CPU burners, the
// race detector) the process itself stalls, now and then for hundreds of
// milliseconds. Tests that bound a latency (a call ends by its deadline,
// the store recovers within a second) add the worst stall seen to their
// margin: a call late by no more than the process was stalled kept its
// deadline, while the bugs those bounds catch (a call that waits for Redis
// to answer, a breaker that stays open) are late by seconds, on a quiet
// machine or a busy one.
type stalls struct {
	worst atomic.Int64 // ns
	stop  chan struct{}
	done  chan struct{}
}

// watchStalls starts measuring stalls until the test ends.
func watchStalls(t *testing.T) *stalls {
	s := &stalls{stop: make(chan struct{}), done: make(chan struct{})}
	tick := time.NewTicker(time.Millisecond)
	go func() {
		defer close(s.done)
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case fired := <-tick.C:
				if late := int64(time.Since(fired)); late > s.worst.Load() {
					s.worst.Store(late)
				}
			}
		}
	}()
	t.Cleanup(func() {
		close(s.stop)
		<-s.done
		if t.Failed() {
			t.Logf("worst stall of this process: %v", s.Worst())
		}
	})
	return s
}

// Worst returns the longest stall seen so far.
func (s *stalls) Worst() time.Duration { return time.Duration(s.worst.Load()) }

// late makes up to 3 attempts of a timed step, each a fresh measurement
// (attempt returns how long it took and its bound), until one keeps its
// bound, logs each miss, and reports whether every attempt missed. A
// bound is strict (the worst stall seen on top, see stalls), and still a
// busy machine can miss it now and then: a thread of this process left
// waiting for a CPU holds up its goroutine unseen by the stall ticker on
// another thread (a take returned 408 ms after its 30 ms deadline with
// the worst stall at 44 ms). A bug that makes a call late (one that waits
// for Redis past its deadline, a breaker that stays open) makes it late
// every time.
func late(t testing.TB, what string, attempt func() (took, bound time.Duration)) bool {
	t.Helper()
	for i := 1; i <= 3; i++ {
		took, bound := attempt()
		if took <= bound {
			return false
		}
		t.Logf("%s: attempt %d of 3 took %v, over its bound of %v", what, i, took, bound)
	}
	return true
}

// warm makes checks (cost 0) of r on keys until 64 have succeeded (and
// each key's first), so that every connection the store's calls use is
// open before a test stops Redis: rueidis (v1.0.79, a single Redis)
// pipelines on 2^min(2, ⌊log2 GOMAXPROCS⌋) connections (1 with
// GOMAXPROCS 1, 2 with 2 or 3, 4 from 4 on), dials each on its first
// call and sends each keyed call on one picked at random (a PING always
// on the first); a call on one not yet dialled while Redis is stopped
// fails when the dial's handshake times out (at the dialer's 1 s for a
// caller with more time), and then waits up to 1 s more for the
// half-open connection to close, whatever the caller's deadline. 64
// successes leave one undialled with probability below 4·(3/4)^64 < 1e-7
// (with 4 connections, the most). A check that fails (a store whose
// Timeout a busy machine can miss) is tried again.
func warm(t *testing.T, s *Store, r *store.Rule, keys ...string) {
	t.Helper()
	out := make([]store.Decision, 1)
	var err error
	for ok, deadline := 0, time.Now().Add(30*time.Second); ok < max(64, len(keys)); {
		if time.Now().After(deadline) {
			t.Fatalf("warming: %d checks succeeded in 30 s, want %d; last error: %v", ok, max(64, len(keys)), err)
		}
		k := keys[ok%len(keys)]
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err = s.Take(ctx, time.Now().UnixNano(), []store.Hit{{Key: k, Rule: r, Veto: true}}, out)
		cancel()
		if err == nil {
			ok++
		}
	}
}

// TestTake_RedisKilledAndRestarted kills Redis under load: takes fail fast
// (the breaker opens), health says so, one WARN line says why, and within
// a second of Redis coming back takes succeed again, without a new store,
// and one INFO line says so. The latency bounds are this test's purpose;
// each allows the worst stall of this process on top (see stalls). An
// outage whose recovery missed its bound is followed by another, up to 3
// in all, and the test fails only if every one missed it (see late); a
// LogInterval of an hour keeps the lines to the first outage's.
func TestTake_RedisKilledAndRestarted(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 20 * time.Millisecond
	var logs logBuffer
	// (A killed Redis refuses or resets at once: no probe waits its
	// ProbeTimeout, which New's first ping waits on a busy machine.)
	s := open(t, Options{URL: "redis://" + srv.Addr, Timeout: timeout, ProbeInterval: 100 * time.Millisecond,
		ProbeTimeout: 10 * time.Second, Logger: logs.logger(), FailureMode: "error", LogInterval: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-runDone; err != nil {
			t.Error(err)
		}
	}()
	st := watchStalls(t)

	var l load
	stop := make(chan struct{})
	wg := l.run(t, s, 8, stop)
	defer func() { close(stop); wg.Wait() }()
	waitFor(t, 10*time.Second, "takes succeed", func() bool { return l.successes.Load() > 100 })

	outages := 0
	if late(t, "recovery after Redis restarted", func() (took, bound time.Duration) {
		outages++
		srv.Kill()
		killed := time.Now()
		waitFor(t, 10*time.Second, "health turns bad", func() bool { return !s.Healthy() })
		// Failing fast: the open breaker answers takes without a call.
		before := l.fast.Load()
		waitFor(t, 10*time.Second, "100 takes failed fast", func() bool { return l.fast.Load()-before >= 100 })
		// (By when the takes began, not when they were seen to end: a
		// take answered before the kill can be counted after a stall.)
		if ok := l.lastOK.Load(); ok > killed.UnixNano() {
			t.Errorf("a take that began %v after Redis was killed succeeded", time.Unix(0, ok).Sub(killed))
		}
		// The race detector on 2 cores is slow: a few times the deadline.
		if p := l.p99(); outages == 1 && p > 10*timeout+st.Worst() {
			t.Errorf("p99 of failed takes %v, want within a few times the %v deadline (worst stall %v)", p, timeout, st.Worst())
		}

		srv.Restart()
		restarted := time.Now().UnixNano()
		took = waitFor(t, 10*time.Second, "takes succeed after restart", func() bool { return l.lastOK.Load() > restarted })
		waitFor(t, 10*time.Second, "health recovers", s.Healthy)
		return took, time.Second + st.Worst()
	}) {
		t.Errorf("recovered over 1s after Redis restarted (plus the worst stall %v) in each of 3 outages, want within it", st.Worst())
	}
	waitFor(t, 10*time.Second, "INFO line", func() bool { return len(logs.lines("INFO")) > 0 })
	warn, info := logs.lines("WARN"), logs.lines("INFO")
	if len(warn) != 1 || !strings.Contains(warn[0], "addr="+srv.Addr) || !strings.Contains(warn[0], "failure_mode=error") {
		t.Errorf("WARN lines %q, want one naming the address and the failure mode", warn)
	}
	if len(info) != 1 || !strings.Contains(info[0], "outage=") || !strings.Contains(info[0], "answered_by_failure_mode=") {
		t.Errorf("INFO lines %q, want one with the outage", info)
	}
}

// TestTake_SlowRedis: a Redis that answers nothing (stopped: as busy as a
// long script or DEBUG SLEEP makes it) does not hold a take past its
// deadline. How late a take may return is this test's purpose: a few
// times the deadline, plus the worst stall of this process (see stalls);
// a take that returns later is taken again, up to 3 times in all, and
// fails the test only if each was late (see late). The same on a key in
// the reference's layout (runIncr's pipeline, whose reply is still read
// after its caller gave up).
func TestTake_SlowRedis(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "sluice", true: "reference"}[plain], func(t *testing.T) { testSlowRedis(t, plain) })
	}
}

func testSlowRedis(t *testing.T, plain bool) {
	srv := redistest.Start(t)
	const timeout = 30 * time.Millisecond
	// (A breaker that stays closed keeps every take going to Redis; no
	// probe runs, but New's first ping waits the ProbeTimeout.)
	s := open(t, Options{URL: "redis://" + srv.Addr, Timeout: timeout, NoLocalCache: true, BreakerFailures: 1 << 30,
		ProbeTimeout: 10 * time.Second})
	st := watchStalls(t)
	r := must(store.NewFixedWindow(10, time.Minute))
	hits := []store.Hit{{Key: "slow", Rule: r, Cost: 1, Veto: true, Plain: plain}}
	warm(t, s, r, "slow")
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	take := func(what string) {
		if late(t, what, func() (time.Duration, time.Duration) {
			t0 := time.Now()
			err := s.Take(context.Background(), t0.UnixNano(), hits, make([]store.Decision, 1))
			took := time.Since(t0)
			if err == nil {
				t.Errorf("%s: no error after %v", what, took)
			}
			return took, 10*timeout + st.Worst()
		}) {
			t.Errorf("%s: 3 takes each later than 10 times the %v deadline plus the worst stall %v, want an error at about the deadline",
				what, timeout, st.Worst())
		}
	}
	take("take while Redis answers nothing")
	// Concurrent takes queue behind the calls in flight; each still fails
	// by its own deadline, not its call's.
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() { take("concurrent take while Redis answers nothing") })
	}
	wg.Wait()
	srv.Resume()
	resumed = true
	out := make([]store.Decision, 1)
	waitFor(t, 10*time.Second, "takes succeed once Redis answers", func() bool {
		return s.Take(context.Background(), time.Now().UnixNano(), hits, out) == nil
	})
}

func TestBreaker(t *testing.T) {
	now := time.Unix(100, 0)
	var changes []bool
	b := newBreaker(2, time.Second, 50*time.Millisecond, func() time.Time { return now }, func(open bool) { changes = append(changes, open) })
	wait := func(d time.Duration) func() { return func() { now = now.Add(d) } }
	steps := []struct {
		do         func()
		allow, clo bool
	}{
		{func() {}, true, true},
		{b.failure, true, true},
		{b.failure, true, true}, // two in a row, but a success 0s ago
		{wait(50 * time.Millisecond), true, true},
		{b.failure, false, false}, // no success for the window: opens
		{wait(999 * time.Millisecond), false, false},
		{wait(time.Millisecond), true, false}, // one probe
		{func() {}, false, false},             // only one
		{b.failure, false, false},
		{wait(time.Second), true, false},
		{b.success, true, true},
		{b.failure, true, true}, // the count started over
		{wait(time.Second), true, true},
		{b.failure, false, false},
		{b.trip, false, false}, // already open: no transition
		{b.success, true, true},
		{b.trip, false, false}, // a failed probe opens it at once
		{wait(time.Second), true, false},
		{b.success, true, true},
	}
	for i, st := range steps {
		st.do()
		if got := b.allow(); got != st.allow {
			t.Fatalf("step %d: allow() = %v, want %v", i, got, st.allow)
		}
		if got := b.closed(); got != st.clo {
			t.Fatalf("step %d: closed() = %v, want %v", i, got, st.clo)
		}
	}
	if want := []bool{true, false, true, false, true, false}; !slices.Equal(changes, want) {
		t.Errorf("transitions %v, want %v", changes, want)
	}
	if o, c := b.opens.Load(), b.closes.Load(); o != 3 || c != 3 {
		t.Errorf("%d opens and %d closes, want 3 and 3", o, c)
	}
}

// TestUnreachable: only errors that say Redis could not be reached count
// against it; a call out of time, a caller that gave up and our own
// reply checks do not.
func TestUnreachable(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("redis: %w", context.DeadlineExceeded), false},
		{fmt.Errorf("redis: %w", context.Canceled), false},
		{errors.New("redis: window script answered 3 values for 1 requests of 1 keys"), false},
		{fmt.Errorf("redis: %w", refused), true},
		{fmt.Errorf("redis: %w", io.EOF), true},
		{fmt.Errorf("redis: %w", rueidis.ErrClosing), true},
		{fmt.Errorf("redis: %w", syscall.ECONNRESET), true},
		{fmt.Errorf("redis: %w", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}), true},
	} {
		if got := unreachable(tc.err); got != tc.want {
			t.Errorf("unreachable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestFailedCall_PastItsDeadline: a call that fails once its deadline has
// passed ran out of time, whatever its error: a dial the deadline cut
// short fails as "dial tcp …: i/o timeout", a net.Error as a silent
// connection's read is. Counted against Redis, three such opened the
// breaker of TestChaos_TimeoutsProbeSparingly (callers of 200 µs) with
// Redis healthy, in 2 runs of 30: their ctx ends a margin after the
// call's deadline, so the failure was not the caller giving up. Before
// its deadline the same error counts.
func TestFailedCall_PastItsDeadline(t *testing.T) {
	s := &Store{kick: make(chan struct{}, 1)}
	s.breaker = newBreaker(1, time.Hour, 0, time.Now, nil)
	dial := fmt.Errorf("redis: %w", &net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded})
	s.failedCall(context.Background(), time.Now(), dial)
	if !s.breaker.closed() || s.lastTimeout.Load() == 0 || len(s.kick) != 1 {
		t.Errorf("a dial timeout at the call's deadline: breaker closed %v, timeout recorded %v, probe asked %v; want a timeout, not Redis down",
			s.breaker.closed(), s.lastTimeout.Load() != 0, len(s.kick) == 1)
	}
	s.failedCall(context.Background(), time.Now().Add(time.Hour), dial)
	if s.breaker.closed() {
		t.Error("a dial timeout an hour before the call's deadline: the breaker is closed, want it open")
	}
}

// TestTake_NoTimeLeftKeepsTheProbe: a caller whose deadline has passed
// does not use up the open breaker's one probe call; the next caller with
// time is the probe, and Redis's answer closes the breaker.
func TestTake_NoTimeLeftKeepsTheProbe(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, BreakerCooldown: time.Hour})
	s.breaker.trip()
	// Past the cooldown: the next call to Redis is the probe; after it
	// the breaker waits an hour.
	s.breaker.openUntil.Store(time.Now().Add(-time.Second).UnixNano())
	r := must(store.NewFixedWindow(10, time.Hour))
	hits := []store.Hit{{Key: "probe", Rule: r, Cost: 1}}
	out := make([]store.Decision, 1)
	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := s.Take(expired, time.Now().UnixNano(), hits, out); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take with no time left: %v, want a deadline error", err)
	}
	if err := s.Take(context.Background(), time.Now().UnixNano(), hits, out); err != nil || !out[0].Allowed {
		t.Fatalf("the probe Take: %v %+v, want allowed (the expired caller must not have used the probe)", err, out[0])
	}
	if !s.breaker.closed() {
		t.Error("the breaker is still open after the probe's answer")
	}
}
