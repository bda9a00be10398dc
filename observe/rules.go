package observe

import (
	"cmp"
	"context"
	"errors"
	"maps"
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
	// Tables, if not nil, gives the table in force (config.Reloader is
	// one): a hit on a rule of a table swapped in but not yet passed to
	// SetTable adopts that table at once, so that a new rule's first
	// hits are not lost.
	Tables limiter.Tables
}

// Rules counts rate-limit decisions per rule: hits, within limit, over
// limit, near limit and shadow-mode overrides, labelled with the domain,
// the rule's key path (config.Rule.Path) and, for detailed rules only, the
// descriptor's value. It implements limiter.Observer and is safe for
// concurrent use.
//
// What it holds is bounded by the table in force (see SetTable): the
// label sets of its rules (a detailed rule's values capped per domain
// and path) and the override counts of its domains. Those of a rule that
// leaves the config are dropped; a rule that stays (same domain and
// path) keeps its counts and its detailed values across reloads.
type Rules struct {
	ratio     float64
	maxValues int
	tables    limiter.Tables

	storeFailures *prometheus.CounterVec
	failed        atomic.Uint64 // storeFailures' sum, for RefStats

	// live resolves the rules of the table in force to their counters.
	// It is replaced whole (copy on write) under mu, read with one
	// atomic load.
	live atomic.Pointer[liveSet]
	mu   sync.Mutex

	// byLabels holds the counters of every label set live holds, for
	// Collect; any two uses of one label set share its counters. A leaf
	// lock: nothing else is locked while holding it.
	labelsMu sync.Mutex
	byLabels map[[3]string]*counters
}

// liveSet is what the table in force holds. It is never modified once
// stored in Rules.live.
type liveSet struct {
	table *config.Table // the table last set; nil before the first
	rules map[*config.Rule]series
	// paths holds the series of each domain and rule path of table: a
	// rule that stays across reloads finds its counters (and a detailed
	// rule its values and their cap) here.
	paths map[[2]string]series
	// overrides maps a domain of table to the counters of its override
	// hits (the domains past the cap to the same "_other" counters).
	overrides map[string]*counters
	// overrideResets counts the limit overrides' counter resets of each
	// domain of table that had one.
	overrideResets map[string]*atomic.Uint64
}

// series are the counters of one domain and rule path: the label sets
// every live rule with that path counts into.
type series struct {
	plain *counters // nil unless a live rule with the path is plain
	det   *detailed // nil unless a live rule with the path is detailed
	// resets counts the counters reset (POST /v1/counters/reset) of the
	// rules with the path; exported once not zero.
	resets *atomic.Uint64
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

// detailed are a detailed rule's counters: one set per value, capped,
// and the rest.
type detailed struct {
	mu     sync.Mutex
	buf    []byte               // builds a value; guarded by mu
	values map[string]*counters // by value, capped; guarded by mu
	other  *counters            // past the cap
	// dropped is set when the rule's path leaves the config, so that a
	// late hit adds no value to byLabels; guarded by Rules.labelsMu.
	dropped bool
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
	resetsDesc = prometheus.NewDesc("sluice_counter_resets_total",
		"Counters set back to empty by POST /v1/counters/reset, by domain and rule path (\"override\" for a limit override).",
		[]string{"domain", "rule"}, nil)
)

// ResetOverride is the rule label of sluice_counter_resets_total for the
// counters of limit overrides.
const ResetOverride = "override"

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
		ratio: opts.NearLimitRatio, maxValues: opts.MaxValuesPerRule, tables: opts.Tables,
		storeFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "store", Name: "failures_total",
			Help: "Requests the store could not decide, by kind of error and by the failure mode that answered them."}, []string{"kind", "mode"}),
		byLabels: map[[3]string]*counters{},
	}
	for _, c := range []prometheus.Collector{rulesCollector{r}, labelSetsCollector{r}, r.storeFailures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	r.live.Store(&liveSet{rules: map[*config.Rule]series{}, paths: map[[2]string]series{}, overrides: map[string]*counters{},
		overrideResets: map[string]*atomic.Uint64{}})
	return r, nil
}

// rulesCollector exports the per-rule counters at scrape time.
type rulesCollector struct{ r *Rules }

func (c rulesCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{hitsDesc, withinDesc, overDesc, nearDesc, shadowDesc, localDesc, chargedDesc, chargedOverDesc, refundedDesc, resetsDesc} {
		ch <- d
	}
}

func (c rulesCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.eachCounters(func(s *counters) {
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
	})
	l := c.r.live.Load()
	for k, s := range l.paths {
		if n := s.resets.Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(resetsDesc, prometheus.CounterValue, float64(n), k[0], k[1])
		}
	}
	for domain, n := range l.overrideResets {
		ch <- prometheus.MustNewConstMetric(resetsDesc, prometheus.CounterValue, float64(n.Load()), domain, ResetOverride)
	}
}

// SetTable makes t the table whose rules are counted: their counters are
// exported at zero before the first hit, those of rules (domain and
// path) that t no longer holds are dropped, with their detailed values
// and counter resets, and so are the override counts (and resets) of
// domains t no longer defines. A rule that stays keeps its counts, and a
// detailed rule its values and the cap on them. Call it with the first table and from
// config.Reloader.OnReload. Until a first table is set, rules are
// resolved on their first hit.
func (r *Rules) SetTable(t *config.Table) {
	if t == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setTable(t)
}

// setTable is SetTable with r.mu held.
func (r *Rules) setTable(t *config.Table) {
	old := r.live.Load()
	if old.table == t {
		return
	}
	rules := t.Rules()
	l := &liveSet{table: t, rules: make(map[*config.Rule]series, len(rules)),
		paths: make(map[[2]string]series, len(old.paths)), overrides: make(map[string]*counters, len(old.overrides)),
		overrideResets: make(map[string]*atomic.Uint64, len(old.overrideResets))}
	r.labelsMu.Lock()
	defer r.labelsMu.Unlock()
	for _, rule := range rules {
		l.rules[rule] = r.resolve(l, old, rule)
	}
	kept := make(map[*counters]bool, len(old.overrides))
	for domain, c := range old.overrides {
		if t.HasDomain(domain) {
			l.overrides[domain] = c
			kept[c] = true
		}
	}
	for domain, n := range old.overrideResets {
		if t.HasDomain(domain) {
			l.overrideResets[domain] = n
		}
	}
	for k, s := range old.paths {
		if s.det != nil && l.paths[k].det != s.det {
			s.det.dropped = true
		}
	}
	for k, c := range r.byLabels {
		switch s := l.paths[[2]string{k[0], k[1]}]; {
		case s.plain == c, s.det != nil && k[2] != "", kept[c]:
			// a plain rule's; a value (or _other) of a detailed rule
			// that stays; a live domain's override hits
		default:
			delete(r.byLabels, k)
		}
	}
	r.live.Store(l)
}

// resolve returns the series of rule in l, made or carried over from old
// (the same domain and path), and stores them in l.paths. r.labelsMu is
// held.
func (r *Rules) resolve(l, old *liveSet, rule *config.Rule) series {
	k := [2]string{rule.Domain, rule.Path}
	s, prev := l.paths[k], old.paths[k]
	switch det := isDetailed(rule); {
	case !det && s.plain == nil && prev.plain != nil:
		s.plain = prev.plain
	case !det && s.plain == nil:
		s.plain = r.counters(rule.Domain, rule.Path, "")
	case det && s.det == nil && prev.det != nil:
		s.det = prev.det
	case det && s.det == nil:
		s.det = &detailed{values: map[string]*counters{}, other: r.counters(rule.Domain, rule.Path, OtherValue)}
	}
	if s.resets == nil {
		s.resets = cmp.Or(prev.resets, new(atomic.Uint64))
	}
	l.paths[k] = s
	return s
}

func isDetailed(rule *config.Rule) bool { return rule.DetailedMetric || rule.ValueToMetric }

// counters returns the counters of a label set, creating them on first
// use. r.labelsMu is held.
func (r *Rules) counters(domain, rule, value string) *counters {
	k := [3]string{domain, rule, value}
	c := r.byLabels[k]
	if c == nil {
		c = &counters{labels: k}
		r.byLabels[k] = c
	}
	return c
}

// lookup finds the series of a rule the live set does not hold: a rule
// of a table newer (in force, not set yet) or older than the one set,
// or any rule before a first table is set. A rule of an earlier table
// counts with the live rule of the same domain and path; if none is
// left, lookup returns no counters and its hits are not counted.
func (r *Rules) lookup(rule *config.Rule) series {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.adopt()
	if s, ok := l.rules[rule]; ok {
		return s
	}
	if l.table != nil {
		return l.paths[[2]string{rule.Domain, rule.Path}]
	}
	n := &liveSet{rules: maps.Clone(l.rules), paths: maps.Clone(l.paths), overrides: l.overrides, overrideResets: l.overrideResets}
	r.labelsMu.Lock()
	s := r.resolve(n, l, rule)
	r.labelsMu.Unlock()
	n.rules[rule] = s
	r.live.Store(n)
	return s
}

// adopt sets the table in force (Options.Tables) if it is not the one
// set, and returns the live set. r.mu is held.
func (r *Rules) adopt() *liveSet {
	if r.tables != nil {
		if t := r.tables.Current(); t != nil {
			r.setTable(t)
		}
	}
	return r.live.Load()
}

// override returns the counters of override hits in domain, nil for a
// domain the table in force does not define (a request that matched an
// earlier table).
func (r *Rules) override(domain string) *counters {
	if c := r.live.Load().overrides[domain]; c != nil {
		return c
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.adopt()
	if c := l.overrides[domain]; c != nil {
		return c
	}
	if l.table != nil && !l.table.HasDomain(domain) {
		return nil
	}
	label, own := domain, 0
	for d, c := range l.overrides {
		if c.labels[0] == d {
			own++
		}
	}
	if own >= r.maxValues {
		label = OtherValue
	}
	r.labelsMu.Lock()
	c := r.counters(label, OverrideRule, "")
	r.labelsMu.Unlock()
	n := &liveSet{table: l.table, rules: l.rules, paths: l.paths, overrides: maps.Clone(l.overrides), overrideResets: l.overrideResets}
	n.overrides[domain] = c
	r.live.Store(n)
	return c
}

// Observe counts one descriptor's decision, adding its hits (st.Hits) as
// the reference adds hits_addend: a check (0 hits) counts nothing. Of an
// allowed descriptor's hits, those that brought the usage to or past the
// near-limit threshold count as near. A charge counts as hits too, and as
// charged (over the limit: charged past it); a refund counts as refunded
// only. A rule of an earlier table counts with the live rule of the same
// domain and path, or not at all if it left the config. For a live rule
// that is not detailed it allocates nothing and takes no lock.
func (r *Rules) Observe(domain string, entries []config.Entry, rule *config.Rule, st *limiter.Status) {
	var c *counters
	if rule == nil {
		c = r.override(domain)
	} else {
		s, ok := r.live.Load().rules[rule]
		if !ok {
			s = r.lookup(rule)
		}
		if isDetailed(rule) {
			c = r.value(s.det, rule, entries)
		} else {
			c = s.plain
		}
	}
	n := st.Hits
	switch {
	case c == nil || n == 0:
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
// reference's detailed stats key. It returns nil when d is nil or was
// dropped (the rule left the config).
func (r *Rules) value(d *detailed, rule *config.Rule, entries []config.Entry) *counters {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.buf[:0]
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
	d.buf = b
	if c := d.values[string(b)]; c != nil {
		return c
	}
	if len(d.values) >= r.maxValues {
		return d.other
	}
	v := string(b)
	r.labelsMu.Lock()
	defer r.labelsMu.Unlock()
	if d.dropped {
		return nil
	}
	c := r.counters(rule.Domain, rule.Path, v)
	d.values[v] = c
	return c
}

// Reset counts one limit's counter set back to empty by POST
// /v1/counters/reset, in sluice_counter_resets_total: a limit of rule in
// domain, or of a limit override when rule is nil. Like the other
// per-rule counts, those of a rule (domain and path) or a domain that
// leaves the config are dropped at the reload; a rule of an earlier table
// counts with the live rule of the same domain and path, or not at all.
func (r *Rules) Reset(domain string, rule *config.Rule) {
	var n *atomic.Uint64
	if rule == nil {
		n = r.overrideResets(domain)
	} else {
		s, ok := r.live.Load().rules[rule]
		if !ok {
			s = r.lookup(rule)
		}
		n = s.resets
	}
	if n != nil {
		n.Add(1)
	}
}

// overrideResets returns the reset count of domain's limit overrides,
// nil for a domain the table in force does not define.
func (r *Rules) overrideResets(domain string) *atomic.Uint64 {
	if n := r.live.Load().overrideResets[domain]; n != nil {
		return n
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.adopt()
	if n := l.overrideResets[domain]; n != nil {
		return n
	}
	if l.table != nil && !l.table.HasDomain(domain) {
		return nil
	}
	n := new(atomic.Uint64)
	next := &liveSet{table: l.table, rules: l.rules, paths: l.paths, overrides: l.overrides, overrideResets: maps.Clone(l.overrideResets)}
	next.overrideResets[domain] = n
	r.live.Store(next)
	return n
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

// Snapshot appends the counts of every label set of the table in force
// to dst, in no particular order, and returns it. The counts are the
// same ones /metrics exports: those of a rule that stays never decrease;
// a rule that leaves the config is no longer listed. Each count is read
// atomically, not the set as a whole.
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
