package ui_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/observe/ui"
)

// names is a Snapshotter that lists n of its rules, from first, whose
// names it makes once: a snapshot allocates nothing but dst's growth.
type names struct {
	all          []string
	first, n, at int
}

func (s *names) Snapshot(dst []observe.RuleCounts) []observe.RuleCounts {
	s.at++
	for _, r := range s.all[s.first : s.first+s.n] {
		dst = append(dst, observe.RuleCounts{Domain: "web", Rule: r, Counts: observe.Counts{Within: uint64(s.at)}})
	}
	return dst
}

func newNames(total int) *names {
	s := &names{all: make([]string, total)}
	for i := range s.all {
		s.all[i] = fmt.Sprintf("route-%d/rule/0/match/0", i)
	}
	return s
}

func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// TestTraffic_HeldGauges: sluice_ui_traffic_rules is the rules the
// samples hold, the rules listed now however many were renamed before;
// sluice_ui_traffic_bytes is within a quarter of the heap the samples
// take, stops growing while renamed configs of one size follow each
// other (once every sample was rewritten), and falls when the config
// shrinks, as that heap does.
func TestTraffic_HeldGauges(t *testing.T) {
	const big, small = 10000, 100
	src := newNames(big + 3*ui.DefaultWindow*small)
	tr := ui.NewTraffic(src, time.Second, ui.DefaultWindow)
	reg := prometheus.NewRegistry()
	if err := ui.RegisterMetrics(reg, tr); err != nil {
		t.Fatal(err)
	}
	gauges := func() (rules, bytes float64) {
		fams := scrape(t, reg)
		return fams["sluice_ui_traffic_rules"].GetMetric()[0].GetGauge().GetValue(),
			fams["sluice_ui_traffic_bytes"].GetMetric()[0].GetGauge().GetValue()
	}
	if rules, _ := gauges(); rules != 0 {
		t.Fatalf("before a sample: %v rules held, want 0", rules)
	}
	base := liveHeap()

	// A config of big rules for a whole window: the most the samples hold.
	src.first, src.n = 0, big
	for s := range ui.DefaultWindow + 1 {
		tr.Sample(at(float64(s)))
	}
	full := liveHeap() - base
	rules, bytes := gauges()
	if rules != big {
		t.Errorf("%d rules listed: %v held", big, rules)
	}
	if r := bytes / float64(full); r < 0.75 || r > 1.25 {
		t.Errorf("%d rules for a window: sluice_ui_traffic_bytes %.0f, the heap took %d (ratio %.2f), want within a quarter", big, bytes, full, r)
	}
	t.Logf("%d rules for a window: gauge %.1f MiB, heap %.1f MiB", big, bytes/(1<<20), float64(full)/(1<<20))

	// Renamed configs of small rules, one a sample, for three windows.
	src.first, src.n = big, small
	var first int
	for gen := range 3 * ui.DefaultWindow {
		src.first = big + gen*small
		tr.Sample(at(float64(ui.DefaultWindow + 1 + gen)))
		rules, bytes := tr.Held()
		if rules != small {
			t.Fatalf("generation %d: %v rules held, want %d (the rules listed now)", gen, rules, small)
		}
		switch {
		case gen == 2*ui.DefaultWindow: // every sample rewritten since the big config
			first = bytes
		case gen > 2*ui.DefaultWindow && bytes > first:
			t.Fatalf("generation %d: Held %d bytes, grew from %d with renamed configs of one size", gen, bytes, first)
		}
	}
	after := liveHeap() - base
	rules, bytes = gauges()
	if rules != small {
		t.Errorf("at the end: sluice_ui_traffic_rules %v, want %d", rules, small)
	}
	if bytes > float64(full)/20 || after > full/20 {
		t.Errorf("config shrank from %d rules to %d: gauge %.0f bytes and heap %d, want both under a twentieth of %d", big, small, bytes, after, full)
	}
	runtime.KeepAlive(tr)
	runtime.KeepAlive(src)
}
