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
	// ShadowMode answers every request OK overall while statuses keep
	// their codes (the reference's SHADOW_MODE).
	ShadowMode bool
	// SaturateDenied makes denied hits consume what is left up to the
	// limit (--denied-hits=saturate) instead of nothing.
	SaturateDenied bool
	// FailureMode decides what a store failure answers.
	FailureMode FailureMode
	// Clock tells the time; nil means the system clock.
	Clock store.Clock
	// Observer, if not nil, is told about every decision.
	Observer Observer
}

// Limiter applies a limits table to requests through a store. It is the
// request policy every protocol shares. Safe for concurrent use.
type Limiter struct {
	tables    Tables
	store     store.Store
	opts      Options
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
	l := &Limiter{tables: tables, store: st, opts: opts, clock: opts.Clock,
		overrides: xsync.NewMap[Override, *store.Rule]()}
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
	hits []store.Hit // per limited descriptor
	out  []store.Decision
}

// planned is what a descriptor resolved to before the store is asked.
type planned struct {
	rule     *config.Rule // matched rule (nil: none, or replaced)
	limit    *store.Rule  // what is counted; nil: nothing
	override bool
	keyStart int
	keyEnd   int
	cost     uint64 // the descriptor's hits_addend
	hit      int    // index into hits, -1 when none
}

// Validate checks a request's shape: a domain, at least one descriptor,
// at most MaxDescriptors descriptors of at most MaxEntries entries, no
// empty entry key and no override with an unknown unit.
func (l *Limiter) Validate(req *Request) error {
	switch {
	case req.Domain == "":
		return &InvalidError{Reason: "domain must not be empty"}
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
	l.build(req, s)
	if len(s.hits) > 0 {
		if err := l.store.Take(ctx, l.clock.Now(), s.hits, s.out); err != nil {
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
	s.hits = s.hits[:0]
}

// plan matches every descriptor and writes its counter key.
func (l *Limiter) plan(table *config.Table, req *Request, s *scratch) error {
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		p := &s.plan[i]
		*p = planned{hit: -1, keyStart: len(s.keys), cost: cost(req, d)}
		if d.Override != (Override{}) {
			r, err := l.overrideRule(d.Override)
			if err != nil {
				return &InvalidError{Reason: fmt.Sprintf("descriptor %d: limit override: %v", i, err)}
			}
			p.override, p.limit = true, r
			s.keys = table.OverrideKey(s.keys, req.Domain, d.Entries, d.Override.Unit)
			if m := d.Override.UnitMultiplier; m > 1 {
				s.keys = strconv.AppendUint(append(s.keys, 'x'), uint64(m), 10)
			}
			p.keyEnd = len(s.keys)
			continue
		}
		if len(d.Entries) == 0 {
			continue
		}
		var key []byte
		p.rule, key = table.Match(req.Domain, d.Entries, s.keys)
		if p.rule == nil {
			continue
		}
		s.keys = key
		p.keyEnd = len(s.keys)
		p.limit = p.rule.Limit // nil for an unlimited rule
	}
	return nil
}

// replace drops the rules named in the replaces list of another
// descriptor's rule: those descriptors report "no rule" and count nothing.
func (l *Limiter) replace(s *scratch) {
	for i := range s.plan {
		r := s.plan[i].rule
		if r == nil || len(r.Replaces) == 0 {
			continue
		}
		for j := range s.plan {
			q := &s.plan[j]
			if j == i || q.rule == nil || q.rule.Name == "" {
				continue
			}
			for _, name := range r.Replaces {
				if q.rule.Name == name {
					q.rule, q.limit = nil, nil
					break
				}
			}
		}
	}
}

// build turns the plan into store hits.
func (l *Limiter) build(req *Request, s *scratch) {
	for i := range s.plan {
		p := &s.plan[i]
		if p.limit == nil {
			continue
		}
		p.hit = len(s.hits)
		s.hits = append(s.hits, store.Hit{
			Key:      keyString(s.keys[p.keyStart:p.keyEnd]),
			Rule:     p.limit,
			Cost:     p.cost,
			Veto:     p.override || !p.rule.ShadowMode,
			Saturate: l.opts.SaturateDenied,
		})
	}
	if cap(s.out) < len(s.hits) {
		s.out = make([]store.Decision, len(s.hits))
	}
	s.out = s.out[:len(s.hits)]
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

// report writes the statuses and the overall code.
func (l *Limiter) report(req *Request, resp *Response, s *scratch) {
	for i := range s.plan {
		p := &s.plan[i]
		st := &resp.Statuses[i]
		switch {
		case p.override:
			d := req.Descriptors[i].Override
			st.Limited = true
			st.RequestsPerUnit, st.Unit, st.UnitMultiplier = d.RequestsPerUnit, d.Unit, d.UnitMultiplier
		case p.rule == nil:
			continue
		case p.rule.Unlimited:
			st.Rule, st.Unlimited, st.Hits = p.rule, true, p.cost
			l.observe(req, i, p.rule, st)
			continue
		default:
			st.Rule, st.Limited = p.rule, true
			st.Name, st.RequestsPerUnit, st.Unit, st.UnitMultiplier = p.rule.Name, p.rule.RequestsPerUnit, p.rule.Unit, p.rule.UnitMultiplier
		}
		st.Decision, st.Hits = s.out[p.hit], p.cost
		if !st.Decision.Allowed && (p.override || !p.rule.ShadowMode) {
			st.Code = OverLimit
			resp.Overall = OverLimit
		}
		if p.override {
			l.observe(req, i, nil, st)
		} else {
			l.observe(req, i, p.rule, st)
		}
	}
	if l.opts.ShadowMode {
		resp.Overall = OK
	}
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
		if p.hit < 0 {
			if p.rule != nil && p.rule.Unlimited {
				resp.Statuses[i].Rule, resp.Statuses[i].Unlimited, resp.Statuses[i].Hits = p.rule, true, p.cost
			}
			continue
		}
		st := &resp.Statuses[i]
		st.Limited, st.Hits = true, p.cost
		if p.override {
			o := req.Descriptors[i].Override
			st.RequestsPerUnit, st.Unit, st.UnitMultiplier = o.RequestsPerUnit, o.Unit, o.UnitMultiplier
		} else {
			st.Rule = p.rule
			st.Name, st.RequestsPerUnit, st.Unit, st.UnitMultiplier = p.rule.Name, p.rule.RequestsPerUnit, p.rule.Unit, p.rule.UnitMultiplier
		}
		st.Decision = store.Decision{Allowed: l.opts.FailureMode == FailAllow, Limit: p.limit.Capacity()}
		if l.opts.FailureMode == FailDeny && s.hits[p.hit].Veto {
			st.Code = OverLimit
			resp.Overall = OverLimit
		}
	}
	if l.opts.ShadowMode {
		resp.Overall = OK
	}
	return nil
}

// overrideRule returns the fixed-window rule of an override, compiled once
// per override while the cache has room. A limit above what a fixed
// window holds is clamped to it.
func (l *Limiter) overrideRule(o Override) (*store.Rule, error) {
	if r, ok := l.overrides.Load(o); ok {
		return r, nil
	}
	r, err := store.NewFixedWindow(min(uint64(o.RequestsPerUnit), store.MaxFixedWindowLimit), o.window())
	if err != nil {
		return nil, err
	}
	if l.overrides.Size() < maxOverrideRules {
		l.overrides.Store(o, r)
	}
	return r, nil
}
