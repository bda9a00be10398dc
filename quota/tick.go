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
	subs            []*sub
	demands, shares []float64
	whole           []uint64
}

// divideGroup divides g's limit (or this replica's part of it, see
// fleetMode) among its proxies by their demands: each proxy's share, in
// whole requests per period, and its demand go into its sub (share,
// wanted), what the proxies hold into g.assigned. s.mu is held.
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
	demands := sc.demands[:0]
	for _, b := range subs {
		demands = append(demands, b.currentDemand(now, s.o.Interval))
	}
	sc.demands = demands
	limit := float64(g.rule.Limit.Limit())
	capacity, others := limit*(1-s.o.reserve()), 0.0
	switch s.fleetMode(g) {
	case fleetUncertain:
		capacity = s.cautious(limit)
	case fleetShared:
		// Newcomers draw from this replica's part of the reserve only:
		// count the rest of the limit as held.
		capacity = g.granted
		others = limit - s.cautious(limit) - capacity
	}
	sc.shares = grow(sc.shares, len(demands))
	sc.whole = growU(sc.whole, len(subs))
	shares, whole := sc.shares, sc.whole
	FairShares(demands, capacity, shares)
	// Rounded over this replica's proxies only, so that the replicas'
	// rounded shares cannot sum above the limit either.
	Whole(shares, whole)
	g.assigned = others
	for i, b := range subs {
		g.assigned += float64(whole[i])
		b.share, b.wanted = whole[i], demands[i]
	}
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
					b.sentShare = b.share
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
