package observe

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
)

// Defaults for Options.
const (
	DefaultNearLimitRatio   = 0.8
	DefaultMaxValuesPerRule = 100
)

// Label values that stand for a group rather than a request's value.
const (
	// OtherValue counts the values of a detailed rule past its cap, and
	// the domains of overrides past the cap.
	OtherValue = "_other"
	// OverrideRule is the rule label of hits counted by a request's own
	// limit override.
	OverrideRule = "_override"
)

// Options configure Rules. The zero value means defaults.
type Options struct {
	// NearLimitRatio: an allowed hit that leaves the rule's usage at or
	// above this fraction of its limit also counts as near the limit.
	// Zero means DefaultNearLimitRatio.
	NearLimitRatio float64
	// MaxValuesPerRule caps the distinct value labels of a detailed rule
	// (and the domains counted for overrides). Zero means
	// DefaultMaxValuesPerRule.
	MaxValuesPerRule int
}

// Rules counts rate-limit decisions per rule: hits, within limit, over
// limit, near limit and shadow-mode overrides, labelled with the domain,
// the rule's key path (config.Rule.Path) and, for detailed rules only, the
// descriptor's value. It implements limiter.Observer and is safe for
// concurrent use.
type Rules struct {
	ratio     float64
	maxValues int

	storeFailures *prometheus.CounterVec
	failed        atomic.Uint64 // storeFailures' sum, for RefStats

	// index maps the rules of the tables seen to their counters. It is
	// replaced whole (copy on write) under mu, read with one atomic load.
	index atomic.Pointer[map[*config.Rule]*ruleSeries]
	mu    sync.Mutex
	// overrides maps a domain to the counters of its override hits.
	overrides atomic.Pointer[map[string]*counters]

	// byLabels holds every label set's counters, for Collect. A leaf lock:
	// nothing else is locked while holding it.
	labelsMu sync.Mutex
	byLabels map[[3]string]*counters
}

// counters are one label set's counts, in hits (each descriptor adds its
// hits_addend, limiter.Status.Hits). Hits are not counted apart: every
// descriptor's hits are either within or over the limit, so hits =
// within + over, one atomic add per descriptor fewer on the hot path.
type counters struct {
	within, over, near, shadow, local atomic.Uint64
	// charges (usage recorded after the fact, within or over) and those
	// recorded past the limit; refunds, which count in no other counter.
	charged, chargedOver, refunded atomic.Uint64
	labels                         [3]string // domain, rule, value
}

// ruleSeries are a rule's counters: one set, or one per value for a
// detailed rule.
type ruleSeries struct {
	plain *counters // nil for a detailed rule

	mu     sync.Mutex
	buf    []byte               // builds a value; guarded by mu
	values map[string]*counters // detailed rule: by value, capped
	other  *counters            // detailed rule: past the cap
}

var (
	ruleLabels = []string{"domain", "rule", "value"}
	hitsDesc   = prometheus.NewDesc("sluice_rule_hits_total",
		"Hits (hits_addend) of descriptors that matched the rule.", ruleLabels, nil)
	withinDesc = prometheus.NewDesc("sluice_rule_within_limit_total", "Hits the rule allowed.", ruleLabels, nil)
	overDesc   = prometheus.NewDesc("sluice_rule_over_limit_total",
		"Hits over the rule's limit (denied, or reported only in shadow mode).", ruleLabels, nil)
	nearDesc = prometheus.NewDesc("sluice_rule_near_limit_total",
		"Allowed hits that brought the rule's usage to or above the near-limit ratio.", ruleLabels, nil)
	shadowDesc = prometheus.NewDesc("sluice_rule_shadow_mode_total",
		"Hits over the limit of a shadow-mode rule, allowed anyway.", ruleLabels, nil)
	localDesc = prometheus.NewDesc("sluice_rule_over_limit_local_cache_total",
		"Hits over the limit answered from the store's local over-limit cache, without a Redis call.", ruleLabels, nil)
	chargedDesc = prometheus.NewDesc("sluice_rule_charged_total",
		"Units charged after the fact (a descriptor's own hits_addend above 0), recorded whole, within the limit or past it.", ruleLabels, nil)
	chargedOverDesc = prometheus.NewDesc("sluice_rule_charged_over_limit_total",
		"Units of charges that did not fit, recorded past the limit (the overspend).", ruleLabels, nil)
	refundedDesc = prometheus.NewDesc("sluice_rule_refunded_total",
		"Units given back (is_negative_hits).", ruleLabels, nil)
)

// NewRules registers the per-rule and store-failure counters on reg.
func NewRules(reg prometheus.Registerer, opts Options) (*Rules, error) {
	if opts.NearLimitRatio <= 0 {
		opts.NearLimitRatio = DefaultNearLimitRatio
	}
	if opts.MaxValuesPerRule <= 0 {
		opts.MaxValuesPerRule = DefaultMaxValuesPerRule
	}
	if opts.NearLimitRatio > 1 {
		return nil, errors.New("observe: near-limit ratio must be in (0, 1]")
	}
	r := &Rules{
		ratio: opts.NearLimitRatio, maxValues: opts.MaxValuesPerRule,
		storeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "store", Name: "failures_total",
			Help: "Requests the store could not decide, by kind of error and by the failure mode that answered them."}, []string{"kind", "mode"}),
		byLabels: map[[3]string]*counters{},
	}
	for _, c := range []prometheus.Collector{rulesCollector{r}, r.storeFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	r.index.Store(&map[*config.Rule]*ruleSeries{})
	r.overrides.Store(&map[string]*counters{})
	return r, nil
}

// rulesCollector exports the per-rule counters at scrape time.
type rulesCollector struct{ r *Rules }

func (c rulesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{hitsDesc, withinDesc, overDesc, nearDesc, shadowDesc, localDesc, chargedDesc, chargedOverDesc, refundedDesc} {
		ch <- d
	}
}

func (c rulesCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.labelsMu.Lock()
	all := make([]*counters, 0, len(c.r.byLabels))
	for _, s := range c.r.byLabels {
		all = append(all, s)
	}
	c.r.labelsMu.Unlock()
	for _, s := range all {
		l := s.labels[:]
		within, over := float64(s.within.Load()), float64(s.over.Load())
		ch <- prometheus.MustNewConstMetric(hitsDesc, prometheus.CounterValue, within+over, l...)
		ch <- prometheus.MustNewConstMetric(withinDesc, prometheus.CounterValue, within, l...)
		ch <- prometheus.MustNewConstMetric(overDesc, prometheus.CounterValue, over, l...)
		ch <- prometheus.MustNewConstMetric(nearDesc, prometheus.CounterValue, float64(s.near.Load()), l...)
		ch <- prometheus.MustNewConstMetric(shadowDesc, prometheus.CounterValue, float64(s.shadow.Load()), l...)
		ch <- prometheus.MustNewConstMetric(localDesc, prometheus.CounterValue, float64(s.local.Load()), l...)
		ch <- prometheus.MustNewConstMetric(chargedDesc, prometheus.CounterValue, float64(s.charged.Load()), l...)
		ch <- prometheus.MustNewConstMetric(chargedOverDesc, prometheus.CounterValue, float64(s.chargedOver.Load()), l...)
		ch <- prometheus.MustNewConstMetric(refundedDesc, prometheus.CounterValue, float64(s.refunded.Load()), l...)
	}
}

// SetTable resolves the counters of t's rules, so that they are exported
// at zero before the first hit, and forgets the rules of earlier tables.
// Call it with the first table and from config.Reloader.OnReload. Rules
// of a table never passed here are resolved on their first hit.
func (r *Rules) SetTable(t *config.Table) {
	if t == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.index.Load()
	idx := make(map[*config.Rule]*ruleSeries, len(old))
	for _, rule := range t.Rules() {
		if s := old[rule]; s != nil {
			idx[rule] = s
		} else {
			idx[rule] = r.newSeries(rule)
		}
	}
	r.index.Store(&idx)
}

func (r *Rules) newSeries(rule *config.Rule) *ruleSeries {
	if rule.DetailedMetric || rule.ValueToMetric {
		return &ruleSeries{values: map[string]*counters{}, other: r.counters(rule.Domain, rule.Path, OtherValue)}
	}
	return &ruleSeries{plain: r.counters(rule.Domain, rule.Path, "")}
}

// counters returns the counters of a label set, creating them on first
// use: a rule reloaded with the same domain and path keeps its counts.
func (r *Rules) counters(domain, rule, value string) *counters {
	k := [3]string{domain, rule, value}
	r.labelsMu.Lock()
	defer r.labelsMu.Unlock()
	c := r.byLabels[k]
	if c == nil {
		c = &counters{labels: k}
		r.byLabels[k] = c
	}
	return c
}

// series returns rule's counters, resolving them on a rule's first hit
// when its table was not passed to SetTable.
func (r *Rules) series(rule *config.Rule) *ruleSeries {
	if s := (*r.index.Load())[rule]; s != nil {
		return s
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.index.Load()
	if s := old[rule]; s != nil {
		return s
	}
	idx := make(map[*config.Rule]*ruleSeries, len(old)+1)
	for k, v := range old {
		idx[k] = v
	}
	s := r.newSeries(rule)
	idx[rule] = s
	r.index.Store(&idx)
	return s
}

// override returns the counters of override hits in domain.
func (r *Rules) override(domain string) *counters {
	if c := (*r.overrides.Load())[domain]; c != nil {
		return c
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.overrides.Load()
	if c := old[domain]; c != nil {
		return c
	}
	label := domain
	if len(old) >= r.maxValues {
		label = OtherValue
	}
	c := r.counters(label, OverrideRule, "")
	if label == OtherValue {
		return c
	}
	m := make(map[string]*counters, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[domain] = c
	r.overrides.Store(&m)
	return c
}

// Observe counts one descriptor's decision, adding its hits (st.Hits) as
// the reference adds hits_addend: a check (0 hits) counts nothing. Of an
// allowed descriptor's hits, those that brought the usage to or past the
// near-limit threshold count as near. A charge counts as hits too, and as
// charged (over the limit: charged past it); a refund counts as refunded
// only. For a rule that is neither detailed nor new it allocates nothing
// and takes no lock.
func (r *Rules) Observe(domain string, entries []config.Entry, rule *config.Rule, st *limiter.Status) {
	var c *counters
	if rule == nil {
		c = r.override(domain)
	} else if s := r.series(rule); s.plain != nil {
		c = s.plain
	} else {
		c = r.value(s, rule, entries)
	}
	n := st.Hits
	switch {
	case n == 0:
		return
	case st.Kind == limiter.Refund:
		c.refunded.Add(n)
		return
	case st.Kind == limiter.Charge:
		c.charged.Add(n)
		if !st.Decision.Allowed && !st.Unlimited {
			c.chargedOver.Add(n)
		}
	}
	d := &st.Decision
	switch {
	case st.Unlimited:
		c.within.Add(n)
	case !d.Allowed:
		c.over.Add(n)
		if st.Code == limiter.OK {
			c.shadow.Add(n)
		}
		if d.Local {
			c.local.Add(n)
		}
	default:
		c.within.Add(n)
		if near := r.near(d, n); near > 0 {
			c.near.Add(near)
		}
	}
}

// near returns how many of an allowed descriptor's n hits brought the
// usage (limit - remaining) to or past ratio × limit: the hits numbered
// used-n+1 … used that are at or above the threshold.
func (r *Rules) near(d *store.Decision, n uint64) uint64 {
	if d.Limit == 0 || d.Remaining >= d.Limit {
		return 0
	}
	used := d.Limit - d.Remaining
	threshold := uint64(math.Ceil(r.ratio * float64(d.Limit)))
	if used < threshold {
		return 0
	}
	return min(n, used-threshold+1)
}

// value returns the counters of a detailed rule for the descriptor's
// value: its entries as key_value pairs joined by dots, like the
// reference's detailed stats key.
func (r *Rules) value(s *ruleSeries, rule *config.Rule, entries []config.Entry) *counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.buf[:0]
	for i, e := range entries {
		if i > 0 {
			b = append(b, '.')
		}
		b = append(b, e.Key...)
		if e.Value != "" {
			b = append(b, '_')
			b = append(b, e.Value...)
		}
	}
	s.buf = b
	if c := s.values[string(b)]; c != nil {
		return c
	}
	if len(s.values) >= r.maxValues {
		return s.other
	}
	v := string(b)
	c := r.counters(rule.Domain, rule.Path, v)
	s.values[v] = c
	return c
}

// StoreFailed counts a request the store could not decide.
func (r *Rules) StoreFailed(_ string, mode limiter.FailureMode, err error) {
	r.storeFailures.WithLabelValues(errorKind(err), mode.String()).Inc()
	r.failed.Add(1)
}

// eachCounters calls fn with every label set's counters, in no order.
func (r *Rules) eachCounters(fn func(*counters)) {
	r.labelsMu.Lock()
	all := make([]*counters, 0, len(r.byLabels))
	for _, c := range r.byLabels {
		all = append(all, c)
	}
	r.labelsMu.Unlock()
	for _, c := range all {
		fn(c)
	}
}

// errorKind sorts store errors into a few label values.
func errorKind(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

// Counts are a label set's cumulative counts, in hits (see Rules).
type Counts struct {
	Within, Over, Near, Shadow uint64
	// Charged counts the units of charges (within and over above), and
	// ChargedOver those recorded past the limit; Refunded the units given
	// back (in no other count).
	Charged, ChargedOver, Refunded uint64
}

// RuleCounts are the counts of one label set: a rule (Value ""), one value
// of a detailed rule (or OtherValue), or a domain's override hits (Rule
// OverrideRule).
type RuleCounts struct {
	Domain, Rule, Value string
	Counts
}

// Snapshot appends the counts of every label set seen so far to dst, in no
// particular order, and returns it. The counts are the same ones
// /metrics exports; a label set is never forgotten, so they never
// decrease. Each count is read atomically, not the set as a whole.
func (r *Rules) Snapshot(dst []RuleCounts) []RuleCounts {
	r.labelsMu.Lock()
	defer r.labelsMu.Unlock()
	for _, c := range r.byLabels {
		dst = append(dst, RuleCounts{Domain: c.labels[0], Rule: c.labels[1], Value: c.labels[2],
			Counts: Counts{Within: c.within.Load(), Over: c.over.Load(), Near: c.near.Load(), Shadow: c.shadow.Load(),
				Charged: c.charged.Load(), ChargedOver: c.chargedOver.Load(), Refunded: c.refunded.Load()}})
	}
	return dst
}
