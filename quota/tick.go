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
// fleetMode) among its proxies by their demands (the peaks of their
// recent reports), stretched by what their last reports left unused (see
// Stretch) unless this replica divides only its cautious part: each
// proxy's share, in whole requests per period, and its demand go into its
// sub (share, wanted), what the proxies hold into g.assigned, counting
// the stretch as not held, so that newcomers still draw from the reserve.
// s.mu is held.
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
	divided := capacity
	if mode == fleetUncertain {
		g.stretch = 1
	} else {
		g.stretch = s.stretch(now, g, subs, capacity)
		// Never past the peaks: no proxy gets more than its peak from
		// the stretch.
		var peaks float64
		for _, d := range demands {
			peaks += d
		}
		divided = max(capacity, min(g.stretch*capacity, peaks))
	}
	sc.shares = grow(sc.shares, len(demands))
	sc.whole = growU(sc.whole, len(subs))
	shares, whole := sc.shares, sc.whole
	FairShares(demands, divided, shares)
	// Rounded over this replica's proxies only, so that the replicas'
	// rounded shares cannot sum above the limit either.
	Whole(shares, whole)
	var held float64
	for i, b := range subs {
		held += float64(whole[i])
		b.share, b.wanted = whole[i], demands[i]
	}
	g.assigned = others + min(held, capacity)
}

// stretch is g's next stretch (see Stretch) from its proxies' last
// reports; s.mu is held.
func (s *Service) stretch(now time.Time, g *group, subs []*sub, capacity float64) float64 {
	if s.o.Overcommit <= 1 {
		return 1
	}
	period := g.rule.Limit.Period().Seconds()
	var free, limited float64
	settled := true
	for _, b := range subs {
		if now.Sub(b.seen) > staleAfter*max(b.interval, s.o.Interval) {
			continue
		}
		if b.nrecent < 3 {
			// Its reports do not show the shares yet: no rise.
			settled = false
			continue
		}
		if b.limited {
			limited += b.allowed * period
		} else {
			free += b.allowed * period
		}
	}
	if !settled {
		// Start again once every proxy's reports show its shares.
		g.past = g.past[:0]
		return g.stretch
	}
	// Averaged over the last stretchWindow intervals (one interval's
	// reports straddle the windows the shares are counted in), what the
	// limited proxies admitted scaled to the stretch in force now.
	if len(g.past) < stretchWindow {
		g.past = append(g.past, stretchSample{})
	}
	copy(g.past[1:], g.past)
	g.past[0] = stretchSample{free, limited / g.stretch}
	var avgFree, perStretch float64
	for _, p := range g.past {
		avgFree += p.free / float64(len(g.past))
		perStretch += p.limited / float64(len(g.past))
	}
	next := Stretch(g.stretch, avgFree, perStretch*g.stretch, capacity, s.o.Overcommit)
	if free+limited >= capacity || len(g.past) < 2 {
		// No rise while the last interval alone admitted capacity.
		return min(next, g.stretch)
	}
	return min(next, maxRise*g.stretch)
}

// maxRise bounds how far the stretch rises in one Tick, while the reports
// lag the shares.
const maxRise = 2

// stretchWindow is how many intervals the stretch is averaged over.
const stretchWindow = 4

// stretchSample is one interval's figures for Stretch: what the free
// proxies admitted, and the limited ones per unit of the stretch then.
type stretchSample struct{ free, limited float64 }

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
