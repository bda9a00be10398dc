package redis

import (
	"bytes"
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

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// logBuffer collects a logger's lines. Safe for concurrent use.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// lines returns the lines logged at level ("WARN", "INFO").
func (l *logBuffer) lines(level string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, ln := range strings.Split(l.b.String(), "\n") {
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
// call is answered, and exactly 100 are allowed. The stores' ceiling is
// raised to match (the race detector, GOMAXPROCS=1 and the rest of `make
// test` on two cores put a call's tail past the 1 s default); e01d1eb,
// which ignored callers' deadlines, failed all 600 calls at its 10 ms.
func TestChaos_StarvedInstancesShareLimits(t *testing.T) {
	srv := redistest.Start(t)
	prefix := fmt.Sprintf("starved%d:", prefixes.Add(1))
	var stores [3]*Store
	for i := range stores {
		stores[i] = running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: prefix, NoLocalCache: true, Timeout: 10 * time.Second})
	}
	a, b := must(store.NewFixedWindow(100, time.Hour)), must(store.NewFixedWindow(1000, time.Hour))

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

// TestChaos_SlowRedisIsNotDown: Redis busy for 300 ms (DEBUG SLEEP) under
// load. Callers with Envoy's 20 ms deadline get an error within it;
// callers that allow 3 s get their answer; the breaker does not open, and
// nothing is logged: a slow Redis is not a dead one.
func TestChaos_SlowRedisIsNotDown(t *testing.T) {
	srv := redistest.Start(t, "--enable-debug-command", "local")
	var logs logBuffer
	s := running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "slow:", NoLocalCache: true, Logger: logs.logger()})
	r := must(store.NewFixedWindow(1_000_000, time.Hour))
	take := func(key string, deadline time.Duration) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		t0 := time.Now()
		err := s.Take(ctx, t0.UnixNano(), []store.Hit{{Key: key, Rule: r, Cost: 1, Veto: true}}, make([]store.Decision, 1))
		return time.Since(t0), err
	}
	if _, err := take("warm", time.Second); err != nil {
		t.Fatal(err)
	}
	awake := debugSleep(t, srv, "0.3")
	// Wait until Redis sleeps: a short call fails.
	waitFor(t, 5*time.Second, "Redis asleep", func() bool { _, err := take("probe", 20*time.Millisecond); return err != nil })
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			if g%2 == 0 {
				// The race detector on a busy machine: a few ms late.
				if took, err := take(fmt.Sprint("short", g), 20*time.Millisecond); err == nil || took > 20*time.Millisecond+50*time.Millisecond {
					t.Errorf("20ms caller during DEBUG SLEEP: %v after %v, want an error within its deadline", err, took)
				}
				return
			}
			if took, err := take(fmt.Sprint("long", g), 3*time.Second); err != nil {
				t.Errorf("3s caller during a 300ms DEBUG SLEEP: %v after %v, want an answer", err, took)
			}
		})
	}
	wg.Wait()
	awake()
	if st := s.Stats(); st.Opens != 0 {
		t.Errorf("the breaker opened %d times for a 300ms stall", st.Opens)
	}
	if w := logs.lines("WARN"); len(w) != 0 {
		t.Errorf("logged %q for a 300ms stall", w)
	}
}

// TestChaos_RedisPaused: Redis stopped (SIGSTOP) under load from callers
// with Envoy's 20 ms deadline. Each call ends within its deadline; the
// probe and the one sent after it open the breaker within two
// ProbeTimeouts; one WARN line names the address, the cause and the
// failure mode; Status says down; once Redis
// continues, calls succeed within a second and one INFO line gives the
// outage and the calls answered by the failure mode.
func TestChaos_RedisPaused(t *testing.T) {
	srv := redistest.Start(t)
	var logs logBuffer
	s := running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "paused:", NoLocalCache: true,
		Logger: logs.logger(), FailureMode: "allow", ProbeInterval: 200 * time.Millisecond})
	r := must(store.NewFixedWindow(1_000_000_000, time.Hour))
	var lastOK atomic.Int64
	var calls, slow atomic.Int64
	var worst atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			hits := []store.Hit{{Key: fmt.Sprint("k", g), Rule: r, Cost: 1, Veto: true}}
			out := make([]store.Decision, 1)
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				t0 := time.Now()
				err := s.Take(ctx, t0.UnixNano(), hits, out)
				took := time.Since(t0)
				cancel()
				calls.Add(1)
				if err == nil {
					lastOK.Store(time.Now().UnixNano())
				}
				// The race detector on a busy 2-core machine: a few ms late.
				if took > 20*time.Millisecond+30*time.Millisecond {
					slow.Add(1)
				}
				for w := worst.Load(); int64(took) > w && !worst.CompareAndSwap(w, int64(took)); w = worst.Load() {
				}
				if err != nil {
					time.Sleep(time.Millisecond)
				}
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	waitFor(t, 5*time.Second, "takes succeed", func() bool { return lastOK.Load() != 0 })

	waitFor(t, 2*time.Second, "a probe", func() bool { return s.Status().LastLatency > 0 })
	if st := s.Status(); st.State == StateDown || st.Breaker != "closed" || st.LastLatency <= 0 || st.Addr != srv.Addr || !st.OutageStart.IsZero() {
		t.Errorf("status with Redis up: %+v", st)
	}
	srv.Pause()
	paused := time.Now()
	took := waitFor(t, 5*time.Second, "breaker opens", func() bool { return !s.Healthy() })
	if took > 1500*time.Millisecond {
		t.Errorf("breaker opened %v after Redis stopped, want within two 500ms probe timeouts in a row (after a first timeout)", took)
	}
	if st := s.Status(); st.State != StateDown || st.OutageStart.Before(paused) || st.LastError == "" {
		t.Errorf("status while paused: %+v, want down since the pause, with the cause", st)
	}
	time.Sleep(300 * time.Millisecond)
	srv.Resume()
	resumed := time.Now().UnixNano()
	if took := waitFor(t, 3*time.Second, "takes succeed after SIGCONT", func() bool { return lastOK.Load() > resumed }); took > time.Second {
		t.Errorf("recovered %v after Redis continued, want within 1s", took)
	}
	waitFor(t, 2*time.Second, "INFO line", func() bool { return len(logs.lines("INFO")) > 0 })
	// (A shared 2-core machine running the race detector stalls a
	// goroutine for 100 ms now and then: 2 % may be late.)
	if n := slow.Load(); n > calls.Load()/50 {
		t.Errorf("%d of %d calls outlived their 20ms deadline by 30ms or more (worst %v)", n, calls.Load(), time.Duration(worst.Load()))
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
	if st := s.Stats(); st.Opens != 1 || st.Closes != 1 {
		t.Errorf("%d opens and %d closes, want 1 and 1", st.Opens, st.Closes)
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
// the breaker stays closed.
func TestChaos_TimeoutsProbeSparingly(t *testing.T) {
	srv := redistest.Start(t)
	s := running(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "short:", NoLocalCache: true})
	r := must(store.NewFixedWindow(1_000_000_000, time.Hour))
	before := s.Stats().Probes
	var timeouts atomic.Int64
	stop := time.Now().Add(time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			hits := []store.Hit{{Key: fmt.Sprint("k", g), Rule: r, Cost: 1, Veto: true}}
			out := make([]store.Decision, 1)
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Microsecond)
				if err := s.Take(ctx, time.Now().UnixNano(), hits, out); errors.Is(err, context.DeadlineExceeded) {
					timeouts.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	// One probe per 100 ms cooldown in a second, and the first at once.
	if n := s.Stats().Probes - before; n > 15 {
		t.Errorf("%d probes in a second of %d timeouts, want at most ~11", n, timeouts.Load())
	}
	if timeouts.Load() < 100 {
		t.Errorf("only %d timeouts: the test did not test", timeouts.Load())
	}
	if st := s.Stats(); st.Opens != 0 {
		t.Errorf("the breaker opened %d times on timeouts with Redis healthy", st.Opens)
	}
}
