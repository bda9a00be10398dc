package limiter

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// ErrNoReset is returned by Reset when the store cannot reset counters
// (it does not implement store.Resetter).
var ErrNoReset = errors.New("limiter: the store cannot reset counters")

// Lookup is what Counters found for one descriptor of a request.
type Lookup struct {
	// Rule is the matched rule (its first limit), nil when no rule
	// matched or another descriptor's rule replaced every limit, and for
	// an override.
	Rule *config.Rule
	// Override reports a descriptor with a limit override: its one
	// counter is the override's.
	Override bool
	// Unlimited reports a rule that counts nothing.
	Unlimited bool
	// Counters has one element per limit of the rule (or the override),
	// in the rule's order, replaced ones included.
	Counters []Counter
}

// Counter is one limit's counter as a check would see it now.
type Counter struct {
	// Rule is the limit; nil for an override.
	Rule *config.Rule
	// Limit is what is counted.
	Limit *store.Rule
	// Replaced reports a limit that another descriptor's rule of the same
	// request replaces: a check would not count it, and Decision is zero.
	Replaced bool
	// Decision is what a strict check of cost 0 (store.PeekStrict, whatever
	// Options.StrictPeeks says) reports: Allowed when one more would fit,
	// Remaining, ResetAfter, and RetryAfter when one more would not fit.
	Decision store.Decision
}

// Used is what the counter holds against its limit: the limit (a
// bucket's capacity) less what remains.
func (c *Counter) Used() uint64 {
	return c.Decision.Limit - min(c.Decision.Remaining, c.Decision.Limit)
}

// Counters looks up the counters req's descriptors would count: the rule
// each matches, as Check matches it (replaces and overrides included),
// and the state of every limit of that rule now. It consumes nothing and
// changes nothing (each limit is a store hit of cost 0), and tells the
// Observer nothing: it is not a request. Costs and kinds in req are
// ignored. It returns an *InvalidError for a malformed request,
// ErrNoConfig before a table is loaded, a *StoreError when the store
// failed (whatever the failure mode), or ctx's error.
func (l *Limiter) Counters(ctx context.Context, req *Request) ([]Lookup, error) {
	s, out, err := l.lookup(ctx, req, true)
	if s != nil {
		defer l.scratch.Put(s)
	}
	return out, err
}

// Reset sets the counters that Counters finds for req back to empty (a
// fresh window, a full bucket) and returns them as they are after the
// reset. It returns ErrNoReset when the store cannot reset, and the
// errors of Counters.
func (l *Limiter) Reset(ctx context.Context, req *Request) ([]Lookup, error) {
	rs, ok := l.store.(store.Resetter)
	if !ok {
		return nil, ErrNoReset
	}
	s, _, err := l.lookup(ctx, req, false)
	if s != nil {
		defer l.scratch.Put(s)
	}
	if err != nil {
		return nil, err
	}
	if len(s.hits) > 0 {
		if err := rs.Reset(ctx, l.clock.Now(), s.hits); err != nil {
			return nil, &StoreError{Err: s.named(err, nil)}
		}
	}
	return l.Counters(ctx, req)
}

// lookup plans req as Check does and, if peek, peeks at every kept
// limit. It returns the scratch (for Reset's hits; the caller puts it
// back) when it took one.
func (l *Limiter) lookup(ctx context.Context, req *Request, peek bool) (*scratch, []Lookup, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	if err := l.Validate(req); err != nil {
		return nil, nil, err
	}
	table := l.tables.Current()
	if table == nil {
		return nil, nil, ErrNoConfig
	}
	out := make([]Lookup, len(req.Descriptors))
	s := l.scratch.Get().(*scratch)
	s.reset(len(req.Descriptors))
	if !table.HasDomain(req.Domain) {
		return s, out, nil
	}
	if err := l.plan(table, req, s); err != nil {
		return s, nil, err
	}
	l.replace(s)
	l.build(s)
	for i := range s.hits {
		h := &s.hits[i]
		// A peek: cost 0 never writes, on any store. Not vetoing, so
		// that each limit is judged alone; strict, so that a counter
		// reports whether one more unit fits.
		h.Cost, h.Mode, h.Veto, h.Peek = 0, store.ModeTake, false, store.PeekStrict
	}
	if !peek {
		return s, nil, nil
	}
	if len(s.hits) > 0 {
		if err := l.store.Take(ctx, l.clock.Now(), s.hits, s.out); err != nil {
			return s, nil, &StoreError{Err: s.named(err, nil)}
		}
	}
	for i := range s.plan {
		p := &s.plan[i]
		lk := &out[i]
		lk.Override = p.override
		if !p.override {
			lk.Rule = p.rule
		}
		if p.rule != nil && p.rule.Unlimited {
			lk.Unlimited = true
			continue
		}
		if p.n == 0 {
			continue
		}
		lk.Counters = make([]Counter, p.n)
		for j := range p.n {
			lp := &s.lims[p.first+j]
			c := &lk.Counters[j]
			c.Rule, c.Limit, c.Replaced = lp.rule, lp.limit, lp.dropped
			if lp.hit >= 0 {
				c.Decision = s.out[lp.hit]
				c.Decision.Local = false
			}
		}
	}
	return s, out, nil
}
