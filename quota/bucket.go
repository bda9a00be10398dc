package quota

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// group is the buckets that share one limit: one rule and counter key.
type group struct {
	key  string
	rule *config.Rule
	subs map[*sub]struct{}
	// assigned is what the proxies hold as of the last Tick plus what
	// proxies that joined since were given: the fleet's total when the
	// limit is shared (the parts not this replica's counted as held),
	// this replica's only otherwise (see fleetMode).
	assigned float64
	// claimed: an Exchange granted this replica a part of the group's
	// limit, granted (the last one), at claimedAt.
	claimed   bool
	granted   float64
	claimedAt time.Time
	// errs are the errors of the expected usages of the last
	// Options.DemandWindow Ticks, newest first: what the proxies' reports
	// admitted less than predicted (see correct).
	errs []float64
	// over is what the proxies' reports admitted at the last Tick, over
	// the limit (or this replica's part of it, see correct).
	over   float64
	sorted []float64 // errs sorted (a buffer of correct)
	// rank orders the claims when there are more than MaxClaims (see
	// claimOrder).
	rank int
}

// sub is one stream's subscription to one bucket.
type sub struct {
	st     *Stream
	key    string
	bucket map[string]string
	rule   *config.Rule // nil when unmatched
	g      *group       // nil when no limit is divided (see answer)
	// recent are the demands (allowed + denied per second) of the last
	// reports (Options.DemandWindow of them, after the first, which has
	// no rate) in a ring; nrecent are set. allowed is the last report's,
	// per second, and held the share it was made under (the shares sent,
	// averaged over the report's time; heldKnown once one was sent, see
	// correct). interval is its elapsed time.
	recent        []float64
	allowed       float64
	held          float64
	heldKnown     bool
	next, nrecent int
	measured      bool // a report after the first came
	interval      time.Duration
	seen          time.Time // last report
	busy          time.Time // last report with traffic
	// share is b's share of its group's limit as the last Tick divided
	// it (requests per period), wanted its peak demand then and mean its
	// mean demand (see demand).
	share        uint64
	wanted, mean float64
	sent         Action
	sentShare    uint64    // the share sent, requests per period
	sentSince    time.Time // when sentShare last changed
	sentPrev     uint64    // the share sent before that
	sentAt       time.Time
	hasSent      bool
}

// record updates b's demand from a report.
func (b *sub) record(now time.Time, u *Usage) {
	n := u.Allowed + u.Denied
	el := u.Elapsed
	if el <= 0 {
		// No elapsed time: measure from the last report.
		el = now.Sub(b.seen)
		if b.seen.IsZero() || el <= 0 {
			el = b.st.s.o.Interval
		}
	}
	b.interval = el
	// A bucket's first report counts the requests since the proxy
	// created it, a moment ago: no rate. Until the next one its demand
	// is unknown and it is treated as wanting an equal share.
	b.measured = !b.seen.IsZero()
	if b.measured {
		if b.recent == nil {
			b.recent = make([]float64, b.st.s.o.DemandWindow)
		}
		sec := el.Seconds()
		b.allowed = float64(u.Allowed) / sec
		b.held, b.heldKnown = b.heldOver(now.Add(-el), now), b.hasSent
		b.recent[b.next] = float64(n) / sec
		b.next = (b.next + 1) % len(b.recent)
		b.nrecent = min(b.nrecent+1, len(b.recent))
	}
	b.seen = now
	if n > 0 {
		b.busy = now
	}
}

// staleAfter is how many of a bucket's reporting intervals may pass
// without a report before its demand counts as 0.
const staleAfter = 3

// stale reports whether b's reports have stopped for staleAfter of its
// intervals (at least interval).
func (b *sub) stale(now time.Time, interval time.Duration) bool {
	return now.Sub(b.seen) > staleAfter*max(b.interval, interval)
}

// demand is b's demand over its last reports (Options.DemandWindow, see
// DemandOf), in requests per its group's period, so that a proxy whose
// demand comes in bursts counts as wanting its bursts as often as they
// came; infinite (an equal share) after only its first report, or 0 once
// its reports have stopped (see stale).
func (b *sub) demand(now time.Time, interval time.Duration) store.Demand {
	switch {
	case b.stale(now, interval):
		return store.Demand{}
	case !b.measured:
		inf := math.Inf(1)
		return store.Demand{Low: inf, Mean: inf, Peak: inf}
	}
	d := DemandOf(b.recent[:b.nrecent])
	p := b.g.rule.Limit.Period().Seconds()
	return store.Demand{Low: d.Low * p, Mean: d.Mean * p, Peak: d.Peak * p}
}

// current returns the table to match against, nil before the first one
// is in force. When the first one comes, the buckets subscribed before
// it are matched against it. s.mu is held.
func (s *Service) current() *config.Table {
	if s.table == nil {
		if t := s.tables.Current(); t != nil {
			s.rematch(t)
		}
	}
	return s.table
}

// rematch makes t the table in force and matches every bucket against
// it; each is re-assigned (at once if it reports, else at the next Tick),
// changed or not. A limit's claim on the fleet stays known across the
// reload. s.mu is held.
func (s *Service) rematch(t *config.Table) {
	s.table = t
	type claim struct {
		granted float64
		at      time.Time
	}
	claimed := make(map[string]claim, len(s.groups))
	for k, g := range s.groups {
		if g.claimed {
			claimed[k] = claim{g.granted, g.claimedAt}
		}
	}
	for st := range s.streams {
		for _, b := range st.subs {
			s.unsubscribe(b)
			s.subscribe(t, b)
			b.hasSent = false
		}
	}
	for k, g := range s.groups {
		if c, ok := claimed[k]; ok {
			g.claimed, g.granted, g.claimedAt = true, c.granted, c.at
		}
	}
}

// subscribe matches b against t and joins its group; s.mu is held.
func (s *Service) subscribe(t *config.Table, b *sub) {
	s.nsubs++
	b.rule, b.g = nil, nil
	if t == nil {
		return
	}
	r, key := t.MatchBucket(b.st.domain, b.bucket, s.keyBuf[:0])
	s.keyBuf = key[:0]
	b.rule = r
	if r == nil || r.Unlimited || r.ShadowMode || r.Limit == nil || r.RequestsPerUnit == 0 {
		return
	}
	g := s.groups[string(key)]
	if g == nil {
		g = &group{key: string(key), subs: map[*sub]struct{}{}}
		s.groups[g.key] = g
	}
	// A group that outlives a reload (rematch moves its buckets one at
	// a time) takes the new table's rule: a fixed window's counter key
	// does not change with its limit.
	g.rule = r
	g.subs[b] = struct{}{}
	b.g = g
}

// unsubscribe leaves b's group; a group left empty is gone, and this
// replica's part of it given back at the next Exchange. s.mu is held.
func (s *Service) unsubscribe(b *sub) {
	s.nsubs--
	if g := b.g; g != nil {
		delete(g.subs, b)
		if len(g.subs) == 0 {
			delete(s.groups, g.key)
			if g.claimed && len(s.released) < s.o.MaxClaims {
				s.released = append(s.released, g.key)
			}
		}
		b.g = nil
	}
}

// answer is b's strategy when no share is divided: unmatched, unlimited
// and shadow-mode buckets are allowed, a limit of 0 denies.
func answer(b *sub) Action {
	if r := b.rule; r != nil && !r.Unlimited && !r.ShadowMode && r.RequestsPerUnit == 0 {
		return Action{Kind: DenyAll}
	}
	return Action{Kind: AllowAll}
}

// answerNew answers a bucket's first report at once: a proxy joining a
// group gets half of what is not assigned (the reserve, or all of the
// limit for the group's first proxy), at most an equal share, so the
// shares never sum above the limit; Tick gives it its fair share at the
// next interval. s.mu is held.
func (s *Service) answerNew(now time.Time, b *sub) {
	if b.g == nil {
		s.queue(now, b, answer(b))
		return
	}
	limit := float64(b.g.rule.Limit.Limit())
	var free float64
	switch s.fleetMode(b.g) {
	case fleetAlone:
		free = limit - b.g.assigned
	case fleetUncertain:
		free = s.cautious(limit) - b.g.assigned
	default:
		// b.g.assigned counts all but this replica's part of the
		// reserve (see divideGroup): proxies joining on every replica at
		// once still fit in the limit.
		free = limit - b.g.assigned
	}
	free = max(free, 0)
	share := min(free/2, limit/float64(len(b.g.subs)))
	b.g.assigned += share
	b.setSent(now, uint64(share))
	s.queue(now, b, assign(b.g.rule, b.sentShare, s.o.FixedWindowAsTokenBucket))
}

// setSent records share as the share sent to b at now.
func (b *sub) setSent(now time.Time, share uint64) {
	if share != b.sentShare || b.sentSince.IsZero() {
		b.sentPrev, b.sentSince = b.sentShare, now
	}
	b.sentShare = share
}

// heldOver is the share b held from from to to, averaged over the time:
// the one sent last since it was sent, the one before until then.
func (b *sub) heldOver(from, to time.Time) float64 {
	if !b.sentSince.After(from) || !to.After(from) {
		return float64(b.sentShare)
	}
	f := min(float64(to.Sub(b.sentSince))/float64(to.Sub(from)), 1)
	return f*float64(b.sentShare) + (1-f)*float64(b.sentPrev)
}

// queue sends a its TTL, queues it for b's stream and counts it in
// Stats.Pushed; s.mu is held.
func (s *Service) queue(now time.Time, b *sub, a Action) {
	s.pushed[a.Kind].Add(1)
	a.Bucket = b.bucket
	if a.Kind != Abandon {
		a.TTL = s.o.TTL
		b.sent, b.sentAt, b.hasSent = a, now, true
	}
	st := b.st
	if i, ok := st.outIdx[b.key]; ok {
		st.out[i] = a
	} else {
		st.outIdx[b.key] = len(st.out)
		st.out = append(st.out, a)
	}
	select {
	case st.notify <- struct{}{}:
	default:
	}
}
