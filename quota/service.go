package quota

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
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
	DefaultMaxStreams          = 5000
	DefaultMaxBuckets          = 200000
	DefaultMaxClaims           = 1000
	// DefaultDemandWindow and DefaultOvercommit follow demand that moves
	// between proxies faster than they report (see Divider.Shares); a
	// window of 1 and an overcommit of 1 divide by the last report only,
	// never above the limit, as before they existed.
	DefaultDemandWindow = 4
	DefaultOvercommit   = 4
)

// MaxDemandWindow bounds Options.DemandWindow (each bucket keeps that many
// demands).
const MaxDemandWindow = 64

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

// MaxBucketsPerStream is Options.MaxBucketsPerStream (its default when
// unset).
func (s *Service) MaxBucketsPerStream() int { return s.o.MaxBucketsPerStream }

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
	// DemandWindow is how many of a bucket's last reports make its
	// history: a limit is divided by what each proxy is expected to use
	// of a share, over its history (see Divider.Shares). 0 means
	// DefaultDemandWindow; 1 divides by the last report only. At most
	// MaxDemandWindow.
	DemandWindow int
	// Overcommit bounds how far the shares of a limit may sum above what
	// is divided (the limit less the reserve, or this replica's part of
	// it), so that what some proxies leave unused of their shares, as
	// their histories show, goes to others: a group whose proxies'
	// demand moves between them faster than they report admits its
	// limit, not only what the proxies of the last report wanted. If all
	// the proxies use their shares at once, the group admits up to this
	// many times the limit a second until their reports show it. Above 1,
	// what is divided is also corrected by how far the proxies' reports
	// strayed from their expected usages, and the shares scaled down when
	// the reports admitted more than the limit (see correct). 0 means
	// DefaultOvercommit; 1: never above the limit.
	Overcommit float64
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
	if o.DemandWindow <= 0 {
		o.DemandWindow = DefaultDemandWindow
	}
	o.DemandWindow = min(o.DemandWindow, MaxDemandWindow)
	if o.Overcommit == 0 || math.IsNaN(o.Overcommit) {
		o.Overcommit = DefaultOvercommit
	}
	o.Overcommit = max(o.Overcommit, 1)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// reserve is the fraction held back, 0 when none.
func (o *Options) reserve() float64 { return max(o.Reserve, 0) }

// Tables gives the current limits table; config.Reloader is one.
type Tables interface{ Current() *config.Table }

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

// refuse counts a stream or report refused at cap c.
// Refused counts a report refused at cap c before it reached a stream
// (an adapter that counts a report's usages or keys before decoding it).
func (s *Service) Refused(c Cap) { s.refuse(c) }

func (s *Service) refuse(c Cap) {
	s.rejected.Add(1)
	s.capped[c].Add(1)
}
