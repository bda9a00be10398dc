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
	registerBackend(backend{name: "memory", newConfig: newMemoryConfig})
}

// memoryConfig is the memory backend's settings.
type memoryConfig struct {
	maxKeys    int
	sweepEvery time.Duration
}

func newMemoryConfig(fs *flag.FlagSet) storeConfig {
	c := &memoryConfig{}
	fs.IntVar(&c.maxKeys, "memory-max-keys", memory.DefaultMaxKeys, "memory store: most counters held; past it idle counters are dropped, then live ones evicted")
	fs.DurationVar(&c.sweepEvery, "memory-sweep-interval", 10*time.Second, "memory store: how often idle counters are dropped")
	return c
}

func (c *memoryConfig) open(_ context.Context, logger *slog.Logger, clock store.Clock) (openStore, error) {
	if c.maxKeys < 1 || c.sweepEvery <= 0 {
		return openStore{}, errors.New("--memory-max-keys and --memory-sweep-interval must be positive")
	}
	st := memory.New(memory.Options{MaxKeys: c.maxKeys, Clock: clock})
	sweep := func(ctx context.Context) error {
		t := time.NewTicker(c.sweepEvery)
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
	return openStore{Store: st, closer: io.NopCloser(nil), run: sweep}, nil
}
