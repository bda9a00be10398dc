package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	path     string
	every    time.Duration // 0: only at shutdown
	maxBytes int64         // the largest file restore reads
	// temp begins the names of this process's temporary files:
	// PATH.tmp-HOST-, HOST this machine's name (see removeTemps).
	temp   string
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
	ahead    prometheus.Counter
}

func newSnapshotter(path string, every time.Duration, st *memory.Store, clock store.Clock, logger *slog.Logger) *snapshotter {
	return &snapshotter{path: path, every: every, maxBytes: defaultSnapshotMaxBytes, st: st, clock: clock, logger: logger,
		temp: filepath.Base(path) + ".tmp-" + tempHost() + "-",
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_memory_snapshot_writes_total",
			Help: "Snapshots of the memory store written to --memory-snapshot, by result (ok, error)."}, []string{"result"}),
		last: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_memory_snapshot_last_success_timestamp_seconds",
			Help: "When the last snapshot of the memory store was written (Unix seconds)."}),
		counters: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_memory_snapshot_counters",
			Help: "Counters in the last snapshot of the memory store written."}),
		seconds: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_memory_snapshot_write_seconds",
			Help: "How long the last snapshot of the memory store took to write, fsync and rename."}),
		ahead: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_memory_snapshot_ahead_counters_total",
			Help: "Counters of a --memory-snapshot not restored because the snapshot's clock was more than an hour ahead of this one (their windows would end in the future)."}),
	}
}

// setup registers the metrics and restores the file against the config in
// force; with no config yet (xDS before its first push, an empty config
// directory) it restores against the first config that has a domain,
// before the health hook (registered after it) reports SERVING.
func (s *snapshotter) setup(x *serveContext) error {
	x.Registry.MustRegister(s.writes, s.last, s.counters, s.seconds, s.ahead)
	s.writes.WithLabelValues("ok")
	s.writes.WithLabelValues("error")
	if t := x.Config.Current(); t != nil && len(t.Domains()) > 0 {
		if err := s.restore(t); err != nil {
			return err
		}
	} else {
		x.Logger.Info("memory snapshot: restored once a config is loaded", "path", s.path)
		var tried atomic.Bool
		x.Config.OnReload(func(t *config.Table, _ error) {
			if t != nil && len(t.Domains()) > 0 && !tried.Swap(true) {
				if err := s.restore(t); err != nil {
					s.logger.Error("memory snapshot not read: left in place, and none is written until a restart reads it", "err", err)
				}
			}
		})
	}
	if s.every > 0 {
		x.Run = append(x.Run, s.run)
	}
	return nil
}

// restore reads the file into the store, continuing the store's clock from
// the snapshot's (see store.WallClock.AtLeast). A file that was read but
// is refused (too large, corrupt, of another config) is moved aside with
// one WARN, and the store starts empty; a snapshot whose clock was more
// than maxClockAdvance ahead is not restored (its windows would end in
// the future), with one WARN. A file that cannot be read (not a regular
// file, no permission, an I/O error) is an error and left in place: the
// snapshotter then never writes, since that would replace it.
func (s *snapshotter) restore(t *config.Table) error {
	s.removeTemps()
	b, err := readSnapshotFile(s.path, s.maxBytes)
	if errors.Is(err, fs.ErrNotExist) {
		s.logger.Info("memory snapshot: none yet, starting empty", "path", s.path)
		s.ready.Store(true)
		return nil
	}
	if errors.Is(err, errSnapshotTooLarge) {
		s.moveAside(err)
		s.ready.Store(true)
		return nil
	}
	if err != nil {
		return fmt.Errorf("--memory-snapshot %s: not read (left in place): %w", s.path, err)
	}
	defer s.ready.Store(true)
	sn, err := memory.ReadSnapshot(b)
	if err != nil {
		s.moveAside(err)
		return nil
	}
	// The snapshot's clock, moved on by the wall-clock time since.
	wall, now := time.Now().UnixNano(), s.clock.Now()
	then := sn.Now + max(0, wall-sn.Wall)
	if then-now > int64(maxClockAdvance) {
		s.ahead.Add(float64(sn.Len()))
		s.logger.Warn("memory snapshot not restored: its clock was ahead of this one, so its windows would end in the future; starting empty",
			"path", s.path, "counters", sn.Len(), "clock_ahead", time.Duration(then-now).Round(time.Second), "most", maxClockAdvance)
		return nil
	}
	c, ok := s.clock.(interface{ AtLeast(int64) })
	advance := ok && then > now
	if advance {
		now = then
	}
	st, err := s.st.Restore(sn, now, ruleOfKey(t))
	if err != nil {
		s.moveAside(err)
		return nil
	}
	if advance {
		c.AtLeast(then)
	}
	s.logger.Info("memory snapshot restored", "path", s.path, "restored", st.Restored, "lapsed", st.Lapsed,
		"no_rule", st.NoRule, "over_max_keys", st.Full, "age", time.Duration(wall-sn.Wall).Round(time.Millisecond),
		"clock_ahead", time.Duration(then-s.clock.Now()).Round(time.Millisecond))
	return nil
}

// defaultSnapshotMaxBytes is --memory-snapshot-max-bytes's default.
const defaultSnapshotMaxBytes = 1 << 30

// errSnapshotTooLarge is readSnapshotFile's error for a file above its
// bound.
var errSnapshotTooLarge = errors.New("larger than --memory-snapshot-max-bytes")

// readSnapshotFile reads the regular file at path, of at most max bytes.
// It opens without blocking (a FIFO would block the open until a writer
// came) and refuses anything but a regular file before reading.
func readSnapshotFile(path string, max int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file (%v)", fi.Mode().Type())
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%w: %d bytes, at most %d", errSnapshotTooLarge, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%w: grew past %d bytes while read", errSnapshotTooLarge, max)
	}
	return b, nil
}

// maxClockAdvance bounds how far a restore moves the store's clock forward
// to continue the snapshot's. A snapshot from a clock further ahead (a
// machine whose clock was wrong, an NTP step) is not restored: at this
// clock's time its states would be in the future, a window counting (a
// 10/s limit holding its count) until the clock caught up.
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

// staleTemp is the age past which any temporary snapshot file beside the
// path is removed, whoever wrote it: no write takes this long.
const staleTemp = time.Hour

// removeTemps removes temporary files that a write cut short (SIGKILL)
// left next to the snapshot: those this machine's processes name
// (PATH.tmp-HOST-*, a process before this one; this one has written
// none yet), and any PATH.tmp-* older than staleTemp. Names are matched
// exactly, not as a pattern, and a replica that shares the directory
// from another machine keeps its write in progress.
func (s *snapshotter) removeTemps() {
	dir := filepath.Dir(s.path)
	entries, _ := os.ReadDir(dir)
	temps := filepath.Base(s.path) + ".tmp-"
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !strings.HasPrefix(name, temps) {
			continue
		}
		if !strings.HasPrefix(name, s.temp) {
			fi, err := e.Info()
			if err != nil || time.Since(fi.ModTime()) < staleTemp {
				continue
			}
		}
		os.Remove(filepath.Join(dir, name))
	}
}

// tempHost is this machine's name as a temporary file's name holds it:
// letters, digits, '.' and '_', no '-' (so that no host's prefix is
// another's), "host" if it has none.
func tempHost() string {
	h, _ := os.Hostname()
	h = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' {
			return r
		}
		return -1
	}, h)
	if h == "" {
		return "host"
	}
	return h
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
	f, err := os.CreateTemp(dir, s.temp+"*")
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
