package quota

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/config"
)

// Defaults of Options.
const (
	DefaultInterval            = time.Second
	DefaultTTL                 = 10 * time.Second
	DefaultThreshold           = 0.05
	DefaultReserve             = 0.02
	DefaultIdleAbandon         = 2 * time.Minute
	DefaultMaxBucketsPerStream = 10000
)

// Bounds on a report; anything outside them is malformed.
const (
	// MaxElapsed is the longest time_elapsed a usage report may claim.
	MaxElapsed = 24 * time.Hour
	// MaxCount bounds num_requests_allowed and num_requests_denied.
	MaxCount = 1 << 40
	// MaxValueBytes bounds each key and value of a bucket id.
	MaxValueBytes = 4096
	// MaxBucketBytes bounds a bucket id's keys and values together, so
	// that a stream's buckets hold at most its bucket cap times this.
	MaxBucketBytes = 2 * MaxValueBytes
)

// Errors a report can get, wrapped with the reason. server/ turns
// ErrInvalid into INVALID_ARGUMENT and ErrTooManyBuckets into
// RESOURCE_EXHAUSTED.
var (
	ErrInvalid        = errors.New("quota: invalid report")
	ErrTooManyBuckets = errors.New("quota: too many buckets on one stream")
)

// Options adjust a Service. The zero value means the defaults.
type Options struct {
	// Interval is how often Tick should run (Run's period): shares are
	// recomputed, and a reload re-assigned, within one interval.
	Interval time.Duration
	// TTL is the assignment_time_to_live sent with every assignment. An
	// assignment is re-sent before it expires (two intervals ahead).
	TTL time.Duration
	// Threshold: a share is pushed again only when it moves by more than
	// this fraction of the last one sent. 0 means DefaultThreshold; a
	// negative value pushes every change.
	Threshold float64
	// Reserve is the fraction of each limit not divided among the
	// proxies, from which a proxy that just appeared is answered at once.
	// 0 means DefaultReserve; a negative value keeps no reserve.
	Reserve float64
	// IdleAbandon: a bucket with no traffic reported for this long is
	// abandoned (the proxy is told to drop it).
	IdleAbandon time.Duration
	// MaxBucketsPerStream bounds the buckets of one stream; a report that
	// would go past it ends the stream with ErrTooManyBuckets.
	MaxBucketsPerStream int
	// FixedWindowAsTokenBucket assigns fixed-window rules a token bucket
	// (the share per unit, refilled evenly, holding a tenth of it, at least 10)
	// instead of requests_per_time_unit, which Envoy's filter does not
	// enforce yet (it lets every request through).
	FixedWindowAsTokenBucket bool
	// Fleet, if not nil, shares demand with the other replicas.
	Fleet Fleet
	// Logger receives Fleet failures. nil discards.
	Logger *slog.Logger
}

func (o *Options) defaults() {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.TTL < 3*o.Interval {
		o.TTL = 3 * o.Interval
	}
	if o.Threshold == 0 || math.IsNaN(o.Threshold) {
		o.Threshold = DefaultThreshold
	}
	if o.Reserve == 0 || math.IsNaN(o.Reserve) {
		o.Reserve = DefaultReserve
	}
	o.Reserve = min(o.Reserve, 0.5)
	if o.IdleAbandon <= 0 {
		o.IdleAbandon = DefaultIdleAbandon
	}
	if o.MaxBucketsPerStream <= 0 {
		o.MaxBucketsPerStream = DefaultMaxBucketsPerStream
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// reserve is the fraction held back, 0 when none.
func (o *Options) reserve() float64 { return max(o.Reserve, 0) }

// Tables gives the current limits table; config.Reloader is one.
type Tables interface{ Current() *config.Table }

// Fleet shares limits between the replicas of a deployment.
type Fleet interface {
	// Exchange publishes, for each group key, the demands of this
	// replica's proxies (requests per the rule's period) and claims this
	// replica's part of the group's capacity: atomically per group, the
	// sum of its proxies' max-min fair shares of the capacity given every
	// replica's demands, at most what the other replicas hold not. The
	// parts the replicas hold thus never sum above the capacity.
	Exchange(ctx context.Context, now time.Time, local map[string]Claim) (Remote, error)
}

// Claim is one replica's claim on one group.
type Claim struct {
	// Capacity is what the fleet divides: the limit less the reserve.
	Capacity float64
	// Max bounds the part claimed: a replica's first claim of a group
	// takes at most an equal part per live replica, since the replicas
	// that got the group at the same time have not published yet.
	Max float64
	// Demands are the demands of this replica's proxies.
	Demands []float64
}

// Remote is the outcome of one Exchange.
type Remote struct {
	// Granted is this replica's part of each group.
	Granted map[string]float64
	// Live is the number of replicas alive in the fleet, this one
	// included; 0 when unknown.
	Live int
}

// Usage is one bucket's report.
type Usage struct {
	Bucket  map[string]string
	Elapsed time.Duration
	Allowed uint64
	Denied  uint64
}

// Service assigns quota to the streams of one replica. Safe for concurrent
// use.
type Service struct {
	tables Tables
	o      Options

	mu      sync.Mutex
	table   *config.Table // the table buckets were matched against
	streams map[*Stream]struct{}
	groups  map[string]*group
	nsubs   int
	nextID  uint64
	remote  Remote    // the last successful Exchange's outcome
	remAt   time.Time // when remote was fetched
	// fleetSince is the first successful Exchange, fleetFrom the first
	// attempt (zero before either).
	fleetSince, fleetFrom time.Time
	fleetLast             time.Time  // the last Tick
	rules                 []RuleStat // as of the last Tick
	keyBuf                []byte

	reports, usages, rejected, fleetErrors atomic.Uint64
	pushed                                 [Abandon + 1]atomic.Uint64
}

// New returns a Service matching buckets against tables' current table.
func New(tables Tables, o Options) *Service {
	o.defaults()
	return &Service{tables: tables, o: o, streams: map[*Stream]struct{}{}, groups: map[string]*group{}}
}

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
	// limit, granted (the last one).
	claimed bool
	granted float64
}

// sub is one stream's subscription to one bucket.
type sub struct {
	st     *Stream
	key    string
	bucket map[string]string
	rule   *config.Rule // nil when unmatched
	g      *group       // nil when no limit is divided (see answer)
	// demand is requests per rule period in the last report; interval is
	// that report's elapsed time.
	demand    float64
	measured  bool // demand comes from a report after the first
	interval  time.Duration
	seen      time.Time // last report
	busy      time.Time // last report with traffic
	sent      Action
	sentShare uint64 // the share sent, requests per period
	sentAt    time.Time
	hasSent   bool
}

// Stream is one proxy's stream. Report and Close are called by the
// stream's receiver, Pending by its sender; both may run concurrently.
type Stream struct {
	s      *Service
	id     uint64 // in opening order
	domain string
	subs   map[string]*sub
	out    []Action
	outIdx map[string]int // bucket key → index in out
	notify chan struct{}
	closed bool
}

// Open starts a stream for domain, from the stream's first message.
func (s *Service) Open(domain string) (*Stream, error) {
	if domain == "" {
		s.rejected.Add(1)
		return nil, fmt.Errorf("%w: the first message has no domain", ErrInvalid)
	}
	if len(domain) > MaxValueBytes {
		s.rejected.Add(1)
		return nil, fmt.Errorf("%w: domain longer than %d bytes", ErrInvalid, MaxValueBytes)
	}
	s.mu.Lock()
	s.nextID++
	id := s.nextID
	s.mu.Unlock()
	st := &Stream{s: s, id: id, domain: domain, subs: map[string]*sub{}, outIdx: map[string]int{}, notify: make(chan struct{}, 1)}
	s.mu.Lock()
	s.streams[st] = struct{}{}
	s.mu.Unlock()
	return st, nil
}

// Domain is the stream's domain.
func (st *Stream) Domain() string { return st.domain }

// Notify receives a value when Pending has actions to send.
func (st *Stream) Notify() <-chan struct{} { return st.notify }

// Pending takes the actions queued for the stream, oldest bucket first.
func (st *Stream) Pending() []Action {
	st.s.mu.Lock()
	defer st.s.mu.Unlock()
	out := st.out
	st.out = nil
	clear(st.outIdx)
	return out
}

// Buckets is the number of buckets the stream is subscribed to.
func (st *Stream) Buckets() int {
	st.s.mu.Lock()
	defer st.s.mu.Unlock()
	return len(st.subs)
}

// Close releases the stream's buckets; their share goes to the others at
// the next Tick.
func (st *Stream) Close() {
	s := st.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return
	}
	st.closed = true
	for _, b := range st.subs {
		s.unsubscribe(b)
	}
	st.subs = nil
	delete(s.streams, st)
}

// Report applies one usage report at now. A new bucket subscribes the
// stream to it and is answered at once (see Pending). A malformed report
// changes nothing and returns an error wrapping ErrInvalid or
// ErrTooManyBuckets, after which the stream should end.
func (st *Stream) Report(now time.Time, usages []Usage) error {
	s := st.s
	s.reports.Add(1)
	// The usages' canonical keys, end to end in one buffer: looking a
	// key up allocates nothing, only a new bucket copies its key.
	var arena []byte
	ends := make([]int, len(usages))
	for i := range usages {
		u := &usages[i]
		if err := checkUsage(u); err != nil {
			s.rejected.Add(1)
			return fmt.Errorf("%w: bucket_quota_usages[%d]: %v", ErrInvalid, i, err)
		}
		arena = appendBucketKey(arena, u.Bucket)
		ends[i] = len(arena)
	}
	key := func(i int) []byte {
		if i == 0 {
			return arena[:ends[0]]
		}
		return arena[ends[i-1]:ends[i]]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.closed {
		return nil
	}
	added := 0
	for i := range usages {
		if st.subs[string(key(i))] == nil {
			added++
		}
	}
	if len(st.subs)+added > s.o.MaxBucketsPerStream {
		s.rejected.Add(1)
		return fmt.Errorf("%w: %d buckets, at most %d", ErrTooManyBuckets, len(st.subs)+added, s.o.MaxBucketsPerStream)
	}
	s.usages.Add(uint64(len(usages)))
	t := s.current()
	for i := range usages {
		u := &usages[i]
		b := st.subs[string(key(i))]
		if b == nil {
			b = &sub{st: st, key: string(key(i)), bucket: maps.Clone(u.Bucket), busy: now}
			st.subs[b.key] = b
			s.subscribe(t, b)
		}
		b.record(now, u)
		if !b.hasSent {
			s.answerNew(now, b)
		}
	}
	return nil
}

func checkUsage(u *Usage) error {
	switch {
	case len(u.Bucket) == 0:
		return errors.New("empty bucket_id")
	case u.Elapsed < 0 || u.Elapsed > MaxElapsed:
		return fmt.Errorf("time_elapsed %v outside [0, %v]", u.Elapsed, MaxElapsed)
	case u.Allowed > MaxCount || u.Denied > MaxCount:
		return fmt.Errorf("request counts %d allowed, %d denied: above %d", u.Allowed, u.Denied, uint64(MaxCount))
	}
	size := 0
	for k, v := range u.Bucket {
		if k == "" {
			return errors.New("bucket_id has an empty key")
		}
		if len(k) > MaxValueBytes || len(v) > MaxValueBytes {
			return fmt.Errorf("bucket_id key or value longer than %d bytes", MaxValueBytes)
		}
		size += len(k) + len(v)
	}
	if size > MaxBucketBytes {
		return fmt.Errorf("bucket_id of %d keys and %d bytes: above %d bytes", len(u.Bucket), size, MaxBucketBytes)
	}
	return nil
}

// appendBucketKey appends a bucket id in one canonical form: sorted keys,
// each key and value length-prefixed.
func appendBucketKey(b []byte, m map[string]string) []byte {
	var buf [config.MaxBucketKeys]string
	ks := buf[:0]
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		v := m[k]
		b = strconv.AppendInt(b, int64(len(k)), 10)
		b = append(b, ':')
		b = append(b, k...)
		b = strconv.AppendInt(b, int64(len(v)), 10)
		b = append(b, ':')
		b = append(b, v...)
	}
	return b
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
	if b.rule != nil && b.rule.Limit != nil {
		b.demand = float64(n) * float64(b.rule.Limit.Period()) / float64(el)
	}
	b.seen = now
	if n > 0 {
		b.busy = now
	}
}

// current returns the table to match against; s.mu is held.
func (s *Service) current() *config.Table {
	if s.table == nil {
		s.table = s.tables.Current()
	}
	return s.table
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
		g = &group{key: string(key), rule: r, subs: map[*sub]struct{}{}}
		s.groups[g.key] = g
	}
	g.subs[b] = struct{}{}
	b.g = g
}

// unsubscribe leaves b's group; s.mu is held.
func (s *Service) unsubscribe(b *sub) {
	s.nsubs--
	if g := b.g; g != nil {
		delete(g.subs, b)
		if len(g.subs) == 0 {
			delete(s.groups, g.key)
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
		s.pushed[b.sent.Kind].Add(1)
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
		// b.g.assigned counts all but this replica's part of the reserve
		// (see Tick): proxies joining on every replica at once still fit
		// in the limit.
		free = limit - b.g.assigned
	}
	free = max(free, 0)
	share := min(free/2, limit/float64(len(b.g.subs)))
	b.g.assigned += share
	b.sentShare = uint64(share)
	s.queue(now, b, assign(b.g.rule, b.sentShare, s.o.FixedWindowAsTokenBucket))
	s.pushed[b.sent.Kind].Add(1)
}

// queue sends a its TTL and queues it for b's stream; s.mu is held.
func (s *Service) queue(now time.Time, b *sub, a Action) {
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

// Run calls Tick every interval until ctx is done. With a Fleet, it first
// calls Tick at once, so that the replica is known to the others before
// its first interval ends.
// A failed exchange is logged at most once per fleetLogInterval, with the
// count of those not logged (all are in sluice_rlqs_fleet_errors_total): a
// Redis outage must not log a line every interval.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.o.Interval)
	defer t.Stop()
	var logged time.Time
	var quiet int
	tick := func(now time.Time) {
		err := s.Tick(ctx, now)
		if err == nil {
			return
		}
		if !logged.IsZero() && now.Sub(logged) < fleetLogInterval {
			quiet++
			return
		}
		s.o.Logger.Warn("rlqs: sharing demand with the fleet failed; dividing with the last known demand", "err", err, "failures_not_logged", quiet)
		logged, quiet = now, 0
	}
	if s.o.Fleet != nil {
		tick(time.Now())
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			tick(now)
		}
	}
}

// fleetLogInterval is the least time between two log lines of failed
// fleet exchanges.
const fleetLogInterval = time.Minute

// How a group is divided, by what this replica knows of the fleet.
const (
	// fleetAlone: no Fleet, or it has failed for longer than the TTL, or
	// this replica is the only live one: the limit is divided among this
	// replica's proxies.
	fleetAlone = iota
	// fleetUncertain: the group has not been claimed yet, or the fleet
	// has failed for long enough that the others ignore this replica's
	// claim, so other replicas may hold all of the limit but the reserve.
	// This replica divides only its cautious part (see cautious) among
	// its proxies.
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
	case s.fleetLast.Sub(s.remAt) > s.o.TTL:
		return fleetAlone
	case g.claimed && s.fleetLast.Sub(s.remAt) < staleAfter*s.o.Interval:
		return fleetShared
	case g.claimed:
		// The fleet has failed for staleAfter intervals: the others no
		// longer count this replica's part and may have taken it.
		return fleetUncertain
	case s.remAt.Sub(s.fleetSince) >= s.o.Interval && s.remote.Live == 1:
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
	return limit * s.o.reserve() / float64(max(s.remote.Live, 1))
}

// staleAfter is how many of a bucket's reporting intervals may pass
// without a report before its demand counts as 0.
const staleAfter = 3

// Tick re-matches every bucket if the table changed, abandons idle
// buckets, exchanges demand with the fleet, recomputes every group's
// shares and queues the assignments that changed by more than the
// threshold or near their TTL. The error is the Fleet's; shares are
// computed anyway, with the other replicas' last known demand (dropped
// once older than the TTL).
func (s *Service) Tick(ctx context.Context, now time.Time) error {
	s.mu.Lock()
	if t := s.tables.Current(); t != s.table {
		s.table = t
		// A limit's fleet demand stays known across the reload.
		claimed := make(map[string]float64, len(s.groups))
		for k, g := range s.groups {
			if g.claimed {
				claimed[k] = g.granted
			}
		}
		for st := range s.streams {
			for _, b := range st.subs {
				s.unsubscribe(b)
				s.subscribe(t, b)
				b.hasSent = false // re-assigned below, whatever changed
			}
		}
		for k, g := range s.groups {
			g.granted, g.claimed = claimed[k]
		}
	}
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
	local := make(map[string]Claim, len(s.groups))
	published := make([]*group, 0, len(s.groups))
	for k, g := range s.groups {
		ds := make([]float64, 0, len(g.subs))
		for b := range g.subs {
			ds = append(ds, b.currentDemand(now, s.o.Interval))
		}
		c := float64(g.rule.Limit.Limit()) * (1 - s.o.reserve())
		m := c
		if !g.claimed {
			m /= float64(max(s.remote.Live, 1))
		}
		local[k] = Claim{Capacity: c, Max: m, Demands: ds}
		published = append(published, g)
	}
	fleet := s.o.Fleet
	if fleet != nil && s.fleetFrom.IsZero() {
		s.fleetFrom = now
	}
	s.mu.Unlock()

	var err error
	var remote Remote
	if fleet != nil {
		// An exchange may take at most one interval: a slow Redis must not
		// stall the division.
		fctx, cancel := context.WithTimeout(ctx, s.o.Interval)
		remote, err = fleet.Exchange(fctx, now, local)
		cancel()
		if err != nil {
			s.fleetErrors.Add(1)
		}
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if fleet != nil {
		s.fleetLast = now
		if err == nil {
			s.remote, s.remAt = remote, now
			if s.fleetSince.IsZero() {
				s.fleetSince = now
			}
			// Groups made during the exchange were not in it.
			for _, g := range published {
				if v, ok := remote.Granted[g.key]; ok {
					g.claimed, g.granted = true, v
				}
			}
		} else if now.Sub(s.remAt) > s.o.TTL {
			s.remote = Remote{}
		}
	}
	var demands, shares []float64
	var whole []uint64
	stats := map[*config.Rule]*RuleStat{}
	for _, g := range s.groups {
		// In a stable order, so that the units rounding hands out go to
		// the same proxies every interval.
		subs := make([]*sub, 0, len(g.subs))
		for b := range g.subs {
			subs = append(subs, b)
		}
		slices.SortFunc(subs, func(x, y *sub) int {
			if c := cmp.Compare(x.st.id, y.st.id); c != 0 {
				return c
			}
			return strings.Compare(x.key, y.key)
		})
		demands = demands[:0]
		for _, b := range subs {
			demands = append(demands, b.currentDemand(now, s.o.Interval))
		}
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
		shares = grow(shares, len(demands))
		whole = growU(whole, len(subs))
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
	for st := range s.streams {
		for _, b := range st.subs {
			if b.rule != nil {
				statStream(stats, st, b)
			}
			if b.g != nil {
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
	return err
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

// currentDemand is b's last reported demand, infinite (an equal share)
// after only its first report, or 0 once its reports have stopped for
// staleAfter of its intervals.
func (b *sub) currentDemand(now time.Time, interval time.Duration) float64 {
	switch {
	case now.Sub(b.seen) > staleAfter*max(b.interval, interval):
		return 0
	case !b.measured:
		return math.Inf(1)
	}
	return b.demand
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
