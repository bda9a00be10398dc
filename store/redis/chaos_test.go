package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

// logBuffer collects a logger's lines. Safe for concurrent use.
type logBuffer struct{ logbuf.Buffer }

// lines returns the lines logged at level ("WARN", "INFO").
func (l *logBuffer) lines(level string) []string {
	var out []string
	for _, ln := range strings.Split(l.String(), "\n") {
		if strings.Contains(ln, "level="+level+" ") {
			out = append(out, ln)
		}
	}
	return out
}

func (l *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

// running opens a store with opt as a deployment would (no Timeout is
// filled in) and runs its probe until the test ends.
func running(t *testing.T, opt Options) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
		s.Close()
	})
	return s
}

// starve leaves this process one P shared with busy goroutines that
// never block, as a CPU-throttled pod or an overloaded node would, until
// the returned func is called.
func starve(busy int) (stop func()) {
	prev := runtime.GOMAXPROCS(1)
	done := make(chan struct{})
	var wg sync.WaitGroup
	var sink atomic.Uint64
	for range busy {
		wg.Go(func() {
			x := uint64(1)
			for {
				select {
				case <-done:
					sink.Add(x)
					return
				default:
				}
				for range 10_000 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
		runtime.GOMAXPROCS(prev)
	}
}

// TestChaos_StarvedInstancesShareLimits: three stores (three Sluice
// instances) on one Redis, this process starved (one P, busy goroutines),
// 32 callers round-robin over them, each request two descriptors on hot
// shared keys (100/hour and 1000/hour), each caller allowing 10 s: every
// call is answered, and exactly 100 are allowed. The stores' ceiling and
// their probes' timeout are raised to match (the race detector,
// GOMAXPROCS=1 and the rest of `make test` on a busy two-core machine put
// a call's tail past the 1 s default, and a probe's PONG past its 500 ms:
// a probe that times out opens the breaker, which TestChaos_RedisPaused
// tests); e01d1eb, which ignored callers' deadlines, failed all 600 calls
// at its 10 ms.
func TestChaos_StarvedInstancesShareLimits(t *testing.T) {
	srv := redistest.Start(t)
	prefix := fmt.Sprintf("starved%d:", prefixes.Add(1))
	var stores [3]*Store
	for i := range stores {
		stores[i] = running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: prefix, NoLocalCache: true,
			Timeout: 10 * time.Second, ProbeTimeout: 10 * time.Second})
	}
	a, b := must(store.NewFixedWindow(100, time.Hour)), must(store.NewFixedWindow(1000, time.Hour))
	// Each store's connections are dialled before the starving: a dial's
	// handshake has rueidis' 1 s, whatever the caller's 10 s.
	for _, s := range stores {
		warm(t, s, a, "a")
	}

	const callers, requests = 32, 600
	var next, allowed, denied atomic.Int64
	var mu sync.Mutex
	var errs []error
	stop := starve(4)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			hits := []store.Hit{{Key: "a", Rule: a, Cost: 1, Veto: true}, {Key: "b", Rule: b, Cost: 1, Veto: true}}
			out := make([]store.Decision, 2)
			for {
				n := next.Add(1) - 1
				if n >= requests {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := stores[n%3].Take(ctx, time.Now().UnixNano(), hits, out)
				cancel()
				switch {
				case err != nil:
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				case out[0].Allowed && out[1].Allowed:
					allowed.Add(1)
				default:
					denied.Add(1)
				}
			}
		})
	}
	wg.Wait()
	stop()
	if len(errs) > 0 {
		t.Errorf("%d of %d calls failed while Redis was up, first: %v", len(errs), requests, errs[0])
	}
	if got := allowed.Load(); got != 100 {
		t.Errorf("%d requests allowed, want exactly the limit of 100 (%d denied)", got, denied.Load())
	}
	for i, s := range stores {
		if st := s.Stats(); st.Opens != 0 {
			t.Errorf("store %d: the breaker opened %d times with Redis up", i, st.Opens)
		}
	}
}

// TestChaos_SlowRedisIsNotDown: Redis answers nothing for a while (stopped,
// as a long script or DEBUG SLEEP makes it) under load. Callers with
// Envoy's 20 ms deadline get an error within it; callers that allow more
// get their answer once Redis answers; the breaker does not open, and
// nothing is logged: a slow Redis is not a dead one. The stall lasts until
// the short callers have failed, however long a busy machine takes to run
// them; the probes' timeout and the store's ceiling are set well above
// that, since this test is about what a stall shorter than them does (a
// longer one is TestChaos_RedisPaused). How late a short caller may return
// is a timing bound: 50 ms plus the worst stall of this process (see
// stalls); a caller that returns later calls again, up to 3 times in all,
// and fails the test only if each call was late (see late).
func TestChaos_SlowRedisIsNotDown(t *testing.T) {
	srv := redistest.Start(t)
	var logs logBuffer
	s := running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "slow:", NoLocalCache: true, Logger: logs.logger(),
		Timeout: time.Minute, ProbeTimeout: time.Minute})
	st := watchStalls(t)
	r := must(store.NewFixedWindow(1_000_000, time.Hour))
	// take returns how long it took from its context's start.
	take := func(key string, deadline time.Duration) (took time.Duration, err error) {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		err = s.Take(ctx, time.Now().UnixNano(), []store.Hit{{Key: key, Rule: r, Cost: 1, Veto: true}}, make([]store.Decision, 1))
		return time.Since(t0), err
	}
	keys := make([]string, 16)
	for g := range keys {
		keys[g] = fmt.Sprint("long", g)
		if g%2 == 0 {
			keys[g] = fmt.Sprint("short", g)
		}
	}
	warm(t, s, r, keys...)
	probes, latency := s.Stats().Probes, s.Status().LastLatency
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	var short, long sync.WaitGroup
	for g := range 16 {
		if g%2 == 0 {
			short.Go(func() {
				const what = "20ms caller while Redis answers nothing"
				if late(t, what, func() (time.Duration, time.Duration) {
					took, err := take(keys[g], 20*time.Millisecond)
					if err == nil {
						t.Errorf("%s: no error after %v", what, took)
					}
					return took, 20*time.Millisecond + 50*time.Millisecond + st.Worst()
				}) {
					t.Errorf("%s: 3 calls each later than its deadline by 50ms plus the worst stall %v, want an error within the deadline", what, st.Worst())
				}
			})
			continue
		}
		long.Go(func() {
			if took, err := take(keys[g], 30*time.Second); err != nil {
				t.Errorf("30s caller during a short stall: %v after %v, want an answer", err, took)
			}
		})
	}
	short.Wait()
	// The short callers' timeouts asked Run for a probe, which waits.
	waitFor(t, 10*time.Second, "a probe", func() bool { return s.Stats().Probes > probes })
	srv.Resume()
	resumed = true
	long.Wait()
	waitFor(t, 10*time.Second, "the probe answered", func() bool { return s.Status().LastLatency != latency })
	if st := s.Stats(); st.Opens != 0 {
		t.Errorf("the breaker opened %d times for a short stall", st.Opens)
	}
	if w := logs.lines("WARN"); len(w) != 0 {
		t.Errorf("logged %q for a short stall", w)
	}
}

// TestChaos_RedisPaused: Redis stopped (SIGSTOP) under load from callers
// with Envoy's 20 ms deadline. Each call ends within its deadline; the
// probe and the one sent after it open the breaker within two
// ProbeTimeouts; one WARN line names the address, the cause and the
// failure mode; Status says down; once Redis
// continues, calls succeed within a second and one INFO line gives the
// outage and the calls answered by the failure mode. These latency bounds
// are the test's purpose; each allows the worst stall of this process on
// top (see stalls). The bounds of the breaker's opening and of the
// recovery are each measured once per outage: an outage that missed
// either is followed by another (Redis stopped again), up to 3 in all,
// and the test fails only if every outage missed the same bound (see
// late); a LogInterval of an hour keeps the lines to the first outage's.
func TestChaos_RedisPaused(t *testing.T) {
	srv := redistest.Start(t)
	var logs logBuffer
	s := running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "paused:", NoLocalCache: true,
		Logger: logs.logger(), FailureMode: "allow", ProbeInterval: 200 * time.Millisecond, LogInterval: time.Hour})
	st := watchStalls(t)
	r := must(store.NewFixedWindow(1_000_000_000, time.Hour))
	var lastOK atomic.Int64
	var calls, slow atomic.Int64
	var worst atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		hits := []store.Hit{{Key: fmt.Sprint("k", g), Rule: r, Cost: 1, Veto: true}}
		wg.Go(func() {
			storetest.Repeat(s, hits, 20*time.Millisecond, stop, func(_ time.Time, took time.Duration, err error) bool {
				calls.Add(1)
				if err == nil {
					lastOK.Store(time.Now().UnixNano())
				}
				// The race detector on a busy 2-core machine: a few ms late,
				// and more when the whole process stalls.
				if took > 20*time.Millisecond+30*time.Millisecond+st.Worst() {
					slow.Add(1)
				}
				storetest.RaiseTo(&worst, int64(took))
				return err != nil
			})
		})
	}
	defer func() { close(stop); wg.Wait() }()
	waitFor(t, 10*time.Second, "takes succeed", func() bool { return lastOK.Load() != 0 })

	waitFor(t, 10*time.Second, "a probe", func() bool { return s.Status().LastLatency > 0 })
	if st := s.Status(); st.State == StateDown || st.Breaker != "closed" || st.LastLatency <= 0 || st.Addr != srv.Addr || !st.OutageStart.IsZero() {
		t.Errorf("status with Redis up: %+v", st)
	}
	// opened and recovered: the bounds some outage kept.
	outages, opened, recovered := 0, false, false
	for outages < 3 && !(opened && recovered) {
		outages++
		srv.Pause()
		paused := time.Now()
		took := waitFor(t, 10*time.Second, "breaker opens", func() bool { return !s.Healthy() })
		if bound := 1500*time.Millisecond + st.Worst(); took <= bound {
			opened = true
		} else {
			t.Logf("outage %d of 3: the breaker opened %v after Redis stopped, over its bound of %v", outages, took, bound)
		}
		if st := s.Status(); st.State != StateDown || st.OutageStart.Before(paused) || st.LastError == "" {
			t.Errorf("status while paused: %+v, want down since the pause, with the cause", st)
		}
		// Calls go on failing fast (answered by the failure mode) for a
		// while.
		answered := s.Stats().Failed
		waitFor(t, 10*time.Second, "calls answered while down", func() bool { return s.Stats().Failed >= answered+100 })
		srv.Resume()
		resumed := time.Now().UnixNano()
		took = waitFor(t, 10*time.Second, "takes succeed after SIGCONT", func() bool { return lastOK.Load() > resumed })
		if bound := time.Second + st.Worst(); took <= bound {
			recovered = true
		} else {
			t.Logf("outage %d of 3: recovered %v after Redis continued, over its bound of %v", outages, took, bound)
		}
	}
	if !opened {
		t.Errorf("in each of 3 outages the breaker opened later than two 500ms probe timeouts in a row after a first timeout (1.5s) plus the worst stall %v after Redis stopped",
			st.Worst())
	}
	if !recovered {
		t.Errorf("in each of 3 outages takes succeeded later than 1s plus the worst stall %v after Redis continued", st.Worst())
	}
	waitFor(t, 10*time.Second, "INFO line", func() bool { return len(logs.lines("INFO")) > 0 })
	// (A stall shorter than the worst may still add up with the call's own
	// scheduling: 2 % may be late.)
	if n := slow.Load(); n > calls.Load()/50 {
		t.Errorf("%d of %d calls outlived their 20ms deadline by 30ms plus the worst stall %v or more (worst call %v)",
			n, calls.Load(), st.Worst(), time.Duration(worst.Load()))
	}
	warn, info := logs.lines("WARN"), logs.lines("INFO")
	if len(warn) != 1 || !strings.Contains(warn[0], "addr="+srv.Addr) || !strings.Contains(warn[0], "failure_mode=allow") ||
		!strings.Contains(warn[0], "cause=") {
		t.Errorf("WARN lines %q, want one with the address, cause and failure mode", warn)
	}
	if len(info) != 1 || !strings.Contains(info[0], "outage=") || strings.Contains(info[0], "answered_by_failure_mode=0 ") ||
		!strings.Contains(info[0], "answered_by_failure_mode=") {
		t.Errorf("INFO lines %q, want one with the outage and the calls answered meanwhile", info)
	}
	if st := s.Stats(); st.Opens != uint64(outages) || st.Closes != uint64(outages) {
		t.Errorf("%d opens and %d closes in %d outages, want one each per outage", st.Opens, st.Closes, outages)
	}
	if st := s.Status(); st.Breaker != "closed" || !st.OutageStart.IsZero() {
		t.Errorf("status after recovery: %+v", st)
	}
}

// TestTransitionLog_RateLimited: a flapping Redis gets one WARN and one
// INFO line per LogInterval; the outages in between are counted in the
// next WARN line, and every transition in the counters.
func TestTransitionLog_RateLimited(t *testing.T) {
	now := time.Unix(1000, 0)
	var logs logBuffer
	s := &Store{addr: "127.0.0.1:6379", opt: Options{Logger: logs.logger(), LogInterval: 10 * time.Second, FailureMode: "deny"}}
	s.breaker = newBreaker(1, 100*time.Millisecond, 0, func() time.Time { return now }, nil)
	var lg transitionLog
	cause := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	s.lastErr.Store(&cause)
	// Ten outages of 1 s, each 1 s apart: at 1000, 1002, ... 1018 s.
	for range 10 {
		s.breaker.trip()
		lg.report(s, now)
		s.failed.Add(5)
		now = now.Add(time.Second)
		s.breaker.success()
		lg.report(s, now)
		now = now.Add(time.Second)
	}
	warn, info := logs.lines("WARN"), logs.lines("INFO")
	if len(warn) != 2 || len(info) != 2 {
		t.Fatalf("%d WARN and %d INFO lines for 10 outages in 20s, want 2 and 2:\n%s\n%s", len(warn), len(info), warn, info)
	}
	if !strings.Contains(warn[0], "connection refused") || !strings.Contains(warn[0], "failure_mode=deny") ||
		strings.Contains(warn[0], "outages_not_logged") {
		t.Errorf("first WARN %q", warn[0])
	}
	if !strings.Contains(warn[1], "outages_not_logged=4") {
		t.Errorf("second WARN %q, want the 4 outages in between counted", warn[1])
	}
	if !strings.Contains(info[0], "outage=1s") || !strings.Contains(info[0], "answered_by_failure_mode=5") {
		t.Errorf("INFO %q, want the outage of 1s and its 5 answers", info[0])
	}
	if o, c := s.breaker.opens.Load(), s.breaker.closes.Load(); o != 10 || c != 10 {
		t.Errorf("%d opens and %d closes, want 10 and 10", o, c)
	}
}

// TestChaos_TimeoutsProbeSparingly: callers whose deadlines are too short
// for any answer time out by the thousand against a healthy Redis; each
// timeout asks for a probe, but probes stay a BreakerCooldown apart, and
// the breaker stays closed. The callers run for a second and until 100
// have timed out (a busy machine runs fewer); the bound on probes follows
// the time they ran. The probes' timeout is raised: eight goroutines that
// never block starve this process, and a probe whose PONG comes later than
// its default 500 ms opens the breaker (TestChaos_RedisPaused tests that);
// here only the timeouts may not.
func TestChaos_TimeoutsProbeSparingly(t *testing.T) {
	srv := redistest.Start(t)
	s := running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "short:", NoLocalCache: true, ProbeTimeout: time.Minute})
	r := must(store.NewFixedWindow(1_000_000_000, time.Hour))
	before := s.Stats().Probes
	var timeouts atomic.Int64
	start := time.Now()
	minEnd := start.Add(time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			hits := []store.Hit{{Key: fmt.Sprint("k", g), Rule: r, Cost: 1, Veto: true}}
			out := make([]store.Decision, 1)
			for time.Now().Before(minEnd) || timeouts.Load() < 100 && time.Since(start) < time.Minute {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Microsecond)
				if err := s.Take(ctx, time.Now().UnixNano(), hits, out); errors.Is(err, context.DeadlineExceeded) {
					timeouts.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	// One probe per 100 ms cooldown and the first at once: ~11 in a
	// second.
	n, ran := s.Stats().Probes-before, time.Since(start)
	if limit := uint64(ran/(100*time.Millisecond)) + 5; n > limit {
		t.Errorf("%d probes in %v of %d timeouts, want at most %d", n, ran, timeouts.Load(), limit)
	}
	if timeouts.Load() < 100 {
		t.Errorf("only %d timeouts: the test did not test", timeouts.Load())
	}
	if st := s.Stats(); st.Opens != 0 {
		t.Errorf("the breaker opened %d times on timeouts with Redis healthy; last cause: %s", st.Opens, s.Status().LastError)
	}
}
