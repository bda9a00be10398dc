package main

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/loadgen"
)

var update = flag.Bool("update", false, "rewrite testdata/report.golden")

// result is a run's figures, every latency quantile distinct so that a
// column written from the wrong one shows.
func result(rps float64, ok, failed uint64, p50 float64) *loadgen.Result {
	codes := map[string]uint64{"OK": ok}
	if failed > 0 {
		codes["Unavailable"] = failed
	}
	return &loadgen.Result{Requests: ok + failed, RPS: rps, Codes: codes, CPUPerRequest: 1.5,
		Latency: loadgen.Latency{Mean: p50 + 1, P50: p50, P90: p50 + 2, P99: p50 + 3, P999: p50 + 4, Max: p50 + 5}}
}

// goldenReport has every section of the Markdown, calls that failed in
// the closed loop and in the Redis store's runs, the Redis store's hot
// workload, answered by its local over-limit cache, a Redis cell on the
// reference's keys, and an older build (-baseline) in one closed-loop cell
// and every Redis cell.
func goldenReport() *report {
	s := settings{connections: 2, keys: 10000, openConc: 200, repeat: 3, starveBusy: 3, reference: "/tmp/ratelimit", baseline: "/tmp/before/bin/sluice",
		duration: 5 * time.Second, warmup: time.Second, starveTimeout: time.Second}
	m := func(r *loadgen.Result, cpu float64) measured { return measured{Result: r, ServerCPU: cpu} }
	// sl is a Sluice run, which counts its allocations.
	sl := func(r *loadgen.Result, cpu, allocs float64) measured {
		return measured{Result: r, ServerCPU: cpu, Allocs: allocs}
	}
	open := m(result(8000, 40000, 0, 300), 20)
	open.Unfinished = 7
	bench := m(result(1000, 6000, 0, 400), 25)
	bench.Service = &loadgen.Latency{Mean: 350, P50: 340, P90: 360, P99: 390}
	rep := &report{
		settings: s,
		machine:  machine{cpu: "Test CPU", cores: 2, memory: "8 GiB", kernel: "Linux 6.1", load: "0.1 0.2 0.3", goVersion: "go1.99", date: "2026-01-01 00:00 UTC", commit: "abc1234"},
		genCPU:   1.5,
		after:    "commit d75c127-dirty",
		before:   "commit 9e766e9",
		closed: []cell{
			{workload: "distinct", concurrency: 50, sluice: sl(result(20000, 100000, 0, 100), 30, 52.34), noop: m(result(22000, 110000, 0, 90), 25), paired: []float64{0.9, 0.8, 0.95},
				base: &measured{Result: result(16000, 80000, 1, 120), ServerCPU: 36, Allocs: 61.25}, basePaired: []float64{0.7, 0.75, 0.72}, afterBefore: []float64{1.3, 1.2, 1.25}},
			{workload: "hot", concurrency: 200, sluice: sl(result(18000, 90000, 12, 200), 31, 48), noop: m(result(21000, 105000, 0, 190), 26), paired: []float64{0.86}},
		},
		redis: []cell{
			{workload: "multi", concurrency: 50, sluice: measured{Result: result(9000, 45000, 3, 500), ServerCPU: 40, RedisCPU: 15.25, RedisCommands: 1.16, Allocs: 70.5},
				noop: m(result(17000, 85000, 0, 250), 47), paired: []float64{0.5, 0.55},
				ref: &measured{Result: result(4000, 20000, 2, 900), ServerCPU: 90, RedisCPU: 30.5}, refPaired: []float64{0.25, 0.2}, refSluice: []float64{2.1, 2.4},
				base: &measured{Result: result(7000, 35000, 0, 600), ServerCPU: 45, RedisCPU: 18.5, Allocs: 80.25}, basePaired: []float64{0.4, 0.42}, afterBefore: []float64{1.25, 1.3}},
			{workload: "hot", concurrency: 200, sluice: measured{Result: result(19000, 95000, 0, 180), ServerCPU: 28, RedisCPU: 0.4, RedisCommands: 0.01, LocalShare: 0.98765, Allocs: 45.5},
				noop: m(result(21000, 105000, 0, 190), 26), paired: []float64{0.9},
				ref: &measured{Result: result(6000, 30000, 0, 700), ServerCPU: 80, RedisCPU: 20}, refPaired: []float64{0.29}, refSluice: []float64{3.2},
				base: &measured{Result: result(17000, 85000, 0, 210), ServerCPU: 30, RedisCPU: 0.5, Allocs: 47}, basePaired: []float64{0.8}, afterBefore: []float64{1.1}},
			{workload: "multi", concurrency: 50, refKeys: true, sluice: measured{Result: result(10000, 50000, 0, 450), ServerCPU: 42, RedisCPU: 9.5, RedisCommands: 8.01, Allocs: 72},
				noop: m(result(17000, 85000, 0, 250), 47), paired: []float64{0.59},
				ref: &measured{Result: result(4000, 20000, 0, 900), ServerCPU: 90, RedisCPU: 30.5}, refPaired: []float64{0.24}, refSluice: []float64{2.45},
				base: &measured{Result: result(9000, 45000, 0, 500), ServerCPU: 40, RedisCPU: 15.5, Allocs: 70}, basePaired: []float64{0.53}, afterBefore: []float64{1.11}},
		},
		starved: []cell{
			{workload: "distinct", concurrency: 50, sluice: m(result(3000, 15000, 4, 900), 60)},
			{workload: "hot", concurrency: 50, sluice: measured{Result: result(5000, 25000, 0, 800), ServerCPU: 50, LocalShare: 0.995}},
		},
		open: []cell{{workload: "distinct", concurrency: 200, rate: 8800, fraction: 0.8, sluice: open, noop: m(result(8000, 40000, 0, 280), 22)}},
		ghz:  &crossCheck{rate: 1000, concurrency: 50, bench: bench},
	}
	rep.starved[0].sluice.Codes["DeadlineExceeded"] = 2
	g := &rep.ghz.ghz
	g.RPS, g.Average, g.Count = 999, 410e3, 6000
	for _, d := range []struct{ p, l float64 }{{50, 400e3}, {90, 450e3}, {99, 700e3}} {
		g.Dist = append(g.Dist, struct {
			Percentage float64 `json:"percentage"`
			Latency    float64 `json:"latency"`
		}{d.p, d.l})
	}
	return rep
}

// TestReport_Golden pins the Markdown `make bench-load` writes, section
// by section (go test -run TestReport_Golden -update rewrites it).
func TestReport_Golden(t *testing.T) {
	var b bytes.Buffer
	if err := goldenReport().write(&b); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join("testdata", "report.golden")
	if *update {
		if err := os.WriteFile(golden, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != string(want) {
		t.Errorf("report differs from %s:\n%s", golden, got)
	}
}

// TestReport_NoBaseline: without -baseline the report has no before and
// after section and says so under how to run one, while Sluice's
// allocations stay in the closed loop's table and the Redis store's.
func TestReport_NoBaseline(t *testing.T) {
	rep := goldenReport()
	rep.baseline, rep.before = "", ""
	for _, cs := range [][]cell{rep.closed, rep.redis} {
		for i := range cs {
			cs[i].base, cs[i].basePaired, cs[i].afterBefore = nil, nil, nil
		}
	}
	var b bytes.Buffer
	if err := rep.write(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, absent := range []string{"## Before and after", "after / before"} {
		if strings.Contains(got, absent) {
			t.Errorf("report has %q without a baseline:\n%s", absent, got)
		}
	}
	for _, want := range []string{"## Running before and after", "This run had no baseline.",
		"| Sluice allocs/req |\n", "| 30.0 / 25.0 | 52.3 |\n", "| 98.8 % | 45.5 |\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}

// TestReport_NoRedis: without redis-server the Redis section says why,
// and the sections without runs are left out.
func TestReport_NoRedis(t *testing.T) {
	rep := goldenReport()
	rep.redis, rep.starved, rep.open, rep.ghz = nil, nil, nil, nil
	rep.noRedis = "No `redis-server` was found on this machine, so the Redis store was not measured."
	var b bytes.Buffer
	if err := rep.write(&b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	if want := "## Redis store\n\n" + rep.noRedis + "\n"; !strings.Contains(got, want) {
		t.Errorf("report lacks %q:\n%s", want, got)
	}
	for _, absent := range []string{"CPU starved", "## Open loop", "## Cross-check", "| Sluice+Redis"} {
		if strings.Contains(got, absent) {
			t.Errorf("report has %q without runs:\n%s", absent, got)
		}
	}
}
