package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// The memory backend: counters in this process only. Each replica counts
// on its own, so N replicas allow N times the limit.
func init() {
	var maxKeys int
	var sweepEvery time.Duration
	registerBackend(backend{
		name: "memory",
		flags: func(fs *flag.FlagSet) {
			fs.IntVar(&maxKeys, "memory-max-keys", memory.DefaultMaxKeys, "memory store: most counters held; past it idle counters are dropped, then live ones evicted")
			fs.DurationVar(&sweepEvery, "memory-sweep-interval", 10*time.Second, "memory store: how often idle counters are dropped")
		},
		open: func(_ context.Context, logger *slog.Logger, clock store.Clock) (store.Store, io.Closer, func(context.Context) error, error) {
			if maxKeys < 1 || sweepEvery <= 0 {
				return nil, nil, nil, errors.New("--memory-max-keys and --memory-sweep-interval must be positive")
			}
			st := memory.New(memory.Options{MaxKeys: maxKeys, Clock: clock})
			sweep := func(ctx context.Context) error {
				t := time.NewTicker(sweepEvery)
				defer t.Stop()
				for {
					select {
					case <-ctx.Done():
						return nil
					case <-t.C:
						// The limiter's clock, not the ticker's wall time: a wall
						// clock stepped ahead must not sweep live state early.
						if n := st.Sweep(clock.Now()); n > 0 {
							logger.Debug("memory store swept", "removed", n, "keys", st.Len())
						}
					}
				}
			}
			return st, io.NopCloser(nil), sweep, nil
		},
	})
}
