package config

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Entry is one key/value pair of a request descriptor.
type Entry struct{ Key, Value string }

// Options adjust Load. The zero value means the defaults.
type Options struct {
	// MergeDomains lets several files define the same domain; their
	// descriptors are merged (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
	// Without it a domain defined twice is an error.
	MergeDomains bool
	// MaxValueBytes is the longest key or value a counter key holds as is;
	// longer ones are hashed. 0 means DefaultMaxValueBytes.
	MaxValueBytes int
	// DefaultAlgorithm is the algorithm of a rule that names none: 0
	// means store.FixedWindow, the reference's. A token bucket's burst is
	// then its requests_per_unit; a calendar rule that names no algorithm
	// stays a fixed window (a token bucket has no periods).
	DefaultAlgorithm store.Algorithm
	// Overlay, if not nil, adds its fields to the rules it matches (see
	// Overlay).
	Overlay *Overlay
}

func (o Options) maxValueBytes() int {
	if o.MaxValueBytes <= 0 {
		return DefaultMaxValueBytes
	}
	return o.MaxValueBytes
}

// Rule is one compiled rate_limit. It is immutable.
type Rule struct {
	Domain string
	// Name is rate_limit.name, "" if none.
	Name string
	// Path is the rule's place in the config in envoyproxy/ratelimit's
	// stats-key convention: each level's key, or key_value when the
	// descriptor has a value, joined by dots ("remote_address",
	// "key1_value1.key2"). Domain + "." + Path is the reference's stats key.
	Path string
	Unit Unit
	// RequestsPerUnit is requests per window, or tokens per unit: up to
	// store.MaxLimit (2^53).
	RequestsPerUnit uint64
	// UnitMultiplier makes the window (or a token bucket's refill period)
	// that many units long: rate_limit.unit_multiplier, 1 by default.
	UnitMultiplier uint32
	// Algorithm is store.FixedWindow unless rate_limit.algorithm says
	// token_bucket or sliding_window (Sluice extensions).
	Algorithm store.Algorithm
	// Calendar aligns the rule's windows to the calendar of TimeZone
	// (rate_limit.calendar, a Sluice extension): days start at local
	// midnight, weeks on Monday (ISO), months on the 1st, years on
	// January 1st (store.Calendar). Period is then the nominal length.
	Calendar bool
	// TimeZone is the calendar's zone (rate_limit.time_zone, default
	// UTC); nil without Calendar.
	TimeZone *time.Location
	// Burst is a token bucket's capacity (rate_limit.burst, default
	// RequestsPerUnit); for a fixed window it equals RequestsPerUnit.
	Burst     uint64
	Unlimited bool
	// ShadowMode, DetailedMetric, ValueToMetric and QuotaMode are the
	// flags of the descriptor that carries the rate_limit.
	ShadowMode     bool
	DetailedMetric bool
	ValueToMetric  bool
	QuotaMode      bool
	// Replaces lists the names of rules this rule's match drops.
	Replaces []string
	// Metadata is the descriptor's metadata as JSON-like values
	// (map[string]any, []any, string, float64, bool, nil); nil when it has
	// none. The limits of one descriptor share it. Never modify it.
	Metadata map[string]any
	// Index is the limit's position in its descriptor's rate_limits list;
	// 0 for a rate_limit.
	Index int
	// Limit is the compiled store rule; nil when Unlimited.
	Limit *store.Rule
	// File and Line locate the descriptor that defines the rule; for a
	// resource pushed over xDS, File is `resource "NAME"` and Line 0.
	File string
	Line int
	// Overlay says what an overlay (Options.Overlay) changed, and where;
	// nil if none did. The limits of one descriptor share it.
	Overlay *Overlaid

	group      []*Rule // the descriptor's limits, this one included
	suffix     string  // the end of the counter key, see keySuffix
	desc       string  // the descriptor's path, for errors found after parsing
	replacesAt []int   // the line of each Replaces entry
}

// Limits lists the limits of the rule's descriptor in file order: the
// rule itself for a rate_limit, every limit of a rate_limits list (which
// Path tells apart as "path[i]"). A request matching the descriptor
// consumes from all of them at once. The slice is shared: do not modify
// it.
func (r *Rule) Limits() []*Rule {
	if r.group == nil {
		return []*Rule{r}
	}
	return r.group
}

// KeySuffix is the end of the rule's counter keys, after the descriptor's
// entries. The limits of one descriptor have different suffixes.
func (r *Rule) KeySuffix() string { return r.suffix }

// String describes the rule in one line for logs and `sluice check`.
func (r *Rule) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s.%s: ", r.Domain, r.Path)
	switch {
	case r.Unlimited:
		b.WriteString("unlimited")
	case r.Algorithm == store.TokenBucket:
		fmt.Fprintf(&b, "%d/%s token_bucket burst %d", r.RequestsPerUnit, r.Per(), r.Burst)
	default:
		fmt.Fprintf(&b, "%d/%s %s", r.RequestsPerUnit, r.Per(), r.Algorithm)
	}
	if r.Name != "" {
		fmt.Fprintf(&b, " name=%s", r.Name)
	}
	if len(r.Replaces) > 0 {
		fmt.Fprintf(&b, " replaces=%s", strings.Join(r.Replaces, ","))
	}
	for _, f := range []struct {
		on   bool
		name string
	}{{r.ShadowMode, "shadow_mode"}, {r.QuotaMode, "quota_mode"}, {r.DetailedMetric, "detailed_metric"}, {r.ValueToMetric, "value_to_metric"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	return b.String()
}

// Period is the rule's window or refill period: UnitMultiplier units (a
// calendar rule's nominal period: a month of 30 days).
func (r *Rule) Period() time.Duration {
	return r.Unit.Duration() * time.Duration(max(r.UnitMultiplier, 1))
}

// Per spells the rule's period: the unit, or "30*second" with a
// multiplier; a calendar rule's "calendar month (Europe/Berlin)" or "3
// calendar months (UTC)".
func (r *Rule) Per() string {
	switch {
	case r.Calendar && r.UnitMultiplier > 1:
		return fmt.Sprintf("%d calendar %ss (%s)", r.UnitMultiplier, r.Unit, r.TimeZone)
	case r.Calendar:
		return fmt.Sprintf("calendar %s (%s)", r.Unit, r.TimeZone)
	case r.UnitMultiplier > 1:
		return fmt.Sprintf("%d*%s", r.UnitMultiplier, r.Unit)
	}
	return r.Unit.String()
}

// node is one descriptor of the compiled tree.
type node struct {
	rule     *Rule  // nil when the descriptor has no rate_limit
	children *level // nil when it has no nested descriptors
	// pattern is the escaped wildcard value written into counter keys
	// instead of the request's value (share_threshold); "" otherwise.
	pattern string
	share   string // the wildcard value as written (share_threshold), for PlainKey
	part    string // the key's counter-key part: "|" + escaped key + "="
	glob    glob
	file    string
	line    int
}

// level is one list of descriptors, indexed by key.
type level struct {
	keys map[string]*keyNodes
}

// keyNodes are the descriptors of one key at one level.
type keyNodes struct {
	exact map[string]*node // by value, wildcard values included (literal match first)
	wild  []*node          // wildcard values in file order
	def   *node            // the key-only descriptor
}

type domain struct {
	part  string // the escaped domain
	root  *level
	file  string // where it was first defined
	line  int
	rules []*Rule
	// shares: a descriptor has share_threshold (else PlainKey need not
	// find the nodes)
	shares bool
}

// Table is a compiled config. It is immutable and safe for concurrent use.
type Table struct {
	domains map[string]*domain
	names   []string
	rules   []*Rule
	hash    string
	max     int
	files   int
	overlay OverlayReport
}

// HasDomain reports whether the config defines domain.
func (t *Table) HasDomain(name string) bool { return t.domains[name] != nil }

// Domains lists the configured domains in sorted order.
func (t *Table) Domains() []string { return slices.Clone(t.names) }

// Rules lists every rule, by domain and then in file order.
func (t *Table) Rules() []*Rule { return slices.Clone(t.rules) }

// Files is the number of limits files (or xDS resources) the table was
// loaded from.
func (t *Table) Files() int { return t.files }

// Hash is a SHA-256 (hex) of the loaded files' (or resources') names and
// contents.
func (t *Table) Hash() string { return t.hash }

// String lists the rules like envoyproxy/ratelimit's /rlconfig endpoint,
// one per line, with Sluice's algorithm and burst when not the default.
func (t *Table) String() string {
	var b strings.Builder
	for _, r := range t.rules {
		unit := strings.ToUpper(r.Unit.String())
		fmt.Fprintf(&b, "%s.%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t", r.Domain, r.Path, unit, r.RequestsPerUnit, r.ShadowMode, r.QuotaMode)
		if r.Unlimited {
			b.WriteString(", unlimited: true")
		}
		if r.UnitMultiplier > 1 {
			fmt.Fprintf(&b, ", unit_multiplier: %d", r.UnitMultiplier)
		}
		if r.Calendar {
			fmt.Fprintf(&b, ", calendar: true, time_zone: %s", r.TimeZone)
		}
		switch r.Algorithm {
		case store.TokenBucket:
			fmt.Fprintf(&b, ", algorithm: token_bucket, burst: %d", r.Burst)
		case store.SlidingWindow:
			b.WriteString(", algorithm: sliding_window")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

// Match finds the rule for one request descriptor and appends its counter
// key to dst. Each entry, in order, picks the descriptor with the same key
// and value, else the first wildcard value (file order) that matches, else
// the descriptor with the key only; there is no backtracking. The rule
// applies only if its descriptor is reached at the last entry.
//
// rule is the descriptor's first limit and key its counter key; with
// rate_limits the descriptor has several (rule.Limits()), whose keys are
// key with rule.KeySuffix() replaced by theirs.
//
// rule is nil when no rule applies (unknown domain, no entries, no match,
// or the level rule); key is then dst unchanged. Match allocates nothing
// beyond growing dst.
func (t *Table) Match(domainName string, entries []Entry, dst []byte) (rule *Rule, key []byte) {
	d := t.domains[domainName]
	if d == nil || len(entries) == 0 {
		return nil, dst
	}
	// Walk first, remembering the path for short descriptors, so that a
	// miss writes nothing.
	var path [8]*node
	lv := d.root
	for i, e := range entries {
		n := lv.pick(e)
		if n == nil {
			return nil, dst
		}
		if i < len(path) {
			path[i] = n
		}
		if i == len(entries)-1 {
			rule = n.rule
		} else if lv = n.children; lv == nil {
			return nil, dst
		}
	}
	if rule == nil {
		return nil, dst
	}
	key = append(dst, d.part...)
	lv = d.root
	for i, e := range entries {
		var n *node
		if i < len(path) {
			n = path[i]
		} else {
			n = lv.pick(e)
		}
		key = append(key, n.part...)
		if n.pattern != "" {
			key = append(key, n.pattern...)
		} else {
			key = appendPart(key, e.Value, t.max)
		}
		lv = n.children
	}
	return rule, append(key, rule.suffix...)
}

// pick chooses e's descriptor at this level: the same key and value, else
// the first matching wildcard value, else the key alone; nil if none.
func (lv *level) pick(e Entry) *node {
	kn := lv.keys[e.Key]
	if kn == nil {
		return nil
	}
	if n := kn.exact[e.Value]; n != nil {
		return n
	}
	for _, w := range kn.wild {
		if w.glob.match(e.Value) {
			return w
		}
	}
	return kn.def
}

// Empty returns a table without domains: every descriptor matches no
// rule, so every request is answered OK with no limit.
func Empty() *Table {
	t, _ := compile(nil, Options{}, nil)
	return t
}
