package quota

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/cputime"
)

// benchFleet opens streams streams, each subscribed to buckets buckets
// {tenant: b<j>} shared by all streams (one group per bucket).
func benchFleet(b *testing.B, streams, buckets int) (*Service, []*Stream, [][]Usage) {
	s, _ := newTestService(b, Options{})
	sts := make([]*Stream, streams)
	reports := make([][]Usage, streams)
	for i := range sts {
		sts[i], _ = s.Open()
		us := make([]Usage, buckets)
		for j := range us {
			us[j] = use("tenant", "b"+strconv.Itoa(j), uint64(1+i%7), uint64(i%3))
		}
		reports[i] = us
		if err := sts[i].Report(at(0), "d", us); err != nil {
			b.Fatal(err)
		}
		if err := sts[i].Report(at(0.5), "d", us); err != nil {
			b.Fatal(err)
		}
		sts[i].Pending()
	}
	return s, sts, reports
}

// reportCPU reports this process's CPU per op since cpu0: on a shared
// machine, wall time per op says more about the neighbours.
func reportCPU(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(cputime.Process()-cpu0)/float64(b.N)/1e3, "cpu-µs/op")
}

// BenchmarkReport is one stream's report of 100 buckets, from many
// streams at once; per op is one report (100 bucket usages).
func BenchmarkReport(b *testing.B) {
	_, sts, reports := benchFleet(b, 1000, 100)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Process()
	defer func() { reportCPU(b, cpu0) }()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			k := i % len(sts)
			if err := sts[k].Report(at(1), "d", reports[k]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkTick recomputes 1,000 streams × 100 buckets (100 groups of
// 1,000 proxies each); per op is one interval's work.
func BenchmarkTick(b *testing.B) {
	s, sts, _ := benchFleet(b, 1000, 100)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Process()
	for i := 0; b.Loop(); i++ {
		s.Tick(context.Background(), at(1).Add(time.Duration(i)*time.Millisecond))
	}
	b.StopTimer()
	reportCPU(b, cpu0)
	for _, st := range sts {
		st.Pending()
	}
}
