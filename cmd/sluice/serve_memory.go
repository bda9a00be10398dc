package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
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
	maxKeys       int
	sweepEvery    time.Duration
	snapshot      string
	snapshotEvery time.Duration
	snapshotMax   int64
}

func newMemoryConfig(fs *flag.FlagSet) storeConfig {
	c := &memoryConfig{}
	fs.IntVar(&c.maxKeys, "memory-max-keys", memory.DefaultMaxKeys, "memory store: most counters held; past it idle counters are dropped, then live ones evicted")
	fs.DurationVar(&c.sweepEvery, "memory-sweep-interval", 10*time.Second, "memory store: how often idle counters are dropped")
	fs.StringVar(&c.snapshot, "memory-snapshot", "", "memory store: keep the counters in this file across restarts: restored at start, written every --memory-snapshot-interval and at shutdown (docs/STORE.md)")
	fs.DurationVar(&c.snapshotEvery, "memory-snapshot-interval", 10*time.Second, "memory store: how often --memory-snapshot is written in the background; 0 writes it only at shutdown (a SIGKILL loses up to one interval of counts)")
	fs.Int64Var(&c.snapshotMax, "memory-snapshot-max-bytes", defaultSnapshotMaxBytes, "memory store: largest --memory-snapshot read at start; a larger file is moved aside")
	return c
}

func (c *memoryConfig) open(_ context.Context, logger *slog.Logger, clock store.Clock) (openStore, error) {
	if c.maxKeys < 1 || c.sweepEvery <= 0 {
		return openStore{}, errors.New("--memory-max-keys and --memory-sweep-interval must be positive")
	}
	if c.snapshotEvery < 0 {
		return openStore{}, errors.New("--memory-snapshot-interval must not be negative")
	}
	if c.snapshotMax <= 0 {
		return openStore{}, errors.New("--memory-snapshot-max-bytes must be positive")
	}
	if c.snapshot != "" {
		if err := writableDir(filepath.Dir(c.snapshot)); err != nil {
			return openStore{}, fmt.Errorf("--memory-snapshot: %w", err)
		}
	}
	st := memory.New(memory.Options{MaxKeys: c.maxKeys, Clock: clock})
	sweep := func(ctx context.Context) error {
		return every(ctx, c.sweepEvery, func() {
			// The limiter's clock, not the ticker's wall time: a wall
			// clock stepped ahead must not sweep live state early.
			if n := st.Sweep(clock.Now()); n > 0 {
				logger.Debug("memory store swept", "removed", n, "keys", st.Len())
			}
		})
	}
	o := openStore{Store: st, closer: io.NopCloser(nil), run: sweep}
	if c.snapshot != "" {
		sn := newSnapshotter(c.snapshot, c.snapshotEvery, st, clock, logger)
		sn.maxBytes = c.snapshotMax
		o.setup, o.stop = sn.setup, sn.stop
	}
	return o, nil
}
