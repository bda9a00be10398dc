package ui

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/observe"
)

// Snapshotter reads cumulative per-rule counts; *observe.Rules is one.
type Snapshotter interface {
	Snapshot(dst []observe.RuleCounts) []observe.RuleCounts
}

// Bounds of the traffic JSON.
const (
	// DefaultWindow is how many samples Traffic keeps: a minute at one a
	// second.
	DefaultWindow = 60
	// MaxTrafficRules is the most rules the traffic JSON lists, the most
	// active first.
	MaxTrafficRules = 200
	// MaxValues is the most values of a detailed rule the traffic JSON
	// lists, the most hit first.
	MaxValues = 10
)

// ruleID names a rule as observe labels it: domain and config.Rule.Path.
type ruleID struct{ domain, rule string }

// frame is one sample: the cumulative counts of the rules held, by slot
// (Traffic.rules); a slot past the end of counts was not listed then and
// counts zero.
type frame struct {
	at     int64 // Unix nanoseconds
	counts []observe.Counts
}

// count is f's counts of the rule in slot s.
func (f *frame) count(s int) observe.Counts {
	if s < len(f.counts) {
		return f.counts[s]
	}
	return observe.Counts{}
}

// Traffic samples the per-rule counters at a fixed interval and keeps the
// last Window samples, from which it derives each rule's rates. It keeps
// no counts of its own, and holds only the rules its source lists now
// (for observe.Rules, those of the config in force): a rule that is no
// longer listed is dropped from every sample at the next one, so its
// memory is bounded by the live config, Window+1 counts per rule. Safe
// for concurrent use.
type Traffic struct {
	src      Snapshotter
	interval time.Duration

	mu     sync.Mutex // guards what follows
	ids    map[ruleID]int
	rules  []ruleID // the rules held, by slot
	frames []frame  // ring of window+1 samples
	next   int      // where the next sample goes
	n      int      // samples held
	buf    []observe.RuleCounts
	slots  []int  // scratch: buf's slots
	listed []bool // scratch: the slots the last snapshot listed
}

// NewTraffic returns a Traffic over src that keeps window rates (window+1
// samples) taken every interval. Zero values mean DefaultWindow and one
// second.
func NewTraffic(src Snapshotter, interval time.Duration, window int) *Traffic {
	if interval <= 0 {
		interval = time.Second
	}
	if window <= 0 {
		window = DefaultWindow
	}
	return &Traffic{src: src, interval: interval, ids: map[ruleID]int{}, frames: make([]frame, window+1)}
}

// Run samples every interval until ctx ends.
func (t *Traffic) Run(ctx context.Context) error {
	tk := time.NewTicker(t.interval)
	defer tk.Stop()
	t.Sample(time.Now().UnixNano())
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tk.C:
			t.Sample(now.UnixNano())
		}
	}
}

// Sample records every rule's counts at now (Unix nanoseconds), and drops
// the rules the source no longer lists from every sample. A sample not
// after the previous one is ignored.
func (t *Traffic) Sample(now int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.n > 0 && now <= t.frames[(t.next+len(t.frames)-1)%len(t.frames)].at {
		return
	}
	t.buf = shrink(t.src.Snapshot(t.buf[:0]))
	t.slots = t.slots[:0]
	clear(t.listed)
	for _, c := range t.buf {
		id := ruleID{c.Domain, c.Rule}
		s, ok := t.ids[id]
		if !ok {
			s = len(t.rules)
			t.ids[id] = s
			t.rules = append(t.rules, id)
			t.listed = append(t.listed, false)
		}
		t.listed[s] = true
		t.slots = append(t.slots, s)
	}
	t.slots = shrink(t.slots)
	f := &t.frames[t.next]
	f.at = now
	f.counts = slices.Grow(f.counts[:0], len(t.rules))[:len(t.rules)]
	clear(f.counts)
	for i, c := range t.buf {
		s := t.slots[i]
		f.counts[s] = add(f.counts[s], c.Counts)
	}
	t.next = (t.next + 1) % len(t.frames)
	t.n = min(t.n+1, len(t.frames))
	if slices.Contains(t.listed, false) {
		t.compact()
	}
}

// compact drops the rules the last snapshot did not list from every
// sample, and the memory they held. t.mu is held.
func (t *Traffic) compact() {
	to := make([]int, len(t.rules)) // a slot's new slot, or -1
	kept := 0
	for s, id := range t.rules {
		if !t.listed[s] {
			to[s] = -1
			continue
		}
		to[s] = kept
		t.rules[kept] = id
		kept++
	}
	clear(t.rules[kept:])
	t.rules = shrink(t.rules[:kept])
	t.listed = shrink(t.listed[:kept])
	// A map does not give back the memory of deleted keys: make it anew.
	t.ids = make(map[ruleID]int, kept)
	for s, id := range t.rules {
		t.ids[id] = s
	}
	for i := range t.frames {
		f := &t.frames[i]
		n := 0
		for s, c := range f.counts {
			if to[s] >= 0 { // to[s] <= s: in place
				f.counts[to[s]] = c
				n = to[s] + 1
			}
		}
		f.counts = shrink(f.counts[:n])
	}
}

// shrink returns s, copied to a smaller array when it uses less than a
// quarter of a large one, so that a config that shrank does not keep the
// memory of the one before.
func shrink[S ~[]E, E any](s S) S {
	if cap(s) > 1024 && len(s) < cap(s)/4 {
		return slices.Clone(s)
	}
	return s
}

func add(a, b observe.Counts) observe.Counts {
	return observe.Counts{Within: a.Within + b.Within, Over: a.Over + b.Over, Near: a.Near + b.Near, Shadow: a.Shadow + b.Shadow,
		Charged: a.Charged + b.Charged, ChargedOver: a.ChargedOver + b.ChargedOver, Refunded: a.Refunded + b.Refunded}
}

// sub returns b - a, each count at least 0.
func sub(b, a observe.Counts) observe.Counts {
	d := func(x, y uint64) uint64 {
		if x < y {
			return 0
		}
		return x - y
	}
	return observe.Counts{Within: d(b.Within, a.Within), Over: d(b.Over, a.Over), Near: d(b.Near, a.Near), Shadow: d(b.Shadow, a.Shadow),
		Charged: d(b.Charged, a.Charged), ChargedOver: d(b.ChargedOver, a.ChargedOver), Refunded: d(b.Refunded, a.Refunded)}
}

// CountsJSON are counts of hits (units: a request's hits_addend, the
// tokens of a charge) as the JSON shows them.
type CountsJSON struct {
	Within uint64 `json:"within"`
	Over   uint64 `json:"over"`
	Near   uint64 `json:"near"`
	Shadow uint64 `json:"shadow"`
	// Charged counts the units charged after the fact (within and over
	// above), ChargedOver those recorded past the limit, Refunded those
	// given back (see observe.Counts).
	Charged     uint64 `json:"charged"`
	ChargedOver uint64 `json:"charged_over"`
	Refunded    uint64 `json:"refunded"`
}

func (c CountsJSON) counts() observe.Counts {
	return observe.Counts{Within: c.Within, Over: c.Over, Near: c.Near, Shadow: c.Shadow,
		Charged: c.Charged, ChargedOver: c.ChargedOver, Refunded: c.Refunded}
}

func countsJSON(c observe.Counts) CountsJSON {
	return CountsJSON{Within: c.Within, Over: c.Over, Near: c.Near, Shadow: c.Shadow,
		Charged: c.Charged, ChargedOver: c.ChargedOver, Refunded: c.Refunded}
}

// RuleTraffic is one rule's traffic.
type RuleTraffic struct {
	Domain string `json:"domain"`
	// Rule is the rule's path (config.Rule.Path), or observe.OverrideRule
	// for the hits of requests' own limit overrides.
	Rule string `json:"rule"`
	// Within and Over are hits per second in each sampling interval,
	// oldest first (at most Window of them).
	Within []float64 `json:"within_per_s"`
	Over   []float64 `json:"over_per_s"`
	// Window is the counts over the samples held (about the last minute);
	// Total since the server started.
	Window CountsJSON `json:"window"`
	Total  CountsJSON `json:"total"`
	// Values lists a detailed_metric rule's most hit values; nil for
	// every other rule.
	Values []ValueTraffic `json:"values,omitempty"`
	// active orders rules: hits in the window, then in total.
	active [2]uint64
}

// ValueTraffic is one value of a detailed rule, as observe labels it.
type ValueTraffic struct {
	Value string     `json:"value"`
	Total CountsJSON `json:"total"`
}

// TrafficView is the traffic JSON.
type TrafficView struct {
	IntervalS float64       `json:"interval_s"`
	Rules     []RuleTraffic `json:"rules"`
	// Truncated reports rules left out past MaxTrafficRules.
	Truncated bool `json:"truncated"`
}

// View returns the rates between the samples held and the current totals
// of every rule the source lists that has seen traffic, the most active
// first, at most MaxTrafficRules.
func (t *Traffic) View() TrafficView {
	byID := map[ruleID]*RuleTraffic{}
	var order []*RuleTraffic
	for _, c := range t.src.Snapshot(nil) {
		id := ruleID{c.Domain, c.Rule}
		r := byID[id]
		if r == nil {
			r = &RuleTraffic{Domain: id.domain, Rule: id.rule}
			byID[id] = r
			order = append(order, r)
		}
		r.Total = countsJSON(add(r.Total.counts(), c.Counts))
		if c.Value != "" && c.Counts != (observe.Counts{}) {
			r.Values = append(r.Values, ValueTraffic{Value: c.Value, Total: countsJSON(c.Counts)})
		}
	}
	t.mu.Lock()
	frames := make([]*frame, 0, t.n)
	for i := t.n; i > 0; i-- {
		frames = append(frames, &t.frames[(t.next+len(t.frames)-i)%len(t.frames)])
	}
	if len(frames) > 1 {
		first, last := frames[0], frames[len(frames)-1]
		for s, id := range t.rules {
			r := byID[id]
			w := sub(last.count(s), first.count(s))
			if r == nil || w == (observe.Counts{}) {
				continue // left since the last sample, or idle
			}
			r.Window = countsJSON(w)
			r.Within = make([]float64, 0, len(frames)-1)
			r.Over = make([]float64, 0, len(frames)-1)
			for i := 1; i < len(frames); i++ {
				d := sub(frames[i].count(s), frames[i-1].count(s))
				secs := float64(frames[i].at-frames[i-1].at) / 1e9
				r.Within = append(r.Within, float64(d.Within)/secs)
				r.Over = append(r.Over, float64(d.Over)/secs)
			}
		}
	}
	t.mu.Unlock()

	out := TrafficView{IntervalS: t.interval.Seconds(), Rules: []RuleTraffic{}}
	for _, r := range order {
		r.active = [2]uint64{r.Window.Within + r.Window.Over, r.Total.Within + r.Total.Over}
		if r.active[1] == 0 {
			continue // seen no traffic (exported at zero for /metrics)
		}
		slices.SortFunc(r.Values, func(a, b ValueTraffic) int {
			return cmp.Or(cmp.Compare(b.Total.Within+b.Total.Over, a.Total.Within+a.Total.Over), cmp.Compare(a.Value, b.Value))
		})
		if len(r.Values) > MaxValues {
			r.Values = r.Values[:MaxValues]
		}
		out.Rules = append(out.Rules, *r)
	}
	slices.SortFunc(out.Rules, func(a, b RuleTraffic) int {
		return cmp.Or(cmp.Compare(b.active[0], a.active[0]), cmp.Compare(b.active[1], a.active[1]),
			cmp.Compare(a.Domain, b.Domain), cmp.Compare(a.Rule, b.Rule))
	})
	if len(out.Rules) > MaxTrafficRules {
		out.Rules, out.Truncated = out.Rules[:MaxTrafficRules], true
	}
	return out
}
