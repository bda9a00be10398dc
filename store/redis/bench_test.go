package redis

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/cputime"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// BenchmarkTake measures Take on a local Redis: one EVALSHA per call,
// pipelined across the parallel callers (or, for window requests, combined
// into one call), by GOMAXPROCS callers or, for the c50 cases, 50. Every
// hit is allowed (limits no run reaches), on keys spread so the local
// cache never answers. cpu-µs/op is this process's CPU per Take, Redis's
// not included: on two cores shared with Redis it is steadier than ns/op.
func BenchmarkTake(b *testing.B) {
	srv := redistest.Start(b)
	fw := must(store.NewFixedWindow(store.MaxFixedWindowLimit, time.Hour))
	tb := must(store.NewTokenBucket(1e9, time.Second, 1e9))
	for _, c := range []struct {
		name    string
		rules   []*store.Rule
		callers int
		plain   bool // the reference's keys (store.Hit.Plain)
	}{
		{"1hit/fixed_window", []*store.Rule{fw}, 0, false},
		{"1hit/token_bucket", []*store.Rule{tb}, 0, false},
		{"4hits/fixed_window", []*store.Rule{fw, fw, fw, fw}, 0, false},
		{"4hits/mixed", []*store.Rule{fw, tb, fw, tb}, 0, false},
		{"1hit/fixed_window/c50", []*store.Rule{fw}, 50, false},
		{"4hits/fixed_window/c50", []*store.Rule{fw, fw, fw, fw}, 50, false},
		{"1hit/fixed_window/plain", []*store.Rule{fw}, 0, true},
		{"4hits/fixed_window/plain", []*store.Rule{fw, fw, fw, fw}, 0, true},
		{"4hits/mixed/plain", []*store.Rule{fw, tb, fw, tb}, 0, true},
		{"4hits/fixed_window/c50/plain", []*store.Rule{fw, fw, fw, fw}, 50, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			if c.callers > 0 {
				b.SetParallelism((c.callers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			}
			s := open(b, Options{URL: "redis://" + srv.Addr})
			var seq atomic.Int64
			before := commandCalls(b, srv)
			cpu := cputime.Process()
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				g := strconv.FormatInt(seq.Add(1), 10)
				hits := make([]store.Hit, len(c.rules))
				for i, r := range c.rules {
					hits[i] = store.Hit{Key: "bench" + g + "/" + strconv.Itoa(i), Rule: r, Cost: 1, Veto: true,
						Plain: c.plain && r.Plainable()}
				}
				out := make([]store.Decision, len(hits))
				for pb.Next() {
					if err := s.Take(context.Background(), time.Now().UnixNano(), hits, out); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64((cputime.Process()-cpu).Microseconds())/float64(b.N), "cpu-µs/op")
			after := commandCalls(b, srv)
			b.ReportMetric(float64(after.calls-before.calls)/float64(b.N), "cmds/op")
			b.ReportMetric(float64(after.usec-before.usec)/float64(b.N), "script-µs/op")
		})
	}
}

type cmdStats struct{ calls, usec int64 }

// commandCalls sums Redis's command statistics over every command but
// INFO itself and PING (rueidis pings a connection idle for a second, and
// a stalled test can take that long): the calls (scripts and the commands
// they run), and the CPU µs of the scripts (which include the commands
// they run).
func commandCalls(tb testing.TB, srv *redistest.Server) cmdStats {
	var st cmdStats
	for _, line := range strings.Split(srv.CLI("info", "commandstats"), "\n") {
		if !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(line, "cmdstat_info:") || strings.HasPrefix(line, "cmdstat_ping:") {
			continue
		}
		for _, kv := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls += n
			case "usec":
				if strings.HasPrefix(line, "cmdstat_eval") {
					st.usec += n
				}
			}
		}
	}
	return st
}
