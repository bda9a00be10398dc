package redis

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestRun_OneFailedProbeIsNoEvidence: a probe without PONG in time is sent
// again at once, and only a second failure in a row opens the breaker. In
// the churn soak, replicas starved or frozen for 0.5 to 15 s with Redis up
// missed a probe's deadline and opened the breaker, failing requests that
// Redis would have answered. Here Redis is paused during the first probe
// and resumed as it fails, as a process that missed its deadline finds
// Redis on waking; then paused for good, which opens the breaker.
func TestRun_OneFailedProbeIsNoEvidence(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, Options{URL: "redis://" + srv.Addr, ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The probes sent by the time the breaker opened (after that Run
	// probes again every BreakerCooldown, 100 ms, which a busy machine
	// can let pass before the test looks).
	var probesAtOpen atomic.Uint64
	s.breaker.changed = func(open bool) {
		if open {
			probesAtOpen.Store(s.probes.Load())
		}
		s.wake()
	}
	var resumeAfterProbe atomic.Bool
	s.probeWait = func(start time.Time) time.Duration {
		if resumeAfterProbe.CompareAndSwap(true, false) {
			srv.Resume()
		}
		return time.Since(start)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	defer func() { stop(); <-done }()

	srv.Pause()
	resumeAfterProbe.Store(true)
	s.wake()
	waitFor(t, 10*time.Second, "the probe after the failed one", func() bool { return s.Stats().Probes >= 2 && s.Status().LastLatency > 0 })
	if st := s.Stats(); st.Opens != 0 || !s.Healthy() {
		t.Errorf("one failed probe, Redis answering the next sent at once: %d breaker openings (healthy %v), want none", st.Opens, s.Healthy())
	}

	srv.Pause()
	defer srv.Resume()
	before := s.Stats().Probes
	s.wake()
	waitFor(t, 10*time.Second, "the breaker opens on a silent Redis", func() bool { return !s.Healthy() })
	if st := s.Status(); probesAtOpen.Load()-before != 2 || !strings.Contains(st.LastError, "the probe before it failed too") {
		t.Errorf("opened after %d probes, cause %q; want 2, the cause saying so", probesAtOpen.Load()-before, st.LastError)
	}
}
