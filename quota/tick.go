package quota

import (
	"cmp"
	"context"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// Tick re-matches every bucket if the table changed, abandons idle
// buckets, exchanges demand with the fleet, recomputes every group's
// shares and queues the assignments that changed by more than the
// threshold or near their TTL. The error is the Fleet's; shares are
// computed anyway: a group whose claim failed is divided with the part
// it last claimed while the other replicas still count it (see
// fleetMode). With more than MaxClaims groups, at most MaxClaims are
// claimed (see claimOrder).
func (s *Service) Tick(ctx context.Context, now time.Time) error {
	local, release, claimed := s.measure(now)
	grants, err := s.exchange(ctx, now, local, release)
	s.divide(now, grants, claimed)
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
				s.pushed[Abandon].Add(1)
			}
		}
	}
}

// divide applies the fleet's outcome and recomputes every group's
// shares, queueing what is due; it answers the buckets that divide no
// limit, and records the per-rule statistics.
func (s *Service) divide(now time.Time, grants store.Grants, claimed []*group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.o.Fleet != nil {
		s.applyGrants(now, grants, claimed)
	}
	stats := map[*config.Rule]*RuleStat{}
	var sc divideScratch
	for _, g := range s.groups {
		s.divideGroup(now, g, stats, &sc)
	}
	for st := range s.streams {
		for _, b := range st.subs {
			if b.rule != nil {
				statStream(stats, st, b)
			}
			if b.g != nil || s.table == nil {
				// Before the first table, no answer: Envoy's
				// no_assignment_behavior applies.
				continue
			}
			if a := answer(b); s.due(now, b, &a, 0, 0) {
				s.queue(now, b, a)
				s.pushed[a.Kind].Add(1)
			}
		}
	}
	s.rules = s.rules[:0]
	for _, rs := range stats {
		rs.last = nil
		s.rules = append(s.rules, *rs)
	}
}

// divideScratch is divideGroup's reused buffers.
type divideScratch struct {
	subs            []*sub
	demands, shares []float64
	whole           []uint64
}

// divideGroup divides g's limit (or this replica's part of it) among its
// proxies by their demands, queues the assignments due and adds g to its
// rule's statistics; s.mu is held.
func (s *Service) divideGroup(now time.Time, g *group, stats map[*config.Rule]*RuleStat, sc *divideScratch) {
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
	for _, v := range whole {
		g.assigned += float64(v)
	}
	rs := stats[g.rule]
	if rs == nil {
		rs = &RuleStat{Rule: g.rule}
		stats[g.rule] = rs
	}
	rs.Groups++
	for i, b := range subs {
		rs.Buckets++
		if math.IsInf(demands[i], 1) {
			rs.Unmeasured++
		} else {
			rs.Demand += demands[i]
		}
		rs.Share += float64(whole[i])
		a := assign(g.rule, whole[i], s.o.FixedWindowAsTokenBucket)
		if s.due(now, b, &a, whole[i], demands[i]) {
			b.sentShare = whole[i]
			s.queue(now, b, a)
			s.pushed[a.Kind].Add(1)
		}
	}
}

// statStream counts b, a bucket of stream st under a rule, in its rule's
// stat: its stream (each stream's buckets are visited together, so
// comparing with the last one counts each once), a bucket whose rule
// divides no limit (the groups counted the others), and for a rule with
// detailed_metric its bucket id, up to MaxStatBuckets.
func statStream(stats map[*config.Rule]*RuleStat, st *Stream, b *sub) {
	rs := stats[b.rule]
	if rs == nil {
		rs = &RuleStat{Rule: b.rule}
		stats[b.rule] = rs
	}
	if rs.last != st {
		rs.last = st
		rs.Streams++
	}
	if b.g == nil {
		rs.Buckets++
	}
	if b.rule.DetailedMetric && len(rs.BucketIDs) < MaxStatBuckets {
		rs.BucketIDs = append(rs.BucketIDs, b.bucket)
	}
}

// due reports whether a, a share of share (requests per period), should
// be sent for b whose demand is demand: nothing was sent yet, the strategy
// kind changed, or the last one sent expires within two intervals; else,
// for requests per time unit, the share fell (so that what the proxies
// hold never sums above the limit), or rose by more than the threshold or
// while the proxy wants more than it holds. A token bucket is re-sent only
// when its share moved by more than the threshold either way: Envoy
// rebuilds a changed bucket full, so every push grants a burst.
func (s *Service) due(now time.Time, b *sub, a *Action, share uint64, demand float64) bool {
	switch {
	case !b.hasSent || b.sent.Kind != a.Kind:
		return true
	case now.Add(2 * s.o.Interval).After(b.sentAt.Add(s.o.TTL)):
		return true
	case b.sent.same(a) || b.g == nil:
		return false
	}
	was, next := float64(b.sentShare), float64(share)
	if a.Kind == TokenBucket {
		return math.Abs(next-was) > s.o.Threshold*was
	}
	return next < was || next-was > s.o.Threshold*was || demand > was
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
