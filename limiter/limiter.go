package limiter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"unsafe"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// Defaults for Options.
const (
	DefaultMaxDescriptors = 64
	DefaultMaxEntries     = 16
	// DefaultMaxDomainBytes leaves ample room for the longest domain
	// Envoy Gateway writes, a listener's namespace/gateway/listener
	// (at most 63 + 253 + 253 bytes and two slashes: 571).
	DefaultMaxDomainBytes = 1024
)

// maxOverrideRules bounds the cache of compiled override rules; past it an
// override's rule is compiled per request.
const maxOverrideRules = 4096

// ErrNoConfig is returned while no limits table has been loaded.
var ErrNoConfig = errors.New("limiter: no configuration loaded")

// InvalidError reports a malformed request. Adapters answer it with
// INVALID_ARGUMENT or HTTP 400 and its Reason.
type InvalidError struct{ Reason string }

func (e *InvalidError) Error() string { return "limiter: invalid request: " + e.Reason }

// StoreError reports that the store could not decide. Adapters answer it
// with UNAVAILABLE.
type StoreError struct{ Err error }

func (e *StoreError) Error() string { return "limiter: store: " + e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

// FailureMode says what a request gets when the store fails.
type FailureMode uint8

const (
	// FailError returns a *StoreError (the default): Envoy's
	// failure_mode_deny then decides.
	FailError FailureMode = iota
	// FailAllow answers OK for every descriptor.
	FailAllow
	// FailDeny answers OVER_LIMIT for every limited descriptor.
	FailDeny
)

// ParseFailureMode parses "error", "allow" or "deny".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "error":
		return FailError, nil
	case "allow":
		return FailAllow, nil
	case "deny":
		return FailDeny, nil
	}
	return 0, fmt.Errorf("limiter: unknown failure mode %q (want error, allow or deny)", s)
}

// String returns the spelling ParseFailureMode accepts.
func (m FailureMode) String() string {
	switch m {
	case FailAllow:
		return "allow"
	case FailDeny:
		return "deny"
	}
	return "error"
}

// Observer is told about decisions, for metrics. Implementations are safe
// for concurrent use and must not retain entries (their strings included:
// they may alias a reused buffer) or st after returning; domain they may
// keep.
type Observer interface {
	// Observe is called once per descriptor that had a rule (unlimited
	// included) or an override, after the store decided. rule is nil for
	// an override.
	Observe(domain string, entries []config.Entry, rule *config.Rule, st *Status)
	// StoreFailed is called once per request the store failed to decide,
	// with the mode that answered it.
	StoreFailed(domain string, mode FailureMode, err error)
}

// Tables provides the current limits table; nil until one is loaded.
// *config.Reloader implements it.
type Tables interface {
	Current() *config.Table
}

// Options configure a Limiter. The zero value means defaults.
type Options struct {
	// MaxDescriptors and MaxEntries bound a request: more descriptors, or
	// more entries in one descriptor, is invalid. Zero means the default.
	MaxDescriptors int
	MaxEntries     int
	// MaxDomainBytes bounds a request's domain (which the reference does
	// not bound): a longer one is invalid. Zero means the default.
	MaxDomainBytes int
	// ShadowMode answers every request OK overall while statuses keep
	// their codes (the reference's SHADOW_MODE).
	ShadowMode bool
	// QuotaMode makes every descriptor a quota descriptor (the
	// reference's QUOTA_MODE): a request is over only if all of its
	// quota descriptors are over. Without it only the descriptors whose
	// rule has quota_mode are.
	QuotaMode bool
	// SaturateDenied makes denied hits (Kind Hits) consume what is left
	// up to the limit (--denied-hits=saturate) instead of nothing.
	// Charges are recorded whole and refunds applied either way.
	SaturateDenied bool
	// StrictPeeks makes a descriptor's cost of 0 (a peek) over the limit
	// unless one more unit fits (store.PeekStrict, --strict-peeks).
	// Without it a peek is over only past the limit, as the reference
	// answers (store.PeekWithin).
	StrictPeeks bool
	// FailureMode decides what a store failure answers.
	FailureMode FailureMode
	// Clock tells the time; nil means the system clock.
	Clock store.Clock
	// Observer, if not nil, is told about every decision.
	Observer Observer
	// ReferenceKeys counts what envoyproxy/ratelimit's keys can express
	// (config.Rule.Plainable, and limit overrides of one unit) in the
	// reference's counters (store.Hit.Plain), so that its pods and this
	// limiter count every hit once (--key-format=reference). Other rules
	// keep Sluice's keys.
	ReferenceKeys bool
}

// Limiter applies a limits table to requests through a store. It is the
// request policy every protocol shares. Safe for concurrent use.
type Limiter struct {
	tables    Tables
	store     store.Store
	opts      Options
	peek      store.Peek // every hit's: from opts.StrictPeeks
	clock     store.Clock
	overrides *xsync.Map[Override, *store.Rule]
	scratch   sync.Pool
}

// New returns a Limiter over the tables and the store.
func New(tables Tables, st store.Store, opts Options) *Limiter {
	if opts.MaxDescriptors <= 0 {
		opts.MaxDescriptors = DefaultMaxDescriptors
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultMaxEntries
	}
	if opts.MaxDomainBytes <= 0 {
		opts.MaxDomainBytes = DefaultMaxDomainBytes
	}
	l := &Limiter{tables: tables, store: st, opts: opts, clock: opts.Clock,
		overrides: xsync.NewMap[Override, *store.Rule]()}
	if opts.StrictPeeks {
		l.peek = store.PeekStrict
	}
	if l.clock == nil {
		l.clock = store.NewWallClock()
	}
	l.scratch.New = func() any { return new(scratch) }
	return l
}

// scratch holds one request's working buffers. Pooled.
type scratch struct {
	keys []byte      // every counter key, back to back
	plan []planned   // per descriptor
	lims []planLimit // per limit of the matched rules and overrides, by descriptor
	hits []store.Hit // per limit counted
	out  []store.Decision
	// quota rounds (see take): the hits of a round and their indexes
	round    []store.Hit
	roundOut []store.Decision
	roundAt  []int
	obs      Status // one limit's status for the observer
	// replacing: a matched limit has replaces (else replace has nothing
	// to do)
	replacing bool
}

// planned is what a descriptor resolved to before the store is asked.
type planned struct {
	rule     *config.Rule // matched rule's first limit (nil: none, or every limit replaced)
	override bool
	first, n int    // the descriptor's limits: s.lims[first:first+n]
	cost     uint64 // the descriptor's hits_addend
	kind     Kind   // how cost counts
	over     bool   // a vetoing hit of the descriptor was denied
	dropped  bool   // an unlimited rule replaced by another descriptor's
	// unlimited: the matched rule is unlimited (even once replaced): the
	// descriptor never counts toward the quota verdict.
	unlimited bool
}

// planLimit is one limit of a descriptor: a rule's or an override's.
type planLimit struct {
	rule     *config.Rule // nil for an override
	limit    *store.Rule  // what is counted
	keyStart int
	keyEnd   int
	dropped  bool // replaced by another descriptor's rule
	hit      int  // index into hits, -1 when none
	plain    bool // the key is the reference's (store.Hit.Plain)
}

// Bounds returns the most descriptors in one request and the most
// entries in one descriptor (Options.MaxDescriptors and MaxEntries), for
// adapters that stop decoding at them.
func (l *Limiter) Bounds() (descriptors, entries int) {
	return l.opts.MaxDescriptors, l.opts.MaxEntries
}

// TooManyDescriptors is the error for a request found, while it was
// decoded, to have more than max descriptors.
func TooManyDescriptors(max int) *InvalidError {
	return &InvalidError{Reason: fmt.Sprintf("more than %d descriptors exceed the limit of %d", max, max)}
}

// TooManyEntries is the error for a request whose descriptor i was
// found, while it was decoded, to have more than max entries.
func TooManyEntries(i, max int) *InvalidError {
	return &InvalidError{Reason: fmt.Sprintf("descriptor %d: more than %d entries exceed the limit of %d", i, max, max)}
}

// Validate checks a request's shape: a domain of at most MaxDomainBytes,
// at least one descriptor,
// at most MaxDescriptors descriptors of at most MaxEntries entries, no
// empty entry key and no override with an unknown unit.
func (l *Limiter) Validate(req *Request) error {
	switch {
	case req.Domain == "":
		return &InvalidError{Reason: "domain must not be empty"}
	case len(req.Domain) > l.opts.MaxDomainBytes:
		return &InvalidError{Reason: fmt.Sprintf("a domain of %d bytes exceeds the limit of %d", len(req.Domain), l.opts.MaxDomainBytes)}
	case len(req.Descriptors) == 0:
		return &InvalidError{Reason: "at least one descriptor is required"}
	case len(req.Descriptors) > l.opts.MaxDescriptors:
		return &InvalidError{Reason: fmt.Sprintf("%d descriptors exceed the limit of %d", len(req.Descriptors), l.opts.MaxDescriptors)}
	}
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		if len(d.Entries) > l.opts.MaxEntries {
			return &InvalidError{Reason: fmt.Sprintf("descriptor %d: %d entries exceed the limit of %d", i, len(d.Entries), l.opts.MaxEntries)}
		}
		for j := range d.Entries {
			if d.Entries[j].Key == "" {
				return &InvalidError{Reason: fmt.Sprintf("descriptor %d: entry %d has an empty key", i, j)}
			}
		}
		if o := d.Override; o != (Override{}) && o.window() == 0 {
			if o.Unit.Duration() <= 0 {
				return &InvalidError{Reason: fmt.Sprintf("descriptor %d: limit override has unknown unit %d", i, int32(o.Unit))}
			}
			return &InvalidError{Reason: fmt.Sprintf("descriptor %d: limit override of %d %ss is too long", i, o.UnitMultiplier, o.Unit)}
		}
	}
	return nil
}

// Check decides req and writes the outcome into resp (resized to one
// status per descriptor). All descriptors are applied to the store as one
// all-or-nothing batch at one instant. It returns an *InvalidError for a
// malformed request, ErrNoConfig before a table is loaded, a *StoreError
// when the store failed (with FailureMode FailError), or ctx's error when
// ctx is already done.
func (l *Limiter) Check(ctx context.Context, req *Request, resp *Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := l.Validate(req); err != nil {
		return err
	}
	table := l.tables.Current()
	if table == nil {
		return ErrNoConfig
	}
	n := len(req.Descriptors)
	if cap(resp.Statuses) < n {
		resp.Statuses = make([]Status, n)
	}
	resp.Statuses = resp.Statuses[:n]
	resp.Limits = resp.Limits[:0]
	resp.Overall = OK
	for i := range resp.Statuses {
		resp.Statuses[i] = Status{Code: OK}
	}
	if !table.HasDomain(req.Domain) {
		// Unknown domain: no rule and no override applies.
		return nil
	}

	s := l.scratch.Get().(*scratch)
	defer l.scratch.Put(s)
	s.reset(n)
	if err := l.plan(table, req, s); err != nil {
		return err
	}
	l.replace(s)
	l.build(s)
	if len(s.hits) > 0 {
		if err := l.take(ctx, l.clock.Now(), s); err != nil {
			return l.storeFailed(req, resp, s, err)
		}
	}
	l.report(req, resp, s)
	return nil
}

func (s *scratch) reset(n int) {
	s.keys = s.keys[:0]
	if cap(s.plan) < n {
		s.plan = make([]planned, n)
	}
	s.plan = s.plan[:n]
	s.lims = s.lims[:0]
	s.hits = s.hits[:0]
	s.replacing = false
}

// plan matches every descriptor and writes the counter key of each of
// its limits.
func (l *Limiter) plan(table *config.Table, req *Request, s *scratch) error {
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		p := &s.plan[i]
		*p = planned{first: len(s.lims), cost: cost(req, d), kind: d.Kind}
		if d.Override != (Override{}) {
			r, err := l.overrideRule(d.Override)
			if err != nil {
				return &InvalidError{Reason: fmt.Sprintf("descriptor %d: limit override: %v", i, err)}
			}
			p.override = true
			start := len(s.keys)
			plain := l.opts.ReferenceKeys && d.Override.UnitMultiplier <= 1 && r.Plainable() && table.PlainFits(d.Entries)
			switch {
			case plain:
				s.keys = config.PlainOverrideKey(s.keys, req.Domain, d.Entries)
			default:
				s.keys = table.OverrideKey(s.keys, req.Domain, d.Entries, d.Override.Unit, r.Wide())
				if m := d.Override.UnitMultiplier; m > 1 {
					s.keys = strconv.AppendUint(append(s.keys, 'x'), uint64(m), 10)
				}
			}
			s.addPlanLimit(nil, r, start)
			s.lims[len(s.lims)-1].plain = plain
			p.n = 1
			continue
		}
		if len(d.Entries) == 0 {
			continue
		}
		start := len(s.keys)
		rule, key := table.Match(req.Domain, d.Entries, s.keys)
		if rule == nil {
			continue
		}
		s.keys = key
		p.rule = rule
		s.replacing = s.replacing || len(rule.Replaces) > 0
		if rule.Unlimited {
			p.unlimited = true
			continue
		}
		if l.opts.ReferenceKeys && rule.Plainable() && table.PlainFits(d.Entries) {
			s.keys = table.PlainKey(s.keys[:start], req.Domain, d.Entries)
			s.addPlanLimit(rule, rule.Limit, start)
			s.lims[len(s.lims)-1].plain = true
			p.n = 1
			continue
		}
		s.addPlanLimit(rule, rule.Limit, start)
		if limits := rule.Limits(); len(limits) > 1 {
			// The other limits' keys: the same entries, their own suffix.
			prefix := len(s.keys) - start - len(rule.KeySuffix())
			for _, r := range limits[1:] {
				s.replacing = s.replacing || len(r.Replaces) > 0
				at := len(s.keys)
				s.keys = append(s.keys, s.keys[start:start+prefix]...)
				s.keys = append(s.keys, r.KeySuffix()...)
				s.addPlanLimit(r, r.Limit, at)
			}
		}
		p.n = len(s.lims) - p.first
	}
	return nil
}

// addPlanLimit appends a limit whose key is s.keys[start:], field by field
// (a composite literal costs a typed copy of the whole element).
func (s *scratch) addPlanLimit(rule *config.Rule, limit *store.Rule, start int) {
	n := len(s.lims)
	if n < cap(s.lims) {
		s.lims = s.lims[:n+1]
	} else {
		s.lims = append(s.lims, planLimit{})
	}
	lp := &s.lims[n]
	lp.rule, lp.limit, lp.keyStart, lp.keyEnd, lp.dropped, lp.hit, lp.plain = rule, limit, start, len(s.keys), false, -1, false
}

// replace drops the limits named in the replaces list of a limit matched
// by another descriptor (unlimited rules included), as the reference
// does: the names are gathered from every match first. A descriptor whose
// every limit is dropped reports "no rule" and counts nothing.
func (l *Limiter) replace(s *scratch) {
	if !s.replacing {
		return
	}
	for i := range s.plan {
		r := s.plan[i].rule
		if r == nil {
			continue
		}
		for _, lim := range r.Limits() {
			for _, name := range lim.Replaces {
				l.dropNamed(s, i, name)
			}
		}
	}
	for i := range s.plan {
		p := &s.plan[i]
		if p.rule == nil {
			continue
		}
		if p.rule.Unlimited {
			if p.dropped {
				p.rule = nil
			}
			continue
		}
		kept := false
		for j := p.first; j < p.first+p.n; j++ {
			kept = kept || !s.lims[j].dropped
		}
		if !kept {
			p.rule = nil
		}
	}
}

// dropNamed marks the limits named name of the descriptors other than i.
func (l *Limiter) dropNamed(s *scratch, i int, name string) {
	for j := range s.plan {
		q := &s.plan[j]
		if j == i || q.rule == nil || q.override {
			continue
		}
		if q.rule.Unlimited {
			q.dropped = q.dropped || q.rule.Name == name
			continue
		}
		for k := q.first; k < q.first+q.n; k++ {
			if s.lims[k].rule.Name == name {
				s.lims[k].dropped = true
			}
		}
	}
}

// build turns the kept limits into store hits.
func (l *Limiter) build(s *scratch) {
	for i := range s.plan {
		p := &s.plan[i]
		if p.rule == nil && !p.override {
			continue
		}
		for j := p.first; j < p.first+p.n; j++ {
			lp := &s.lims[j]
			if lp.dropped {
				continue
			}
			lp.hit = len(s.hits)
			s.hits = append(s.hits, store.Hit{
				Key:   keyString(s.keys[lp.keyStart:lp.keyEnd]),
				Rule:  lp.limit,
				Cost:  p.cost,
				Veto:  lp.rule == nil || !lp.rule.ShadowMode,
				Mode:  l.mode(p.kind),
				Plain: lp.plain,
				Peek:  l.peek,
			})
		}
	}
	if cap(s.out) < len(s.hits) {
		s.out = make([]store.Decision, len(s.hits))
	}
	s.out = s.out[:len(s.hits)]
}

// mode is the store mode of a descriptor's hits of kind k.
func (l *Limiter) mode(k Kind) store.Mode {
	switch {
	case k == Charge:
		return store.ModeCharge
	case k == Refund:
		return store.ModeRefund
	case l.opts.SaturateDenied:
		return store.ModeSaturate
	}
	return store.ModeTake
}

// cost is d's hits_addend: its own when set (zero checks without
// consuming), else the request's, where zero means 1.
func cost(req *Request, d *Descriptor) uint64 {
	switch {
	case d.HasCost:
		return d.Cost
	case req.HitsAddend == 0:
		return 1
	}
	return req.HitsAddend
}

// keyString views b as a string without copying. s.keys is not appended
// to after the hits are built, and stores copy keys they keep.
func keyString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(&b[0], len(b))
}

// take asks the store for the hits. With quota descriptors (quota_mode,
// --quota-mode) a request is over only if a non-quota descriptor is over
// or all quota descriptors are; when only some quota descriptors are over,
// the batch was denied and nothing consumed, so it is taken again without
// them: the request consumes from every other descriptor at once, and
// the over quota descriptors consume nothing. Each round drops at least
// one descriptor, so there are at most as many rounds as quota
// descriptors. Charges and refunds applied in the first round and keep
// its decisions. With SaturateDenied every hit is charged anyway: one
// round.
func (l *Limiter) take(ctx context.Context, now int64, s *scratch) error {
	if err := l.store.Take(ctx, now, s.hits, s.out); err != nil {
		return s.named(err, nil)
	}
	denied := false
	for i := range s.out {
		if !s.out[i].Allowed && s.hits[i].Veto {
			denied = true
			break
		}
	}
	if !denied {
		return nil // no descriptor is over (plan left over false)
	}
	s.markOver()
	for denied && !l.opts.SaturateDenied && l.quotaRetry(s) {
		s.round, s.roundAt = s.round[:0], s.roundAt[:0]
		for i := range s.plan {
			p := &s.plan[i]
			if p.over {
				continue
			}
			for j := p.first; j < p.first+p.n; j++ {
				if h := s.lims[j].hit; h >= 0 && !s.hits[h].Always() {
					s.round = append(s.round, s.hits[h])
					s.roundAt = append(s.roundAt, h)
				}
			}
		}
		if len(s.round) == 0 {
			return nil
		}
		if cap(s.roundOut) < len(s.round) {
			s.roundOut = make([]store.Decision, len(s.round))
		}
		s.roundOut = s.roundOut[:len(s.round)]
		if err := l.store.Take(ctx, now, s.round, s.roundOut); err != nil {
			return s.named(err, s.roundAt)
		}
		denied = false
		for k, h := range s.roundAt {
			s.out[h] = s.roundOut[k]
			denied = denied || s.round[k].Veto && !s.roundOut[k].Allowed
		}
		s.markOver()
	}
	return nil
}

// named names the rule of a store's failure on one hit (a
// *store.HitError of s.hits, or of a round whose hits at maps to s.hits)
// by its domain and path: the hit's key carries descriptor values, which
// no error shows (docs/TRACING.md: values only for detailed_metric
// rules).
func (s *scratch) named(err error, at []int) error {
	var he *store.HitError
	if !errors.As(err, &he) {
		return err
	}
	h := he.Index
	if at != nil {
		if h >= len(at) {
			return err
		}
		h = at[h]
	}
	for j := range s.lims {
		if s.lims[j].hit != h {
			continue
		}
		if r := s.lims[j].rule; r != nil {
			return fmt.Errorf("rule %s.%s: %w", r.Domain, r.Path, err)
		}
		return fmt.Errorf("a limit override: %w", err)
	}
	return err
}

// markOver sets each descriptor's over from the decisions.
func (s *scratch) markOver() {
	for i := range s.plan {
		p := &s.plan[i]
		p.over = false
		for j := p.first; j < p.first+p.n; j++ {
			if h := s.lims[j].hit; h >= 0 && s.hits[h].Veto && !s.out[h].Allowed {
				p.over = true
			}
		}
	}
}

// isQuota reports whether descriptor p counts as a quota descriptor, as
// in the reference: every descriptor but an unlimited one under
// --quota-mode, else one whose matched rule has quota_mode.
func (l *Limiter) isQuota(p *planned) bool {
	return !p.unlimited && (l.opts.QuotaMode || p.rule != nil && p.rule.QuotaMode)
}

// overLimit is the reference's verdict: a non-quota descriptor is over,
// or there are quota descriptors and all of them are over.
func (l *Limiter) overLimit(s *scratch) bool {
	quota, quotaOver := 0, 0
	for i := range s.plan {
		p := &s.plan[i]
		switch {
		case l.isQuota(p):
			quota++
			if p.over {
				quotaOver++
			}
		case p.over:
			return true
		}
	}
	return quota > 0 && quota == quotaOver
}

// quotaRetry reports whether a denied batch was denied only by some of
// the quota descriptors, so that the rest of the request still goes.
func (l *Limiter) quotaRetry(s *scratch) bool {
	for i := range s.plan {
		if p := &s.plan[i]; p.over && !l.isQuota(p) {
			return false
		}
	}
	return !l.overLimit(s)
}

// deciding returns the index in s.lims of the limit that decided p's
// status: among the enforced (non-shadow) limits if p has any, a denied
// one (the longest retry first), else the one with the least remaining
// (the longest reset first); -1 if every limit was dropped.
func (s *scratch) deciding(p *planned) int {
	if p.n == 1 {
		return p.first
	}
	best := -1
	var bVeto bool
	var b *store.Decision
	for j := p.first; j < p.first+p.n; j++ {
		lp := &s.lims[j]
		if lp.hit < 0 {
			continue
		}
		veto, d := s.hits[lp.hit].Veto, &s.out[lp.hit]
		switch {
		case best < 0:
		case veto != bVeto:
			if !veto {
				continue
			}
		case d.Allowed != b.Allowed:
			if d.Allowed {
				continue
			}
		case !d.Allowed:
			if d.RetryAfter <= b.RetryAfter {
				continue
			}
		case d.Remaining > b.Remaining || d.Remaining == b.Remaining && d.ResetAfter <= b.ResetAfter:
			continue
		}
		best, bVeto, b = j, veto, d
	}
	return best
}

// report writes the statuses, the limits and the overall code.
func (l *Limiter) report(req *Request, resp *Response, s *scratch) {
	anyOver := false
	for i := range s.plan {
		p := &s.plan[i]
		st := &resp.Statuses[i]
		st.Kind = p.kind
		switch {
		case p.override:
			d := req.Descriptors[i].Override
			st.Limited = true
			st.RequestsPerUnit, st.Unit, st.UnitMultiplier = uint64(d.RequestsPerUnit), d.Unit, d.UnitMultiplier
			st.Decision, st.Hits = s.out[s.lims[p.first].hit], p.cost
		case p.rule == nil:
			continue
		case p.rule.Unlimited:
			st.Rule, st.Unlimited, st.Hits = p.rule, true, p.cost
			l.observe(req, i, p.rule, st)
			continue
		default:
			lp := &s.lims[s.deciding(p)]
			st.Rule, st.Limited = lp.rule, true
			st.Name, st.RequestsPerUnit, st.Unit, st.UnitMultiplier = lp.rule.Name, lp.rule.RequestsPerUnit, lp.rule.Unit, lp.rule.UnitMultiplier
			st.Decision, st.Hits = s.out[lp.hit], p.cost
		}
		if p.over {
			st.Code = OverLimit
			anyOver = true
		}
		if p.n == 1 {
			l.observe(req, i, st.Rule, st)
			continue
		}
		for j := p.first; j < p.first+p.n; j++ {
			lp := &s.lims[j]
			if lp.hit < 0 {
				continue
			}
			resp.addLimit(i, lp.rule, &s.out[lp.hit])
			s.obs = *st
			s.obs.Rule, s.obs.Decision = lp.rule, s.out[lp.hit]
			s.obs.Name, s.obs.RequestsPerUnit, s.obs.Unit = lp.rule.Name, lp.rule.RequestsPerUnit, lp.rule.Unit
			s.obs.Code = OK
			if !s.obs.Decision.Allowed && s.hits[lp.hit].Veto {
				s.obs.Code = OverLimit
			}
			l.observe(req, i, lp.rule, &s.obs)
		}
	}
	if anyOver && l.overLimit(s) && !l.opts.ShadowMode {
		resp.Overall = OverLimit
	}
}

// addLimit appends one limit's outcome to r.Limits, field by field (a
// composite literal costs a typed copy of the whole element).
func (r *Response) addLimit(desc int, rule *config.Rule, d *store.Decision) {
	n := len(r.Limits)
	if n < cap(r.Limits) {
		r.Limits = r.Limits[:n+1]
	} else {
		r.Limits = append(r.Limits, Limit{})
	}
	lm := &r.Limits[n]
	lm.Descriptor, lm.Rule, lm.Decision = desc, rule, *d
}

func (l *Limiter) observe(req *Request, i int, rule *config.Rule, st *Status) {
	if l.opts.Observer != nil {
		l.opts.Observer.Observe(req.Domain, req.Descriptors[i].Entries, rule, st)
	}
}

// storeFailed answers a request whose store call failed, by FailureMode.
func (l *Limiter) storeFailed(req *Request, resp *Response, s *scratch, err error) error {
	if l.opts.Observer != nil {
		l.opts.Observer.StoreFailed(req.Domain, l.opts.FailureMode, err)
	}
	if l.opts.FailureMode == FailError {
		return &StoreError{Err: err}
	}
	for i := range s.plan {
		p := &s.plan[i]
		st := &resp.Statuses[i]
		st.Kind = p.kind
		if p.rule != nil && p.rule.Unlimited {
			st.Rule, st.Unlimited, st.Hits = p.rule, true, p.cost
			continue
		}
		if p.rule == nil && !p.override {
			continue
		}
		first := -1
		p.over = false
		for j := p.first; j < p.first+p.n; j++ {
			lp := &s.lims[j]
			if lp.hit < 0 {
				continue
			}
			if first < 0 {
				first = j
			}
			if p.n > 1 {
				d := store.Decision{Allowed: l.opts.FailureMode == FailAllow, Limit: lp.limit.Capacity()}
				resp.addLimit(i, lp.rule, &d)
			}
			p.over = p.over || l.opts.FailureMode == FailDeny && s.hits[lp.hit].Veto
		}
		lp := &s.lims[first]
		st.Limited, st.Hits = true, p.cost
		if p.override {
			o := req.Descriptors[i].Override
			st.RequestsPerUnit, st.Unit, st.UnitMultiplier = uint64(o.RequestsPerUnit), o.Unit, o.UnitMultiplier
		} else {
			st.Rule = lp.rule
			st.Name, st.RequestsPerUnit, st.Unit, st.UnitMultiplier = lp.rule.Name, lp.rule.RequestsPerUnit, lp.rule.Unit, lp.rule.UnitMultiplier
		}
		st.Decision = store.Decision{Allowed: l.opts.FailureMode == FailAllow, Limit: lp.limit.Capacity()}
		if p.over {
			st.Code = OverLimit
		}
	}
	if l.overLimit(s) && !l.opts.ShadowMode {
		resp.Overall = OverLimit
	}
	return nil
}

// overrideRule returns the fixed-window rule of an override, compiled once
// per override while the cache has room.
func (l *Limiter) overrideRule(o Override) (*store.Rule, error) {
	if r, ok := l.overrides.Load(o); ok {
		return r, nil
	}
	r, err := store.NewFixedWindow(uint64(o.RequestsPerUnit), o.window())
	if err != nil {
		return nil, err
	}
	if l.overrides.Size() < maxOverrideRules {
		l.overrides.Store(o, r)
	}
	return r, nil
}
