package quota

import (
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/config"
)

// Stats are a Service's counters and sizes.
type Stats struct {
	Streams, Buckets int
	// Reports are messages received, Usages the bucket reports in them,
	// Rejected the malformed or over-cap ones that ended a stream.
	Reports, Usages, Rejected uint64
	// Pushed counts the actions queued, by Kind (index 0 unused).
	Pushed [Abandon + 1]uint64
	// Capped counts the streams and reports refused at each Cap (they
	// count in Rejected too).
	Capped [CapBucketKeys + 1]uint64
	// FleetErrors counts the demand exchanges that failed in whole or in
	// part, ClaimErrors the groups whose claim failed in them, and
	// ClaimsDeferred the groups left unclaimed in an interval because
	// more than MaxClaims were due.
	FleetErrors, ClaimErrors, ClaimsDeferred uint64
	// Panics counts the panics Run recovered.
	Panics uint64
	// Shared reports that demand is shared with the other replicas
	// (Options.Fleet, Redis): shares divide the fleet's limit.
	Shared bool
}

// Stats returns the current counters.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	st := Stats{Streams: len(s.streams), Buckets: s.nsubs, Shared: s.o.Fleet != nil}
	s.mu.Unlock()
	st.Reports, st.Usages, st.Rejected = s.reports.Load(), s.usages.Load(), s.rejected.Load()
	st.FleetErrors, st.ClaimErrors, st.ClaimsDeferred = s.fleetErrors.Load(), s.claimErrors.Load(), s.claimsDeferred.Load()
	st.Panics = s.panics.Load()
	for i := range st.Capped {
		st.Capped[i] = s.capped[i].Load()
	}
	for i := range st.Pushed {
		st.Pushed[i] = s.pushed[i].Load()
	}
	return st
}

// MaxStatBuckets is the most bucket ids a RuleStat lists.
const MaxStatBuckets = 20

// RuleStat is one rule's division as of the last Tick: this replica's
// buckets (subscriptions) under it, the streams (proxies) they belong to,
// their groups (counter keys: each divides the rule's limit), their total
// demand and total assigned share, both in requests per the rule's
// period. Buckets of an unlimited, shadow-mode or zero limit rule divide
// nothing: they count in Buckets and Streams, not in Groups.
type RuleStat struct {
	Rule                     *config.Rule
	Groups, Buckets, Streams int
	// Unmeasured counts the buckets with one report only, whose demand
	// is not known yet (they are given an equal share); Demand (each
	// bucket's mean over its last reports, see Options.DemandWindow)
	// leaves them out.
	Unmeasured    int
	Demand, Share float64
	// BucketIDs are some of the buckets' ids (at most MaxStatBuckets),
	// only for a rule with detailed_metric: a bucket id may hold client
	// addresses or API keys, like a descriptor's values.
	BucketIDs []map[string]string

	last *Stream // the stream last counted in Streams, during Tick
}

// Rules returns the per-rule statistics of the last Tick, by domain and
// path.
func (s *Service) Rules() []RuleStat {
	s.mu.Lock()
	rs := slices.Clone(s.rules)
	s.mu.Unlock()
	for i := range rs {
		// The maps are the subscriptions' own.
		ids := make([]map[string]string, len(rs[i].BucketIDs))
		for j, id := range rs[i].BucketIDs {
			ids[j] = maps.Clone(id)
		}
		rs[i].BucketIDs = ids
	}
	slices.SortFunc(rs, func(a, b RuleStat) int {
		if c := strings.Compare(a.Rule.Domain, b.Rule.Domain); c != 0 {
			return c
		}
		return strings.Compare(a.Rule.Path, b.Rule.Path)
	})
	return rs
}

// recordStats records the per-rule statistics of the shares divide has
// just computed (see Rules); s.mu is held.
func (s *Service) recordStats() {
	stats := map[*config.Rule]*RuleStat{}
	for _, g := range s.groups {
		ruleStat(stats, g.rule).Groups++
	}
	for st := range s.streams {
		for _, b := range st.subs {
			if b.g != nil {
				statShare(stats, b)
			}
			if b.rule != nil {
				statStream(stats, st, b)
			}
		}
	}
	s.rules = s.rules[:0]
	for _, rs := range stats {
		rs.last = nil
		s.rules = append(s.rules, *rs)
	}
}

// ruleStat returns r's stat in stats, added if missing.
func ruleStat(stats map[*config.Rule]*RuleStat, r *config.Rule) *RuleStat {
	rs := stats[r]
	if rs == nil {
		rs = &RuleStat{Rule: r}
		stats[r] = rs
	}
	return rs
}

// statShare counts b, a bucket of a group, in its group's rule's stat:
// its demand and its share.
func statShare(stats map[*config.Rule]*RuleStat, b *sub) {
	rs := ruleStat(stats, b.g.rule)
	rs.Buckets++
	if math.IsInf(b.mean, 1) {
		rs.Unmeasured++
	} else {
		rs.Demand += b.mean
	}
	rs.Share += float64(b.share)
}

// statStream counts b, a bucket of stream st under a rule, in its rule's
// stat: its stream (each stream's buckets are visited together, so
// comparing with the last one counts each once), a bucket whose rule
// divides no limit (statShare counts the others), and for a rule with
// detailed_metric its bucket id, up to MaxStatBuckets.
func statStream(stats map[*config.Rule]*RuleStat, st *Stream, b *sub) {
	rs := ruleStat(stats, b.rule)
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
