package memory

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

// The figures these produce are in docs/STORE.md (Snapshots across
// restarts).

const benchCounters = 1 << 20

var (
	bigOnce  sync.Once
	bigStore *Store
	bigKeys  []string
	bigRule  *store.Rule
)

// bigSnapshotStore is a store of 1M live day windows under keys shaped
// like a client address rule's (about 40 bytes).
func bigSnapshotStore(b *testing.B) (*Store, []string, *store.Rule) {
	bigOnce.Do(func() {
		bigRule = storetest.Window(b, 1000, 24*time.Hour)
		bigStore = New(Options{MaxKeys: 2 * benchCounters})
		bigKeys = make([]string, benchCounters)
		hits := []store.Hit{{Rule: bigRule, Cost: 1, Veto: true}}
		out := make([]store.Decision, 1)
		for i := range bigKeys {
			bigKeys[i] = fmt.Sprintf("edge|remote_address=10.%d.%d.%d|fw:86400s", i>>16, i>>8&255, i&255)
			hits[0].Key = bigKeys[i]
			bigStore.Take(context.Background(), t0, hits, out)
		}
	})
	return bigStore, bigKeys, bigRule
}

// BenchmarkSnapshotWrite writes 1M counters to memory, and to a file with
// its fsync; per op is the whole snapshot.
func BenchmarkSnapshotWrite(b *testing.B) {
	s, _, _ := bigSnapshotStore(b)
	b.Run("buffer", func(b *testing.B) {
		var buf bytes.Buffer
		b.ReportAllocs()
		var st SnapshotStats
		cpu0 := cputime.Process()
		for b.Loop() {
			buf.Reset()
			st, _ = s.WriteSnapshot(&buf, t0, t0)
		}
		reportPerCounter(b, st, cpu0)
	})
	b.Run("file+fsync", func(b *testing.B) {
		path := filepath.Join(b.TempDir(), "snap")
		b.ReportAllocs()
		var st SnapshotStats
		cpu0 := cputime.Process()
		for b.Loop() {
			f, err := os.Create(path)
			if err != nil {
				b.Fatal(err)
			}
			st, err = s.WriteSnapshot(f, t0, t0)
			if err == nil {
				err = f.Sync()
			}
			f.Close()
			if err != nil {
				b.Fatal(err)
			}
		}
		reportPerCounter(b, st, cpu0)
	})
}

// reportPerCounter reports the wall and process CPU time per counter
// (CPU since cpu0, read at the start of the loop: on a shared machine
// the wall time is inflated by other processes), and the bytes.
func reportPerCounter(b *testing.B, st SnapshotStats, cpu0 time.Duration) {
	n := float64(b.N) * float64(st.Counters)
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/counter")
	b.ReportMetric(float64((cputime.Process()-cpu0).Nanoseconds())/n, "cpu-ns/counter")
	b.ReportMetric(float64(st.Bytes)/float64(st.Counters), "bytes/counter")
	b.ReportMetric(float64(st.Counters), "counters")
}

// BenchmarkSnapshotLoad reads and restores 1M counters into an empty
// store; per op is the whole load.
func BenchmarkSnapshotLoad(b *testing.B) {
	s, _, r := bigSnapshotStore(b)
	var buf bytes.Buffer
	st, err := s.WriteSnapshot(&buf, t0, t0)
	if err != nil {
		b.Fatal(err)
	}
	rule := func(string) *store.Rule { return r }
	b.ReportAllocs()
	cpu0 := cputime.Process()
	for b.Loop() {
		sn, err := ReadSnapshot(buf.Bytes())
		if err != nil {
			b.Fatal(err)
		}
		if rs, err := New(Options{MaxKeys: 2 * benchCounters}).Restore(sn, t0, rule); err != nil || rs.Restored != st.Counters {
			b.Fatalf("restored %+v, %v", rs, err)
		}
	}
	reportPerCounter(b, st, cpu0)
}

// BenchmarkTakeDuringSnapshot measures each Take's latency on a store of
// 1M counters (a random existing key each) with and without snapshots
// being written back to back, and reports its quantiles and maximum: the
// pause a background write causes.
func BenchmarkTakeDuringSnapshot(b *testing.B) {
	s, keys, r := bigSnapshotStore(b)
	for _, writing := range []bool{false, true} {
		b.Run(fmt.Sprintf("writing=%t", writing), func(b *testing.B) {
			var stop atomic.Bool
			var wg sync.WaitGroup
			var writes atomic.Int64
			if writing {
				wg.Go(func() {
					for !stop.Load() {
						s.WriteSnapshot(io.Discard, t0, t0)
						writes.Add(1)
					}
				})
			}
			hits := []store.Hit{{Rule: r, Cost: 0, Veto: true}} // checks: the counts stay
			out := make([]store.Decision, 1)
			lat := make([]time.Duration, 0, 1<<22)
			x := uint64(1)
			for b.Loop() {
				x ^= x << 13
				x ^= x >> 7
				x ^= x << 17
				hits[0].Key = keys[x%uint64(len(keys))]
				start := time.Now()
				s.Take(context.Background(), t0, hits, out)
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
			}
			stop.Store(true)
			wg.Wait()
			slices.Sort(lat)
			q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) }
			b.ReportMetric(q(0.5), "p50-ns")
			b.ReportMetric(q(0.99), "p99-ns")
			b.ReportMetric(q(0.999), "p99.9-ns")
			b.ReportMetric(float64(lat[len(lat)-1].Nanoseconds()), "max-ns")
			b.ReportMetric(float64(writes.Load()), "snapshots")
		})
	}
}
