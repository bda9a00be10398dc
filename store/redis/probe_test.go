package redis

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestRun_StalledProbeIsNoEvidence: a probe that timed out long after its
// deadline (this process, or its machine, did not run meanwhile: the
// churn soak saw replicas frozen for seconds with Redis up) does not open
// the breaker; the probe is sent again at once, and Redis's answer keeps
// it closed. The stall is simulated: Redis is paused during the first
// probe, which then reports a 10 s wait and resumes Redis, as a process
// frozen across its deadline finds it on waking.
func TestRun_StalledProbeIsNoEvidence(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := New(ctx, Options{URL: "redis://" + srv.Addr, ProbeInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stalled atomic.Bool
	s.probeWait = func(start time.Time) time.Duration {
		if stalled.CompareAndSwap(true, false) {
			srv.Resume()
			return 10 * time.Second
		}
		return time.Since(start)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(runCtx) }()
	defer func() { stop(); <-done }()

	srv.Pause()
	stalled.Store(true)
	s.wake()
	waitFor(t, 5*time.Second, "the probe after the stall", func() bool { return s.Stats().Probes >= 2 && s.Status().LastLatency > 0 })
	if st := s.Stats(); st.Opens != 0 || !s.Healthy() {
		t.Errorf("a probe that overran its deadline by 9.5 s opened the breaker (%d openings, healthy %v), with Redis answering the next probe at once",
			st.Opens, s.Healthy())
	}

	// A probe that times out on time is evidence: a silent Redis opens it.
	srv.Pause()
	defer srv.Resume()
	s.wake()
	waitFor(t, 5*time.Second, "the breaker opens on a silent Redis", func() bool { return !s.Healthy() })
}
