package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

// snapshotter keeps the memory store's counters in a file across restarts
// (--memory-snapshot): it restores the file before serve reports SERVING,
// rewrites it every interval in the background and once more at shutdown,
// after draining. docs/STORE.md describes the format and the semantics.
type snapshotter struct {
	path   string
	every  time.Duration // 0: only at shutdown
	st     *memory.Store
	clock  store.Clock
	logger *slog.Logger

	// ready is set once the file has been restored, moved aside or found
	// missing: until then a write would replace counters not yet read.
	ready atomic.Bool
	mu    sync.Mutex // one write at a time

	writes   *prometheus.CounterVec
	last     prometheus.Gauge
	counters prometheus.Gauge
	seconds  prometheus.Gauge
}

func newSnapshotter(path string, every time.Duration, st *memory.Store, clock store.Clock, logger *slog.Logger) *snapshotter {
	return &snapshotter{path: path, every: every, st: st, clock: clock, logger: logger,
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_memory_snapshot_writes_total",
			Help: "Snapshots of the memory store written to --memory-snapshot, by result (ok, error)."}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_memory_snapshot_last_success_timestamp_seconds",
			Help: "When the last snapshot of the memory store was written (Unix seconds)."}),
		counters: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_memory_snapshot_counters",
			Help: "Counters in the last snapshot of the memory store written."}),
		seconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_memory_snapshot_write_seconds",
			Help: "How long the last snapshot of the memory store took to write, fsync and rename."}),
	}
}

// setup registers the metrics and restores the file against the config in
// force; with no config yet (xDS before its first push, an empty config
// directory) it restores against the first config that has a domain,
// before the health hook (registered after it) reports SERVING.
func (s *snapshotter) setup(x *serveContext) error {
	x.Registry.MustRegister(s.writes, s.last, s.counters, s.seconds)
	s.writes.WithLabelValues("ok")
	s.writes.WithLabelValues("error")
	if t := x.Config.Current(); t != nil && len(t.Domains()) > 0 {
		s.restore(t)
	} else {
		x.Logger.Info("memory snapshot: restored once a config is loaded", "path", s.path)
		x.Config.OnReload(func(t *config.Table, _ error) {
			if !s.ready.Load() && t != nil && len(t.Domains()) > 0 {
				s.restore(t)
			}
		})
	}
	if s.every > 0 {
		x.Run = append(x.Run, s.run)
	}
	return nil
}

// restore reads the file into the store, continuing the store's clock from
// the snapshot's (see store.WallClock.AtLeast). A file that cannot be read
// or restored whole is moved aside with one WARN; the store starts empty.
func (s *snapshotter) restore(t *config.Table) {
	defer s.ready.Store(true)
	s.removeTemps()
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		s.logger.Info("memory snapshot: none yet, starting empty", "path", s.path)
		return
	}
	var sn *memory.Snapshot
	if err == nil {
		sn, err = memory.ReadSnapshot(b)
	}
	if err != nil {
		s.moveAside(err)
		return
	}
	// The snapshot's clock, moved on by the wall-clock time since.
	wall, now := time.Now().UnixNano(), s.clock.Now()
	then := sn.Now + max(0, wall-sn.Wall)
	c, ok := s.clock.(interface{ AtLeast(int64) })
	advance := ok && then > now && then-now <= int64(maxClockAdvance)
	if advance {
		now = then
	}
	st, err := s.st.Restore(sn, now, ruleOfKey(t))
	if err != nil {
		s.moveAside(err)
		return
	}
	if advance {
		c.AtLeast(then)
	}
	s.logger.Info("memory snapshot restored", "path", s.path, "restored", st.Restored, "lapsed", st.Lapsed,
		"no_rule", st.NoRule, "over_max_keys", st.Full, "age", time.Duration(wall-sn.Wall).Round(time.Millisecond),
		"clock_ahead", time.Duration(then-s.clock.Now()).Round(time.Millisecond))
}

// maxClockAdvance bounds how far a restore moves the store's clock forward
// to continue the snapshot's. A snapshot from a clock further ahead (a
// machine whose clock was wrong) is restored at this clock's time, where
// its states are in the future: they count conservatively (a window keeps
// counting, a bucket refills from its later instant) until the clock
// catches up.
const maxClockAdvance = time.Hour

// moveAside renames a snapshot that was not restored to PATH.bad-<time>,
// so that the next write does not replace it and an operator can look at
// it, and logs why.
func (s *snapshotter) moveAside(reason error) {
	bad := s.path + ".bad-" + time.Now().UTC().Format("20060102T150405.000Z")
	if err := os.Rename(s.path, bad); err != nil {
		s.logger.Warn("memory snapshot not restored, and not moved aside; starting empty", "path", s.path, "reason", reason, "err", err)
		return
	}
	s.logger.Warn("memory snapshot not restored: moved aside; starting empty", "path", s.path, "moved_to", bad, "reason", reason)
}

// writableDir fails unless a file can be created in dir: a snapshot's
// directory is checked at start, not found missing or read-only at the
// first write.
func writableDir(dir string) error {
	f, err := os.CreateTemp(dir, ".sluice-check-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// removeTemps removes temporary files that a write cut short (SIGKILL)
// left next to the snapshot.
func (s *snapshotter) removeTemps() {
	temps, _ := filepath.Glob(s.path + ".tmp-*")
	for _, f := range temps {
		os.Remove(f)
	}
}

// ruleOfKey returns the rule of a counter key in table t: a rule of the
// key's domain whose key suffix (algorithm and the numbers its state
// depends on, config's key format) is the key's. For a fixed window the
// suffix has the window but not the limit: its count is kept under a new
// limit, as a reload keeps it.
func ruleOfKey(t *config.Table) func(key string) *store.Rule {
	rules := map[string]*store.Rule{}
	for _, r := range t.Rules() {
		for _, l := range r.Limits() {
			if k := t.KeyPrefix(l.Domain) + l.KeySuffix(); l.Limit != nil && rules[k] == nil {
				rules[k] = l.Limit
			}
		}
	}
	return func(key string) *store.Rule {
		prefix, suffix, ok := config.SplitKey(key)
		if !ok {
			return nil
		}
		return rules[prefix+suffix]
	}
}

// run writes a snapshot every interval until ctx ends.
func (s *snapshotter) run(ctx context.Context) error {
	return every(ctx, s.every, func() {
		if st, took, err := s.write(); err != nil {
			s.logger.Warn("memory snapshot not written", "path", s.path, "err", err)
		} else if took >= 0 {
			s.logger.Debug("memory snapshot written", "path", s.path, "counters", st.Counters, "bytes", st.Bytes, "took", took)
		}
	})
}

// stop writes the last snapshot, once serve has drained.
func (s *snapshotter) stop() error {
	st, took, err := s.write()
	if err != nil {
		return fmt.Errorf("memory snapshot %s: %w", s.path, err)
	}
	if took >= 0 {
		s.logger.Info("memory snapshot written", "path", s.path, "counters", st.Counters, "bytes", st.Bytes, "took", took)
	}
	return nil
}

// write writes the store's snapshot to a temporary file in the snapshot's
// directory, syncs it, renames it over the snapshot and syncs the
// directory: the file is always a whole snapshot, the old one or the new.
// Before the file has been restored it writes nothing (took is then -1).
func (s *snapshotter) write() (memory.SnapshotStats, time.Duration, error) {
	if !s.ready.Load() {
		return memory.SnapshotStats{}, -1, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	start := time.Now()
	st, err := s.writeFile()
	if err != nil {
		s.writes.WithLabelValues("error").Inc()
		return st, 0, err
	}
	took := time.Since(start)
	s.writes.WithLabelValues("ok").Inc()
	s.last.Set(float64(time.Now().UnixNano()) / 1e9)
	s.counters.Set(float64(st.Counters))
	s.seconds.Set(took.Seconds())
	return st, took, nil
}

func (s *snapshotter) writeFile() (memory.SnapshotStats, error) {
	dir := filepath.Dir(s.path)
	f, err := os.CreateTemp(dir, filepath.Base(s.path)+".tmp-*")
	if err != nil {
		return memory.SnapshotStats{}, err
	}
	st, err := s.st.WriteSnapshot(f, s.clock.Now(), time.Now().UnixNano())
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), s.path)
	}
	if err != nil {
		os.Remove(f.Name())
		return st, err
	}
	d, err := os.Open(dir)
	if err != nil {
		return st, err
	}
	defer d.Close()
	return st, d.Sync()
}
