package ui_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/observe/ui"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counts is a hand-written Snapshotter whose counts the test sets.
type counts struct {
	mu sync.Mutex
	m  map[[3]string]observe.Counts
}

func newCounts() *counts { return &counts{m: map[[3]string]observe.Counts{}} }

func (c *counts) add(domain, rule, value string, within, over, near, shadow uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := [3]string{domain, rule, value}
	v := c.m[k]
	v.Within += within
	v.Over += over
	v.Near += near
	v.Shadow += shadow
	c.m[k] = v
}

// remove stops listing a rule's label sets, as observe.Rules does when
// the rule leaves the config.
func (c *counts) remove(domain, rule string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := range c.m {
		if k[0] == domain && k[1] == rule {
			delete(c.m, k)
		}
	}
}

func (c *counts) Snapshot(dst []observe.RuleCounts) []observe.RuleCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, v := range c.m {
		dst = append(dst, observe.RuleCounts{Domain: k[0], Rule: k[1], Value: k[2], Counts: v})
	}
	return dst
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()

func at(s float64) int64 { return t0 + int64(s*1e9) }

// TestTraffic_Rates walks samples through a step table: each interval's
// rate is its difference divided by its length, the window sums them and
// the totals are the counts now.
func TestTraffic_Rates(t *testing.T) {
	c := newCounts()
	tr := ui.NewTraffic(c, time.Second, 3)
	c.add("web", "idle", "", 0, 0, 0, 0) // exported at zero: not listed
	c.add("web", "k", "", 5, 0, 0, 0)
	tr.Sample(at(0))
	if v := tr.View(); len(v.Rules) != 1 || v.Rules[0].Within != nil || v.Rules[0].Total.Within != 5 {
		t.Fatalf("one sample: %+v, want totals and no rates yet", v.Rules)
	}
	steps := []struct {
		at                      float64
		within, over, near, shd uint64
		wantWithin, wantOver    []float64
		wantWindow              ui.CountsJSON
	}{
		{1, 10, 2, 1, 0, []float64{10}, []float64{2}, ui.CountsJSON{Within: 10, Over: 2, Near: 1}},
		{3, 4, 0, 0, 0, []float64{10, 2}, []float64{2, 0}, ui.CountsJSON{Within: 14, Over: 2, Near: 1}},
		{3, 100, 0, 0, 0, []float64{10, 2}, []float64{2, 0}, ui.CountsJSON{Within: 14, Over: 2, Near: 1}}, // not after the last sample: ignored
		{4, 0, 6, 0, 6, []float64{10, 2, 100}, []float64{2, 0, 6}, ui.CountsJSON{Within: 114, Over: 8, Near: 1, Shadow: 6}},
		// The window holds 3 rates: the first falls out.
		{5, 1, 0, 0, 0, []float64{2, 100, 1}, []float64{0, 6, 0}, ui.CountsJSON{Within: 105, Over: 6, Shadow: 6}},
	}
	for i, s := range steps {
		c.add("web", "k", "", s.within, s.over, s.near, s.shd)
		tr.Sample(at(s.at))
		v := tr.View()
		if len(v.Rules) != 1 {
			t.Fatalf("step %d: %d rules, want 1", i, len(v.Rules))
		}
		r := v.Rules[0]
		if fmt.Sprint(r.Within) != fmt.Sprint(s.wantWithin) || fmt.Sprint(r.Over) != fmt.Sprint(s.wantOver) || r.Window != s.wantWindow {
			t.Errorf("step %d: within %v over %v window %+v, want %v %v %+v", i, r.Within, r.Over, r.Window, s.wantWithin, s.wantOver, s.wantWindow)
		}
	}
}

// TestTraffic_DropsRulesThatLeave: a rule the source no longer lists
// (it left the config) is gone from the view at the next sample, though
// its traffic is within the window; the rates of the rules that stay
// are unchanged by the drop.
func TestTraffic_DropsRulesThatLeave(t *testing.T) {
	c := newCounts()
	tr := ui.NewTraffic(c, time.Second, 5)
	for s := range 3 {
		c.add("web", "gone", "", 10, 0, 0, 0)
		c.add("web", "stays", "", 1, 2, 0, 0)
		c.add("web", "stays", "det_v", 3, 0, 0, 0)
		tr.Sample(at(float64(s)))
	}
	c.remove("web", "gone")
	c.add("web", "new", "", 7, 0, 0, 0)
	c.add("web", "stays", "", 1, 2, 0, 0)
	tr.Sample(at(3))
	v := tr.View()
	var rules []string
	for _, r := range v.Rules {
		rules = append(rules, r.Rule)
	}
	if fmt.Sprint(rules) != "[stays new]" {
		t.Fatalf("rules %v, want [stays new]: the rule that left is dropped", rules)
	}
	stays := v.Rules[0]
	if fmt.Sprint(stays.Within) != "[4 4 1]" || fmt.Sprint(stays.Over) != "[2 2 2]" || stays.Window != (ui.CountsJSON{Within: 9, Over: 6}) {
		t.Errorf("stays: within %v over %v window %+v, want [4 4 1] [2 2 2] {9 6}", stays.Within, stays.Over, stays.Window)
	}
	if n := v.Rules[1]; fmt.Sprint(n.Within) != "[0 0 7]" || n.Total.Within != 7 {
		t.Errorf("new: within %v total %+v, want [0 0 7] and 7", n.Within, n.Total)
	}
}

// TestTraffic_Charges: the units charged, charged past the limit and
// refunded are summed over a detailed rule's values, in the window and
// in total.
func TestTraffic_Charges(t *testing.T) {
	c := newCounts()
	tr := ui.NewTraffic(c, time.Second, 3)
	c.m[[3]string{"ai", "tokens", "user_a"}] = observe.Counts{Within: 100}
	tr.Sample(at(0))
	c.m[[3]string{"ai", "tokens", "user_a"}] = observe.Counts{Within: 900, Over: 1500, Charged: 2300, ChargedOver: 1500, Refunded: 40}
	c.m[[3]string{"ai", "tokens", "user_b"}] = observe.Counts{Within: 1_000_000, Charged: 1_000_000}
	tr.Sample(at(1))
	v := tr.View()
	if len(v.Rules) != 1 {
		t.Fatalf("%d rules, want 1", len(v.Rules))
	}
	r := v.Rules[0]
	if want := (ui.CountsJSON{Within: 1_000_800, Over: 1500, Charged: 1_002_300, ChargedOver: 1500, Refunded: 40}); r.Window != want {
		t.Errorf("window %+v, want %+v", r.Window, want)
	}
	if want := (ui.CountsJSON{Within: 1_000_900, Over: 1500, Charged: 1_002_300, ChargedOver: 1500, Refunded: 40}); r.Total != want {
		t.Errorf("total %+v, want %+v", r.Total, want)
	}
}

// TestTraffic_OrderAndBounds: the most active rules first, at most
// MaxTrafficRules; a detailed rule's values summed into the rule and
// listed, at most MaxValues, the most hit first.
func TestTraffic_OrderAndBounds(t *testing.T) {
	c := newCounts()
	tr := ui.NewTraffic(c, time.Second, 60)
	for i := range ui.MaxTrafficRules + 10 {
		c.add("web", fmt.Sprintf("r%03d", i), "", uint64(i+1), 0, 0, 0)
	}
	for i := range ui.MaxValues + 5 {
		c.add("web", "det", fmt.Sprintf("det_v%02d", i), uint64(1000+i), 0, 0, 0)
	}
	tr.Sample(at(0))
	c.add("web", "r000", "", 0, 5000, 0, 0) // the least hit in total, the most active now
	tr.Sample(at(1))
	v := tr.View()
	if len(v.Rules) != ui.MaxTrafficRules || !v.Truncated {
		t.Fatalf("%d rules, truncated %v; want %d, true", len(v.Rules), v.Truncated, ui.MaxTrafficRules)
	}
	if v.Rules[0].Rule != "r000" || v.Rules[1].Rule != "det" {
		t.Errorf("order: %s, %s; want r000 (active in the window), then det (most hits)", v.Rules[0].Rule, v.Rules[1].Rule)
	}
	det := v.Rules[1]
	if len(det.Values) != ui.MaxValues || det.Values[0].Value != fmt.Sprintf("det_v%02d", ui.MaxValues+4) {
		t.Errorf("values %+v: want %d, the most hit first", det.Values, ui.MaxValues)
	}
	if det.Total.Within < 1000*uint64(ui.MaxValues+5) {
		t.Errorf("det total %d: want every value's hits", det.Total.Within)
	}
	for _, r := range v.Rules {
		if r.Rule != "det" && r.Values != nil {
			t.Errorf("rule %s lists values", r.Rule)
		}
	}
}

// TestTraffic_Run samples at once and returns when its context ends.
func TestTraffic_Run(t *testing.T) {
	c := newCounts()
	c.add("web", "k", "", 1, 0, 0, 0)
	tr := ui.NewTraffic(c, time.Hour, 0)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- tr.Run(ctx) }()
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if v := tr.View(); v.IntervalS != 3600 || len(v.Rules) != 1 {
		t.Errorf("view %+v", v)
	}
}

// TestTraffic_Concurrent: samples, views and counting at once, under
// -race; rates never go negative and totals never decrease.
func TestTraffic_Concurrent(t *testing.T) {
	c := newCounts()
	tr := ui.NewTraffic(c, time.Second, 10)
	for i := range 8 {
		c.add("web", fmt.Sprintf("r%d", i), "", 1, 0, 0, 0)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				c.add("web", fmt.Sprintf("r%d", (g+i)%8), "", 1, uint64(i%2), 0, 0)
			}
		})
	}
	wg.Go(func() {
		for s := 0; ; s++ {
			select {
			case <-stop:
				return
			default:
			}
			tr.Sample(at(float64(s)))
		}
	})
	last := map[string]uint64{}
	for range 50 {
		for _, r := range tr.View().Rules {
			for _, x := range append(r.Within, r.Over...) {
				if x < 0 {
					t.Fatalf("%s: negative rate %v", r.Rule, x)
				}
			}
			if tot := r.Total.Within + r.Total.Over; tot < last[r.Rule] {
				t.Fatalf("%s: total went from %d to %d", r.Rule, last[r.Rule], tot)
			} else {
				last[r.Rule] = tot
			}
		}
	}
	close(stop)
	wg.Wait()
	if len(last) != 8 {
		t.Errorf("%d rules seen, want 8", len(last))
	}
}
