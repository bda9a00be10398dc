package quota

import (
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
	// FleetErrors counts failed demand exchanges.
	FleetErrors uint64
}

// Stats returns the current counters.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	st := Stats{Streams: len(s.streams), Buckets: s.nsubs}
	s.mu.Unlock()
	st.Reports, st.Usages, st.Rejected = s.reports.Load(), s.usages.Load(), s.rejected.Load()
	st.FleetErrors = s.fleetErrors.Load()
	for i := range st.Pushed {
		st.Pushed[i] = s.pushed[i].Load()
	}
	return st
}

// RuleStat is one rule's division as of the last Tick: this replica's
// buckets (subscriptions) under it, their groups (counter keys), their
// total demand and total assigned share, both in requests per the rule's
// period.
type RuleStat struct {
	Rule            *config.Rule
	Groups, Buckets int
	Demand, Share   float64
}

// Rules returns the per-rule statistics of the last Tick, by domain and
// path.
func (s *Service) Rules() []RuleStat {
	s.mu.Lock()
	rs := slices.Clone(s.rules)
	s.mu.Unlock()
	slices.SortFunc(rs, func(a, b RuleStat) int {
		if c := strings.Compare(a.Rule.Domain, b.Rule.Domain); c != 0 {
			return c
		}
		return strings.Compare(a.Rule.Path, b.Rule.Path)
	})
	return rs
}
