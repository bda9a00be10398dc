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

// Fleet shares limits between the replicas of a deployment.
type Fleet interface {
	// Exchange publishes, for each group key in local, the demands of
	// this replica's proxies (requests per the rule's period) and claims
	// this replica's part of the group's capacity: atomically per group,
	// its proxies' expected usages at the water level of the capacity
	// over every replica's demands (see Divider.Level), at most what the
	// other replicas hold not.
	// The parts the replicas hold thus never sum above the capacity. It
	// gives back this replica's part of each group in release, which it
	// no longer has.
	//
	// Each group's claim stands alone: the error reports the claims (and
	// the rest) that failed, and the Grants hold what succeeded.
	Exchange(ctx context.Context, now time.Time, local map[string]store.Claim, release []string) (store.Grants, error)
}

// How a group is divided, by what this replica knows of the fleet.
const (
	// fleetAlone: no Fleet, or it has failed for longer than the TTL, or
	// this replica is the only live one: the limit is divided among this
	// replica's proxies.
	fleetAlone = iota
	// fleetUncertain: the group has not been claimed yet, or its last
	// claim is old enough that the others ignore it (its claims failed,
	// or it waited its turn past MaxClaims), so other replicas may hold
	// all of the limit but the reserve. This replica divides only its
	// cautious part (see cautious) among its proxies.
	fleetUncertain
	// fleetShared: this replica divides the part it claimed.
	fleetShared
)

// fleetMode is how g is divided; s.mu is held.
func (s *Service) fleetMode(g *group) int {
	switch {
	case s.o.Fleet == nil:
		return fleetAlone
	case s.fleetSince.IsZero():
		// Nothing exchanged yet: uncertain until the fleet has failed
		// for a TTL.
		if !s.fleetFrom.IsZero() && s.fleetLast.Sub(s.fleetFrom) > s.o.TTL {
			return fleetAlone
		}
		return fleetUncertain
	case s.fleetLast.Sub(s.fleetOK) > s.o.TTL:
		return fleetAlone
	case g.claimed && s.fleetLast.Sub(g.claimedAt) < staleAfter*s.o.Interval:
		// The other replicas count this replica's part for staleAfter
		// intervals after its claim.
		return fleetShared
	case s.fleetOK.Sub(s.fleetSince) >= s.o.Interval && s.live == 1:
		// Every live replica records its membership once an interval, so
		// an Exchange an interval after this replica's first saw all.
		return fleetAlone
	}
	return fleetUncertain
}

// cautious is the part of limit a replica divides while a group's fleet
// demand is uncertain: the reserve, split among the live replicas, as if
// the others held all the rest.
func (s *Service) cautious(limit float64) float64 {
	return limit * s.o.reserve() / float64(max(s.live, 1))
}

// claims returns this interval's claims on the fleet (see claimOrder),
// the groups they are for, and the groups to give back; s.mu is held.
func (s *Service) claims(now time.Time) (map[string]store.Claim, []string, []*group) {
	gs := s.claimOrder(now)
	local := make(map[string]store.Claim, len(gs))
	for _, g := range gs {
		local[g.key] = s.claim(now, g)
	}
	// A group gone and back since (a stream reconnected) is claimed, not
	// given back.
	release := slices.DeleteFunc(s.released, func(k string) bool { return s.groups[k] != nil })
	s.released = nil
	return local, release, gs
}

// claimOrder returns the groups to claim this interval: all of them, or
// at most MaxClaims when there are more. Then a group whose proxies here
// want no more than its cautious part (see cautious) is not claimed: that
// part, which needs no claim, gives them what they want. Of the others,
// the groups of the streams with the fewest buckets come first, so that a
// stream that invents buckets delays only its own groups' claims; among
// equals, those claimed longest ago, so that every group has its turn.
// The groups not claimed are divided with their last claim while it is
// fresh, else cautiously (see fleetMode). s.mu is held.
func (s *Service) claimOrder(now time.Time) []*group {
	gs := make([]*group, 0, len(s.groups))
	for _, g := range s.groups {
		gs = append(gs, g)
	}
	if len(gs) <= s.o.MaxClaims {
		return gs
	}
	gs = slices.DeleteFunc(gs, func(g *group) bool { return !s.wantsClaim(now, g) })
	if len(gs) <= s.o.MaxClaims {
		return gs
	}
	for _, g := range gs {
		g.rank = math.MaxInt
		for b := range g.subs {
			g.rank = min(g.rank, len(b.st.subs))
		}
	}
	slices.SortFunc(gs, func(a, b *group) int {
		return cmp.Or(cmp.Compare(a.rank, b.rank), a.claimedAt.Compare(b.claimedAt), strings.Compare(a.key, b.key))
	})
	s.claimsDeferred.Add(uint64(len(gs) - s.o.MaxClaims))
	return gs[:s.o.MaxClaims]
}

// wantsClaim reports whether g's proxies here want more than its
// cautious part, or have not reported a rate yet; s.mu is held.
func (s *Service) wantsClaim(now time.Time, g *group) bool {
	var d float64
	for b := range g.subs {
		d += b.demand(now, s.o.Interval).Peak
	}
	return d > s.cautious(float64(g.rule.Limit.Limit()))
}

// claim is this replica's claim on g; s.mu is held.
func (s *Service) claim(now time.Time, g *group) store.Claim {
	ds := make([]store.Demand, 0, len(g.subs))
	for b := range g.subs {
		ds = append(ds, b.demand(now, s.o.Interval))
	}
	c := float64(g.rule.Limit.Limit()) * (1 - s.o.reserve())
	m := c
	if !g.claimed {
		m /= float64(max(s.live, 1))
	}
	return store.Claim{Capacity: c, Max: m, Demands: ds}
}

// exchange runs the Fleet's Exchange, if there is one, for at most one
// interval: a slow Redis must not stall the division.
func (s *Service) exchange(ctx context.Context, now time.Time, local map[string]store.Claim, release []string) (store.Grants, error) {
	if s.o.Fleet == nil {
		return store.Grants{}, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.o.Interval)
	defer cancel()
	grants, err := s.o.Fleet.Exchange(ctx, now, local, release)
	if err != nil {
		s.fleetErrors.Add(1)
		failed := 0
		for k := range local {
			if _, ok := grants.Granted[k]; !ok {
				failed++
			}
		}
		s.claimErrors.Add(uint64(failed))
	}
	return grants, err
}

// applyGrants records an Exchange's outcome, if there is a Fleet: the
// part granted to each of claimed whose claim succeeded, and the live
// replicas. A group whose claim failed keeps its last part while it is
// fresh (see fleetMode). s.mu is held.
func (s *Service) applyGrants(now time.Time, grants store.Grants, claimed []*group) {
	if s.o.Fleet == nil {
		return
	}
	s.fleetLast = now
	if grants.Live > 0 {
		s.live = grants.Live
	}
	if grants.Live > 0 || len(grants.Granted) > 0 {
		s.fleetOK = now
		if s.fleetSince.IsZero() {
			s.fleetSince = now
		}
	} else if now.Sub(s.fleetOK) > s.o.TTL {
		s.live = 0
	}
	// Groups made during the exchange were not in it.
	for _, g := range claimed {
		if v, ok := grants.Granted[g.key]; ok {
			g.claimed, g.granted, g.claimedAt = true, v, now
		}
	}
}
