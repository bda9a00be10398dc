package main

import (
	"context"
	"flag"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/config/xds"
	"github.com/sluicehq/sluice/loadgen"
	"github.com/sluicehq/sluice/loadgen/harness"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLimits: every generation compiles as Sluice compiles an xDS push;
// the RLS requests and RLQS buckets the soak sends match the rules meant
// for them; the fixed rules keep their counter keys across generations
// and the renamed ones do not.
func TestLimits(t *testing.T) {
	compile := func(gen int) *config.Table {
		t.Helper()
		tb, err := config.CompileRateLimitConfigs([]*ratelimitpb.RateLimitConfig{limits(gen, 5)}, config.Options{})
		if err != nil {
			t.Fatalf("generation %d: %v", gen, err)
		}
		return tb
	}
	g1, g2 := compile(1), compile(2)
	if n := len(g1.Rules()); n != len(limited)+3+5 {
		t.Errorf("%d rules, want %d", n, len(limited)+3+5)
	}
	for i, l := range limited {
		es := []config.Entry{{Key: routeKey, Value: l.name}}
		r1, k1 := g1.Match(domain, es, nil)
		_, k2 := g2.Match(domain, es, nil)
		if r1 == nil || r1.RequestsPerUnit != uint64(l.perSecond) || string(k1) != string(k2) {
			t.Errorf("limited[%d]: rule %v, keys %q and %q; want %d/s, one key in both generations", i, r1, k1, k2, l.perSecond)
		}
	}
	if r, _ := g1.Match(domain, []config.Entry{{Key: detailedKey, Value: "c7"}}, nil); r == nil || !r.DetailedMetric {
		t.Errorf("detailed: %v", r)
	}
	route := renamedRoute(2, 3)
	churn := []config.Entry{{Key: route, Value: route}, {Key: leafKey, Value: "c1"}}
	if r, _ := g2.Match(domain, churn, nil); r == nil || r.RequestsPerUnit != renamedLimit {
		t.Errorf("renamed rule of generation 2 in generation 2: %v", r)
	}
	if r, _ := g1.Match(domain, churn, nil); r != nil {
		t.Errorf("renamed rule of generation 2 in generation 1: %v, want none", r)
	}
	for _, c := range []struct {
		bucket map[string]string
		want   uint64
	}{
		{map[string]string{tenantKey: sharedValue}, rlqsLimit},
		{map[string]string{tenantKey: "s9-b1"}, freshLimit},
		{map[string]string{route: route, leafKey: "s9"}, renamedLimit},
	} {
		if r, _ := g2.MatchBucket(domain, c.bucket, nil); r == nil || r.RequestsPerUnit != c.want {
			t.Errorf("bucket %v: %v, want %d/s", c.bucket, r, c.want)
		}
	}
	_, kShared := g1.MatchBucket(domain, map[string]string{tenantKey: "s1-b0"}, nil)
	_, kOther := g1.MatchBucket(domain, map[string]string{tenantKey: "s1-b1"}, nil)
	if string(kShared) == string(kOther) {
		t.Errorf("two fresh tenants share counter %q: each must be a group of its own", kShared)
	}
}

// TestXDSServer: a client of Sluice's own (config/xds) takes the pushes;
// the server counts its ACKs and how far it trails.
func TestXDSServer(t *testing.T) {
	x, err := startXDS()
	if err != nil {
		t.Fatal(err)
	}
	defer x.close()
	if err := x.push(1, 3); err != nil {
		t.Fatal(err)
	}
	c, err := xds.New(xds.Options{Server: x.addr, NodeID: nodeID})
	if err != nil {
		t.Fatal(err)
	}
	r := config.NewSourceReloader(c, nil, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			select {
			case <-ctx.Done():
				t.Fatalf("%s: %+v", what, x.state())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	waitFor("generation 1 ACKed", func() bool { return x.state().ACKs >= 1 })
	if err := x.push(2, 3); err != nil {
		t.Fatal(err)
	}
	waitFor("generation 2 in force", func() bool {
		route := renamedRoute(2, 0)
		tb := r.Current()
		rule, _ := tb.Match(domain, []config.Entry{{Key: route, Value: route}, {Key: leafKey, Value: "x"}}, nil)
		return rule != nil
	})
	waitFor("generation 2 ACKed", func() bool { st := x.state(); return st.Pushed == 2 && st.Lag == 0 && st.ACKs >= 2 })
	if st := x.state(); st.NACKs != 0 || st.Streams != 1 {
		t.Errorf("state %+v, want no NACK and one stream", st)
	}
	cancel()
	<-done
}

// A heap profile as /debug/pprof/heap?debug=1 writes it (MemProfileRate
// 512 KiB, written doubled).
const heapText = `heap profile: 4: 4096 [10: 9999] @ heap/1048576
1: 1048576 [1: 1048576] @ 0x1 0x2 0x3
#	0x1	runtime.mapassign+0x10	/go/src/runtime/map.go:1
#	0x2	github.com/sluicehq/sluice/observe.(*Rules).Snapshot+0x20	/src/observe/rules.go:2
#	0x3	github.com/sluicehq/sluice/observe/ui.(*Traffic).Sample+0x30	/src/observe/ui/traffic.go:3

2: 64 [2: 64] @ 0x4 0x5
#	0x4	github.com/sluicehq/sluice/observe.(*Rules).counters+0x10	/src/observe/rules.go:4
#	0x5	github.com/sluicehq/sluice/config.(*Reloader).Update+0x10	/src/config/reload.go:5

1: 32 [1: 32] @ 0x6
#	0x6	main.main+0x1	/src/main.go:6

0: 0 [5: 500] @ 0x7
#	0x7	github.com/sluicehq/sluice/quota.(*Service).Tick+0x1	/src/quota/service.go:7


# runtime.MemStats
# Alloc = 12345
`

func TestHeapBy(t *testing.T) {
	got, err := heapBy(strings.NewReader(heapText), heapGroups)
	if err != nil {
		t.Fatal(err)
	}
	const rate = 524288.0
	scaled := func(objects, bytes float64) float64 { return bytes / (1 - math.Exp(-bytes/objects/rate)) }
	want := map[string]float64{
		"status page": scaled(1, 1048576), // the traffic's frame, though Snapshot is nearer the allocation
		"metrics":     scaled(2, 64),      // a series made on reload: metrics before config
		"":            scaled(1, 32),
		"rlqs":        0, // freed
	}
	for k, w := range want {
		if math.Abs(got[k]-w) > 1e-6*w {
			t.Errorf("%q: %.1f bytes, want %.1f", k, got[k], w)
		}
	}
	if got["status page"] < 1048576 || got["metrics"] < 100*64 {
		t.Errorf("not scaled up for sampling: %v", got)
	}
	for _, bad := range []string{"", "not a profile\n", "heap profile: 1: 2 [3: 4] @ heap/x\n", "heap profile: 1: 2 [3: 4] @ heap/2\nx: y [ @ 0x1\n"} {
		if _, err := heapBy(strings.NewReader(bad), heapGroups); err == nil {
			t.Errorf("heapBy(%q): no error", bad)
		}
	}
}

func TestLeastSquares(t *testing.T) {
	if got := leastSquares([]float64{0, 1, 2, 3}, []float64{5, 7, 9, 11}); math.Abs(got-2) > 1e-12 {
		t.Errorf("slope %v, want 2", got)
	}
	if got := leastSquares([]float64{0, 1, 2, 3}, []float64{4, 4, 4, 4}); got != 0 {
		t.Errorf("flat: slope %v, want 0", got)
	}
	for _, c := range [][2][]float64{{{1}, {1}}, {{2, 2}, {1, 3}}} {
		if got := leastSquares(c[0], c[1]); !math.IsNaN(got) {
			t.Errorf("leastSquares(%v) = %v, want NaN", c, got)
		}
	}
}

// testRecord is a 10-minute run of two replicas sampled every 30 s,
// with series(replica, minute) as their /metrics series, and one outage
// from minute 4 for 10 s.
func testRecord(series func(rep int, min float64) float64) (settings, *record) {
	s := settings{duration: 10 * time.Minute, replicas: 2}
	start := time.Unix(1_800_000_000, 0)
	rec := &record{start: start, down: &harness.Outages{}, rls: map[int64]*rlsSecond{}, lag: map[int64]time.Duration{}, xds: xdsState{Pushed: 600, ACKs: 1200, Streams: 2}}
	rec.down.Begin(start.Add(4 * time.Minute))
	rec.down.End(start.Add(4*time.Minute + 10*time.Second))
	for at := 30 * time.Second; at <= s.duration; at += 30 * time.Second {
		for rep := range 2 {
			rec.samples = append(rec.samples, sample{At: start.Add(at), Replica: rep, RSSMiB: 50, FDs: 20, Goroutines: 100,
				Series: series(rep, at.Minutes()), RefSeries: 500, CPU: at.Seconds() / 10, FleetErrors: 0,
				LabelSets: 200, TrafficRules: 100, TrafficMiB: 0.5, Heap: map[string]float64{"status page": 1}})
		}
	}
	for sec := range int64(600) {
		rec.rls[start.Unix()+sec] = &rlsSecond{Offered: []int{200, 40}, Granted: []int{100, 20}, Ambiguous: []int{0, 0}}
	}
	for sec := range 600 {
		rec.fleet = append(rec.fleet, loadgen.Second{T: sec + 1, Start: start.Add(time.Duration(sec) * time.Second), Offered: 200, Admitted: 98, Limit: rlqsLimit})
	}
	return s, rec
}

func failed(r *report) []string {
	var out []string
	for _, c := range r.checks {
		if !c.ok {
			out = append(out, c.name+" "+c.who+": "+c.measured)
		}
	}
	return out
}

func TestAnalyse_Steady(t *testing.T) {
	s, rec := testRecord(func(int, float64) float64 { return 1000 })
	if r := analyse(s, rec); !r.pass() {
		t.Errorf("a steady run fails: %q", failed(r))
	}
}

// TestAnalyse_Growth: a warm-up in the first half is not judged; a
// growth in the second half is, per replica.
func TestAnalyse_Growth(t *testing.T) {
	s, rec := testRecord(func(rep int, m float64) float64 {
		if rep == 0 {
			return 1000 + 100*min(m, 5) // warms up, then flat
		}
		return 1000 + 100*m // 100 series a minute: 250 over the second half, > 2 %
	})
	r := analyse(s, rec)
	got := failed(r)
	if len(got) != 1 || !strings.HasPrefix(got[0], "/metrics series flat sluice2") {
		t.Errorf("failed checks %q, want /metrics series of sluice2 only", got)
	}
}

// TestAnalyse_Limits: a window over the limit fails unless it met an
// outage; a grant answered in the next second is not held against either
// window; the RLQS fleet above 1.10 × L fails outside the outages;
// errors while Redis is up fail.
func TestAnalyse_Limits(t *testing.T) {
	s, rec := testRecord(func(int, float64) float64 { return 1000 })
	start := rec.start.Unix()
	rec.rls[start+245].Granted[0] = 150                        // in the outage (4:00–4:10)
	rec.rls[start+300].Ambiguous[1] = 5                        // 20 known + 5 either window
	rec.fleet[242].Admitted = 300                              // in the outage
	rec.fleet[400].Offered, rec.fleet[400].Admitted = 359, 190 // the simulator caught up a late step
	rec.fleet[450].Offered, rec.fleet[450].Admitted = 232, 166 // its offers add up, but the soak ran 7 s late
	rec.lag[rec.fleet[450].Start.Unix()] = 7 * time.Second
	if r := analyse(s, rec); !r.pass() {
		t.Fatalf("fails: %q", failed(r))
	}
	rec.rls[start+100].Granted[0] = 101
	rec.fleet[100].Admitted = 111
	rec.rls[start+200].ErrUp = 1
	rec.lag[start+202] = time.Second // the soak ran late: counted all the same
	rec.samples[len(rec.samples)-1].FleetErrors = 2
	got := failed(analyse(s, rec))
	want := []string{"RLS errors while Redis up", "RLQS fleet exchange errors while Redis up", "RLS admitted ≤ limit, every window route a", "RLQS fleet admitted"}
	if len(got) != len(want) {
		t.Fatalf("failed %q, want %d checks", got, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Errorf("failed check %d: %q, want %q…", i, got[i], w)
		}
	}
	if !strings.Contains(got[0], "1 of them sent while the soak itself ran late") {
		t.Errorf("the RLS errors do not say the soak ran late: %q", got[0])
	}
}

// TestReport_Files: the CSVs and the markdown have a row per sample, per
// second and per minute.
func TestReport_Files(t *testing.T) {
	s, rec := testRecord(func(int, float64) float64 { return 1000 })
	dir := t.TempDir()
	s.csvPath, s.secondsPath, s.mdPath = dir+"/s.csv", dir+"/sec.csv", dir+"/r.md"
	r := analyse(s, rec)
	if err := r.writeFiles(); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if n := strings.Count(read(s.csvPath), "\n"); n != 1+len(rec.samples) {
		t.Errorf("samples CSV: %d lines, want %d", n, 1+len(rec.samples))
	}
	if n := strings.Count(read(s.secondsPath), "\n"); n != 1+600 {
		t.Errorf("seconds CSV: %d lines, want 601", n)
	}
	md := read(s.mdPath)
	for _, want := range []string{"PASS", "## Verdict", "## Slopes", "### sluice1", "### sluice2", "### Traffic", "\n| 10 |"} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	if strings.Contains(md, "\n| 11 |") {
		t.Errorf("markdown has an 11th minute of a 10-minute run:\n%s", md)
	}
}

func TestSettingsCheck(t *testing.T) {
	defaults := func() *settings { return flags(flag.NewFlagSet("churn", flag.ContinueOnError)) }
	if err := defaults().check(); err != nil {
		t.Errorf("the defaults: %v", err)
	}
	for name, bad := range map[string]func(*settings){
		"no duration":   func(s *settings) { s.duration = 0 },
		"no replica":    func(s *settings) { s.replicas = 0 },
		"no value":      func(s *settings) { s.detailedValues = 0 },
		"negative rate": func(s *settings) { s.churnRate = -1 },
		"no sampling":   func(s *settings) { s.sample = 0 },
	} {
		s := defaults()
		bad(s)
		if err := s.check(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	s := defaults()
	s.renamed = 0 // no renamed rules: no traffic on them either
	if err := s.check(); err != nil {
		t.Errorf("-renamed 0: %v", err)
	}
	if tr := newRLSTraffic(nil, nil, *s, func() int { return 1 }); len(tr.classes) != len(limited)+1 {
		t.Errorf("-renamed 0: %d classes of RLS traffic, want the limited rules and the detailed one", len(tr.classes))
	}
}
