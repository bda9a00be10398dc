package quota

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store"
)

// Defaults of Options.
const (
	DefaultInterval            = time.Second
	DefaultTTL                 = 10 * time.Second
	DefaultThreshold           = 0.05
	DefaultReserve             = 0.02
	DefaultIdleAbandon         = 2 * time.Minute
	DefaultMaxBucketsPerStream = 10000
	DefaultMaxStreams          = 5000
	DefaultMaxBuckets          = 200000
	DefaultMaxClaims           = 1000
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

// Errors Open and Report return, wrapped with the reason. server/ turns
// ErrInvalid into INVALID_ARGUMENT and ErrExhausted, which every cap's
// error wraps, into RESOURCE_EXHAUSTED.
var (
	ErrInvalid   = errors.New("quota: invalid report")
	ErrExhausted = errors.New("quota: resource exhausted")

	ErrTooManyStreams        = fmt.Errorf("%w: too many streams on this replica", ErrExhausted)
	ErrTooManyBuckets        = fmt.Errorf("%w: too many buckets on one stream", ErrExhausted)
	ErrTooManyReplicaBuckets = fmt.Errorf("%w: too many buckets on this replica", ErrExhausted)
	ErrTooManyKeys           = fmt.Errorf("%w: a bucket id with more keys than a rule can match", ErrExhausted)
)

// Cap is one of the bounds on what streams may hold; Stats.Capped counts
// the streams and reports refused at each.
type Cap uint8

// The caps, each ending the stream that goes past it with an error
// wrapping ErrExhausted.
const (
	// CapStreams is Options.MaxStreams: Open fails.
	CapStreams Cap = iota
	// CapBuckets is Options.MaxBuckets, over all streams.
	CapBuckets
	// CapStreamBuckets is Options.MaxBucketsPerStream.
	CapStreamBuckets
	// CapBucketKeys is config.MaxBucketKeys: no rule matches a bucket id
	// with more keys.
	CapBucketKeys
)

// String names the cap for metrics.
func (c Cap) String() string {
	switch c {
	case CapStreams:
		return "streams"
	case CapBuckets:
		return "buckets"
	case CapStreamBuckets:
		return "stream_buckets"
	case CapBucketKeys:
		return "bucket_keys"
	}
	return "unknown"
}

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
	// MaxStreams bounds the open streams: Open fails past it with
	// ErrTooManyStreams.
	MaxStreams int
	// MaxBuckets bounds the buckets of all streams together (each stream's
	// subscriptions, matched or not); a report that would go past it ends
	// its stream with ErrTooManyReplicaBuckets.
	MaxBuckets int
	// MaxClaims bounds the groups (limits) claimed from the Fleet in one
	// interval, and so the Fleet's work, however many buckets clients
	// invent. Past it, a group whose proxies want no more than what this
	// replica may give them unclaimed is not claimed, and of the others
	// the groups of the streams with the fewest buckets are claimed
	// first, then in turn (see Tick).
	MaxClaims int
	// FixedWindowAsTokenBucket assigns fixed-window rules a token bucket
	// (the share per unit, refilled evenly, holding a tenth of it, at least 10)
	// instead of requests_per_time_unit, which Envoy's filter does not
	// enforce yet (it lets every request through).
	FixedWindowAsTokenBucket bool
	// Fleet, if not nil, shares demand with the other replicas.
	Fleet Fleet
	// Logger receives Fleet failures and the panics Run recovers. nil
	// discards.
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
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = DefaultMaxBuckets
	}
	if o.MaxClaims <= 0 {
		o.MaxClaims = DefaultMaxClaims
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// reserve is the fraction held back, 0 when none.
func (o *Options) reserve() float64 { return max(o.Reserve, 0) }

// Tables gives the current limits table; config.Reloader is one.
type Tables interface{ Current() *config.Table }

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
	table   *config.Table // the table buckets were matched against; nil before the first
	streams map[*Stream]struct{}
	groups  map[string]*group
	nsubs   int
	nextID  uint64
	// released are groups gone since the last Exchange that this replica
	// had claimed a part of, to give back (at most MaxClaims).
	released []string
	live     int       // the live replicas, as of the last Exchange that read them; 0 unknown
	fleetOK  time.Time // the last Exchange in which anything succeeded
	// fleetSince is the first Exchange in which anything succeeded,
	// fleetFrom the first attempt (zero before either).
	fleetSince, fleetFrom time.Time
	fleetLast             time.Time  // the last Tick
	rules                 []RuleStat // as of the last Tick
	keyBuf                []byte

	reports, usages, rejected, fleetErrors atomic.Uint64
	claimErrors, claimsDeferred, panics    atomic.Uint64
	pushed                                 [Abandon + 1]atomic.Uint64
	capped                                 [CapBucketKeys + 1]atomic.Uint64
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
	// limit, granted (the last one), at claimedAt.
	claimed   bool
	granted   float64
	claimedAt time.Time
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
	domain string // from the first report; written with s.mu held
	subs   map[string]*sub
	out    []Action
	outIdx map[string]int // bucket key → index in out
	notify chan struct{}
	closed bool
}

// Open starts a stream. It counts against MaxStreams until Close, from
// before its first message: a stream that sends nothing holds a place
// too.
func (s *Service) Open() (*Stream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.streams) >= s.o.MaxStreams {
		s.refuse(CapStreams)
		return nil, fmt.Errorf("%w: %d open, at most %d", ErrTooManyStreams, len(s.streams), s.o.MaxStreams)
	}
	s.nextID++
	st := &Stream{s: s, id: s.nextID, subs: map[string]*sub{}, outIdx: map[string]int{}, notify: make(chan struct{}, 1)}
	s.streams[st] = struct{}{}
	return st, nil
}

// refuse counts a stream or report refused at cap c.
func (s *Service) refuse(c Cap) {
	s.rejected.Add(1)
	s.capped[c].Add(1)
}

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

// Report applies one message's usage reports at now. domain is the
// message's: the stream's first message names it, later ones repeat it or
// leave it empty. A new bucket subscribes the stream to it and is
// answered at once (see Pending), once a limits table is in force: before
// the first one no bucket is answered, so that Envoy applies its
// no_assignment_behavior. A malformed report changes nothing and returns
// an error wrapping ErrInvalid, one past a cap an error wrapping
// ErrExhausted; the stream should then end.
func (st *Stream) Report(now time.Time, domain string, usages []Usage) error {
	s := st.s
	s.reports.Add(1)
	if err := st.checkDomain(domain); err != nil {
		s.rejected.Add(1)
		return err
	}
	// The usages' canonical keys, end to end in one buffer: looking a
	// key up allocates nothing, only a new bucket copies its key.
	var arena []byte
	ends := make([]int, len(usages))
	for i := range usages {
		u := &usages[i]
		if kind, err := checkUsage(u); err != nil {
			if kind == ErrTooManyKeys {
				s.refuse(CapBucketKeys)
			} else {
				s.rejected.Add(1)
			}
			return fmt.Errorf("%w: bucket_quota_usages[%d]: %v", kind, i, err)
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
	if err := st.admit(len(usages), key); err != nil {
		return err
	}
	st.domain = cmp.Or(st.domain, domain)
	s.usages.Add(uint64(len(usages)))
	t := s.current()
	for i := range usages {
		u := &usages[i]
		b := st.subs[string(key(i))]
		if b == nil {
			b = &sub{st: st, key: string(key(i)), busy: now}
			b.bucket = parseBucketKey(b.key, len(u.Bucket))
			st.subs[b.key] = b
			s.subscribe(t, b)
		}
		b.record(now, u)
		if !b.hasSent && t != nil {
			s.answerNew(now, b)
		}
	}
	return nil
}

// checkDomain checks a message's domain against the stream's.
func (st *Stream) checkDomain(domain string) error {
	switch {
	case st.domain == "" && domain == "":
		return fmt.Errorf("%w: the first message has no domain", ErrInvalid)
	case len(domain) > MaxValueBytes:
		return fmt.Errorf("%w: domain longer than %d bytes", ErrInvalid, MaxValueBytes)
	case st.domain != "" && domain != "" && domain != st.domain:
		return fmt.Errorf("%w: domain changed from %s to %s", ErrInvalid, quoteDomain(st.domain), quoteDomain(domain))
	}
	return nil
}

func quoteDomain(d string) string {
	if len(d) > 64 {
		d = d[:64] + "..."
	}
	return strconv.Quote(d)
}

// admit checks that n usages whose keys key gives fit in the stream's
// and the replica's bucket caps; s.mu is held.
func (st *Stream) admit(n int, key func(int) []byte) error {
	s := st.s
	added := 0
	for i := range n {
		if st.subs[string(key(i))] == nil {
			added++
		}
	}
	if len(st.subs)+added > s.o.MaxBucketsPerStream {
		s.refuse(CapStreamBuckets)
		return fmt.Errorf("%w: %d buckets, at most %d", ErrTooManyBuckets, len(st.subs)+added, s.o.MaxBucketsPerStream)
	}
	if s.nsubs+added > s.o.MaxBuckets {
		s.refuse(CapBuckets)
		return fmt.Errorf("%w: %d buckets with this report's %d new ones, at most %d", ErrTooManyReplicaBuckets, s.nsubs+added, added, s.o.MaxBuckets)
	}
	return nil
}

// checkUsage returns what is wrong with u, if anything, and the error
// it is a case of (ErrInvalid or ErrTooManyKeys).
func checkUsage(u *Usage) (kind, err error) {
	switch {
	case len(u.Bucket) == 0:
		return ErrInvalid, errors.New("empty bucket_id")
	case len(u.Bucket) > config.MaxBucketKeys:
		return ErrTooManyKeys, fmt.Errorf("bucket_id of %d keys, at most %d", len(u.Bucket), config.MaxBucketKeys)
	case u.Elapsed < 0 || u.Elapsed > MaxElapsed:
		return ErrInvalid, fmt.Errorf("time_elapsed %v outside [0, %v]", u.Elapsed, MaxElapsed)
	case u.Allowed > MaxCount || u.Denied > MaxCount:
		return ErrInvalid, fmt.Errorf("request counts %d allowed, %d denied: above %d", u.Allowed, u.Denied, uint64(MaxCount))
	}
	size := 0
	for k, v := range u.Bucket {
		if k == "" {
			return ErrInvalid, errors.New("bucket_id has an empty key")
		}
		if len(k) > MaxValueBytes || len(v) > MaxValueBytes {
			return ErrInvalid, fmt.Errorf("bucket_id key or value longer than %d bytes", MaxValueBytes)
		}
		size += len(k) + len(v)
	}
	if size > MaxBucketBytes {
		return ErrInvalid, fmt.Errorf("bucket_id of %d keys and %d bytes: above %d bytes", len(u.Bucket), size, MaxBucketBytes)
	}
	return nil, nil
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

// parseBucketKey returns the bucket id of n keys that appendBucketKey
// wrote as key: its keys and values are substrings of key, so that a
// bucket holds its bytes once.
func parseBucketKey(key string, n int) map[string]string {
	m := make(map[string]string, n)
	next := func() string {
		i := strings.IndexByte(key, ':')
		l, _ := strconv.Atoi(key[:i])
		v := key[i+1 : i+1+l]
		key = key[i+1+l:]
		return v
	}
	for key != "" {
		k := next()
		m[k] = next()
	}
	return m
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
		g = &group{key: string(key), rule: r, subs: map[*sub]struct{}{}}
		s.groups[g.key] = g
	}
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

// staleAfter is how many of a bucket's reporting intervals may pass
// without a report before its demand counts as 0.
const staleAfter = 3

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
