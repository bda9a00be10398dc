package main

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// soak drives the instances for the soak's duration (bench chunks,
// canaries, Redis restarts, limits rewrites) while sampling them into w.
func (f *fleet) soak(ctx context.Context, perStream float64, w *csv.Writer) *record {
	rec := &record{start: time.Now(), can: newCanaries(f.s.canaryLimit)}
	runCtx, cancel := context.WithDeadline(ctx, rec.start.Add(f.s.duration))
	defer cancel()
	var wg sync.WaitGroup
	for _, in := range f.insts {
		wg.Go(func() { f.chunks(runCtx, in, perStream, rec) })
	}
	wg.Go(func() { rec.can.run(runCtx, f.insts, f.s.canaryRate, &rec.down) })
	wg.Go(func() {
		if err := f.redis.RestartEvery(runCtx, restartPlan(f.s.restartEvery, rec.can), &rec.down); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
		}
	})
	wg.Go(func() { f.rewrites(runCtx, rec) })
	rec.total = f.sample(runCtx, rec, w)
	wg.Wait()
	// The last chunks ended after the last sample.
	for _, in := range f.insts {
		rec.total.add(in.window)
	}
	return rec
}

// chunks runs `sluice bench` chunks of -sample on in, in the open loop at
// rate, until the soak ends, counting their outcomes. The failures of a
// Redis instance's chunk that overlaps a Redis-down interval are excused.
func (f *fleet) chunks(ctx context.Context, in *instance, rate float64, rec *record) {
	end, _ := ctx.Deadline()
	for ctx.Err() == nil {
		left := time.Until(end)
		if left < time.Second {
			return
		}
		t0 := time.Now()
		r, err := bench(ctx, f.s.sluice, in.proc.GRPC, in.workload, rate, min(f.s.sample, left), "--concurrency", "100", "--timeout", "1s")
		t1 := time.Now()
		if err != nil {
			if ctx.Err() == nil {
				rec.fail(fmt.Errorf("%s: %w", in.name, err))
			}
			return
		}
		in.count(r.outcomes(in.store == "redis" && rec.down.Overlaps(t0, t1)))
	}
}

// rewrites writes a new generation of the limits every -rewrite-every
// until the soak ends.
func (f *fleet) rewrites(ctx context.Context, rec *record) {
	t := time.NewTicker(f.s.rewriteEvery)
	defer t.Stop()
	for gen := 1; ; gen++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := writeLimits(f.limits, gen, f.s.canaryLimit); err != nil {
			rec.fail(err)
		}
	}
}

// restartPlan kills Redis every period for 2 s. Canary requests pause
// from a second before the kill until the new process answers, and then
// use new keys, so that no canary budget spans a restart (Redis forgets
// its counters). The outage lasts 2 s more, for the breakers to close
// (their probe runs every 100 ms while open).
func restartPlan(period time.Duration, can *canaries) harness.RestartPlan {
	return harness.RestartPlan{Every: period, Down: 2 * time.Second, Grace: 2 * time.Second,
		Before: func() {
			can.pause()
			time.Sleep(1100 * time.Millisecond) // canaries under way end (1 s timeout)
		},
		After: can.nextEpoch}
}
