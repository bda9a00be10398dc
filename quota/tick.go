package quota

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Tick runs one interval in four phases: measure (re-match every bucket
// if the table changed, abandon idle buckets, collect this replica's
// claims), exchange them with the fleet, divide every group's limit (or
// this replica's part of it) among its proxies, and push the assignments
// that changed by more than the threshold or near their TTL. The error is
// the Fleet's; shares are divided anyway: a group whose claim failed is
// divided with the part it last claimed while the other replicas still
// count it (see fleetMode). With more than MaxClaims groups, at most
// MaxClaims are claimed (see claimOrder).
func (s *Service) Tick(ctx context.Context, now time.Time) error {
	local, release, claimed := s.measure(now)
	// Without s.mu: a slow fleet does not hold up the streams' reports.
	grants, err := s.exchange(ctx, now, local, release)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.applyGrants(now, grants, claimed)
	s.divide(now)
	s.push(now)
	s.recordStats()
	return err
}

// measure re-matches the buckets if the table changed, abandons the idle
// ones and returns this interval's claims on the fleet (see claims).
func (s *Service) measure(now time.Time) (map[string]store.Claim, []string, []*group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.tables.Current(); t != nil && t != s.table {
		s.rematch(t)
	}
	s.abandonIdle(now)
	if s.o.Fleet == nil {
		return nil, nil, nil
	}
	if s.fleetFrom.IsZero() {
		s.fleetFrom = now
	}
	return s.claims(now)
}

// abandonIdle abandons the buckets with no traffic for IdleAbandon; s.mu
// is held.
func (s *Service) abandonIdle(now time.Time) {
	for st := range s.streams {
		for k, b := range st.subs {
			if now.Sub(b.busy) >= s.o.IdleAbandon {
				s.unsubscribe(b)
				delete(st.subs, k)
				s.queue(now, b, Action{Kind: Abandon})
			}
		}
	}
}

// divide recomputes every group's shares (see divideGroup); push sends
// them. s.mu is held.
func (s *Service) divide(now time.Time) {
	var sc divideScratch
	for _, g := range s.groups {
		s.divideGroup(now, g, &sc)
	}
}

// divideScratch is divideGroup's reused buffers.
type divideScratch struct {
	subs    []*sub
	demands []store.Demand
	shares  []float64
	whole   []uint64
	div     Divider
}

// divideGroup divides g's limit (or this replica's part of it, see
// fleetMode) among its proxies by what their recent reports say they
// use of a share (see Divider.Shares): each proxy's share, in whole
// requests per period, and its peak and mean demand go into its sub
// (share, wanted, mean), what the proxies hold into g.assigned,
// counting what they hold above what is divided as not held, so that
// newcomers still draw from the reserve. Unless this replica divides only its cautious part,
// the shares may sum up to Overcommit × what is divided, and what is
// divided is corrected by how far the proxies' last reports strayed
// from what their histories predicted (see correct). s.mu is held.
func (s *Service) divideGroup(now time.Time, g *group, sc *divideScratch) {
	// In a stable order, so that the units rounding hands out go to the
	// same proxies every interval.
	subs := sc.subs[:0]
	for b := range g.subs {
		subs = append(subs, b)
	}
	slices.SortFunc(subs, func(x, y *sub) int {
		if c := cmp.Compare(x.st.id, y.st.id); c != 0 {
			return c
		}
		return strings.Compare(x.key, y.key)
	})
	sc.subs = subs
	ds := sc.demands[:0]
	for _, b := range subs {
		ds = append(ds, b.demand(now, s.o.Interval))
	}
	sc.demands = ds
	limit := float64(g.rule.Limit.Limit())
	capacity, others := limit*(1-s.o.reserve()), 0.0
	mode := s.fleetMode(g)
	switch mode {
	case fleetUncertain:
		capacity = s.cautious(limit)
	case fleetShared:
		// Newcomers draw from this replica's part of the reserve only:
		// count the rest of the limit as held.
		capacity = g.granted
		others = limit - s.cautious(limit) - capacity
	}
	target, most, scale := capacity, capacity, 1.0
	if mode != fleetUncertain && s.o.Overcommit > 1 {
		most = s.o.Overcommit * capacity
		target, scale = s.correct(now, g, subs, ds, capacity, most)
	}
	sc.shares = grow(sc.shares, len(subs))
	sc.whole = growU(sc.whole, len(subs))
	shares, whole := sc.shares, sc.whole
	sc.div.Shares(ds, target, most, shares)
	for i := range shares {
		shares[i] *= scale
	}
	// Rounded over this replica's proxies only, so that the replicas'
	// rounded shares cannot sum above the limit either.
	Whole(shares, whole)
	var held float64
	for i, b := range subs {
		held += float64(whole[i])
		b.share, b.wanted, b.mean = whole[i], ds[i].Peak, ds[i].Mean
	}
	g.assigned = others + min(held, capacity)
}

// correct returns what to divide among g's proxies: capacity, raised
// by the error of the expected usages, and the factor to scale the
// shares by. s.mu is held.
//
// The error is how much less the proxies' last reports admitted than
// their demands predicted of the shares they held then (see
// ExpectedUse), the median of the last DemandWindow intervals' (of at
// least minErrs), counted only above 0 and up to most. A proxy's report
// straddles two of the windows its share counts in, so that its demands
// are blurred and their expected usage overstated (a burst of one
// window reads as part burst in two reports): the error gives back what
// that leaves unused. In a report a proxy counts as admitting at most
// what two windows' shares allow (a proxy that does not enforce its
// share, as Envoy's filter lets requests_per_time_unit through, only
// keeps the error at 0).
//
// The factor is below 1 when the proxies admitted more than the limit
// (or this replica's part of it, capacity / (1 − reserve)) in their
// last two reports, each counted at most at its share: capacity over
// the lesser of the two, so that the shares then admit at most capacity
// if those demands come again. One report alone may read above the
// limit without the windows doing so, when it ends early in a window (a
// proxy admits its share early in its window).
func (s *Service) correct(now time.Time, g *group, subs []*sub, ds []store.Demand, capacity, most float64) (target, scale float64) {
	period := g.rule.Limit.Period().Seconds()
	var predicted, admitted, used float64
	counted := false
	for i, b := range subs {
		if !b.heldKnown || b.nrecent < len(b.recent) || b.stale(now, s.o.Interval) {
			continue
		}
		counted = true
		a := b.allowed * period
		predicted += ExpectedUse(ds[i], b.held, 0, capacity)
		admitted += min(a, b.held*(1+period/b.interval.Seconds()))
		used += min(a, b.held)
	}
	if counted {
		if len(g.errs) < s.o.DemandWindow {
			g.errs = append(g.errs, 0)
		}
		copy(g.errs[1:], g.errs)
		g.errs[0] = predicted - admitted
	}
	target, scale = capacity, 1
	if len(g.errs) >= min(minErrs, s.o.DemandWindow) {
		target = min(capacity+max(median(g.errs, &g.sorted), 0), most)
	}
	part := capacity / (1 - s.o.reserve())
	if !counted || !(part > 0) {
		return target, scale
	}
	if over := min(used/part, g.over); over > 1 {
		// What the lesser of the two admitted, capacity / (over × part).
		scale = (1 - s.o.reserve()) / over
	}
	g.over = used / part
	return target, scale
}

// push queues for every bucket the assignment due (see due): its share
// of its group's limit as divide left it, or for a bucket that divides no
// limit its answer (see answer). s.mu is held.
func (s *Service) push(now time.Time) {
	for st := range s.streams {
		for _, b := range st.subs {
			switch {
			case b.g != nil:
				a := assign(b.g.rule, b.share, s.o.FixedWindowAsTokenBucket)
				if s.due(now, b, &a) {
					b.setSent(now, b.share)
					s.queue(now, b, a)
				}
			case s.table != nil:
				// (Before the first table, no answer: Envoy's
				// no_assignment_behavior applies.)
				if a := answer(b); s.due(now, b, &a) {
					s.queue(now, b, a)
				}
			}
		}
	}
}

// due reports whether a should be sent for b: nothing was sent yet, the
// strategy kind changed, or the last one sent expires within two
// intervals; else, for a bucket of a group (a the assignment of its
// share), for requests per time unit, the share fell (so that what the
// proxies hold never sums above the limit), or rose by more than the
// threshold or while the proxy wants more than it holds. A token bucket is
// re-sent only when its share moved by more than the threshold either
// way: Envoy rebuilds a changed bucket full, so every push grants a
// burst.
func (s *Service) due(now time.Time, b *sub, a *Action) bool {
	switch {
	case !b.hasSent || b.sent.Kind != a.Kind:
		return true
	case now.Add(2 * s.o.Interval).After(b.sentAt.Add(s.o.TTL)):
		return true
	case b.sent.same(a) || b.g == nil:
		return false
	}
	was, next := float64(b.sentShare), float64(b.share)
	if a.Kind == TokenBucket {
		return math.Abs(next-was) > s.o.Threshold*was
	}
	return next < was || next-was > s.o.Threshold*was || b.wanted > was
}

func grow(s []float64, n int) []float64 {
	if cap(s) < n {
		return make([]float64, n)
	}
	return s[:n]
}

func growU(s []uint64, n int) []uint64 {
	if cap(s) < n {
		return make([]uint64, n)
	}
	return s[:n]
}

// minErrs is how many intervals' errors correct waits for: the median of
// three or more is not moved by one interval's outlier (the first
// interval after the histories fill, whose shares were divided by
// shorter ones).
const minErrs = 3

// median is the median of v, sorted in buf.
func median(v []float64, buf *[]float64) float64 {
	s := append((*buf)[:0], v...)
	*buf = s
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
