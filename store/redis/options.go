package redis

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Options configure a Store. The zero value of every field means its
// default; at least one of URL, SentinelAddrs or ClusterAddrs is needed.
type Options struct {
	// URL addresses a single Redis: redis://[user:password@]host:port[/db],
	// rediss:// for TLS, unix:///path/to/redis.sock[?db=N].
	URL string
	// SentinelMaster and SentinelAddrs select the master that these
	// sentinels monitor instead of URL.
	SentinelMaster string
	SentinelAddrs  []string
	// ClusterAddrs are seed nodes of a Redis Cluster, instead of URL.
	ClusterAddrs []string
	// Username and Password authenticate to Redis (they override the
	// URL's). Sentinels are asked with the same credentials, unless
	// SentinelPassword is set.
	Username, Password string
	SentinelPassword   string
	// TLS, if not nil, encrypts every connection (client certificate, CA,
	// server name). A rediss:// URL without TLS uses the system roots.
	TLS *tls.Config

	// Timeout is the ceiling of a Take's time in Redis, queueing for a
	// combined call included, and the deadline of a Take whose ctx has
	// none (default 1 s). A Take whose ctx has a deadline (a gRPC caller's
	// grpc-timeout: Envoy sends its filter's 20 ms) stops earlier, leaving
	// a tenth of the time left, at most MaxAnswerMargin, to answer.
	// A dead Redis is found by the breaker and the probe, not by this.
	Timeout time.Duration
	// PipelineWindow, when positive, makes each connection wait up to this
	// long after writing to Redis before it writes again, while other
	// calls are in flight, so that more commands share one write, for up
	// to this much latency per call (rueidis's MaxFlushDelay; zero writes
	// at once). Concurrent Takes already share script calls (see
	// combiner): on the load benchmark zero is fastest.
	PipelineWindow time.Duration
	// KeyPrefix is put before every key (e.g. "sluice:").
	KeyPrefix string
	// PlainJitterMax adds a random 0 to PlainJitterMax-1 seconds to the
	// expiry of each key in envoyproxy/ratelimit's layout (store.Hit.Plain,
	// store.PlainKeys), as its EXPIRATION_JITTER_MAX_SECONDS does.
	PlainJitterMax int64
	// ServerClock makes token buckets read the time from Redis TIME
	// instead of the now passed to Take, so that instances with skewed
	// clocks agree. Fixed windows always use the caller's now.
	ServerClock bool
	// OnCall, when set, is told the duration and the outcome of every
	// Take that went to Redis (a script call, or one per slot on Cluster,
	// or a pipeline of INCRBYs; the time queued for a combined call
	// included), for a latency metric. It must be cheap and safe for
	// concurrent use.
	OnCall func(d time.Duration, err error)
	// RefundTimeout bounds a Cluster refund's wait for Redis, after the
	// caller's deadline if need be, and at most Timeout (default 50 ms). A
	// refund that fails leaves the denied batch's hits counted: fewer
	// grants, never more (Stats.RefundFailures counts them).
	RefundTimeout time.Duration
	// Clock, when set, is read when a Cluster batch refunds the slots that
	// committed, so that a token bucket gets back only what its take still
	// owes then (see store.Refund). Pass the clock the callers read their
	// now from; nil refunds as of the batch's now.
	Clock store.Clock
	// NoLocalCache turns off the local cache of keys known to be over
	// their limit.
	NoLocalCache bool

	// BreakerFailures consecutive failures open the circuit breaker
	// (default 3) if no call succeeded for BreakerWindow (default 250 ms,
	// so that a stall of this process, which times out every call in
	// flight at once, does not): calls then fail at once until a probe
	// succeeds.
	BreakerFailures int
	BreakerWindow   time.Duration
	// BreakerCooldown is how long the breaker stays open before it lets
	// one call through as a probe (default 100 ms).
	BreakerCooldown time.Duration
	// ProbeInterval is how often Run pings Redis while the breaker is
	// closed, for health (default 1 s), and at once after a Take ran out
	// of time. While open, Run pings every BreakerCooldown.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a probe waits for PONG (default 500 ms),
	// and New's first ping, when longer than Timeout.
	// Two probes in a row without PONG open the breaker, the second sent
	// as soon as the first failed: a starved or throttled process (or a
	// frozen machine) can miss one deadline with Redis up, not a second
	// one sent once it runs again.
	ProbeTimeout time.Duration

	// ConnectRetry is the wait before New's connection is tried again when
	// Redis could not be reached (default 100 ms); each later attempt
	// waits twice as long as the one before, at most ConnectRetryMax
	// (default 5 s). ConnectMaxWait, when positive, makes Run fail once
	// it has passed since New without Redis answering; zero waits for
	// ever (as the reference's REDIS_STARTUP_MAX_ELAPSED_TIME of 0).
	ConnectRetry, ConnectRetryMax time.Duration
	ConnectMaxWait                time.Duration

	// Logger, when set, gets one WARN line when Redis becomes unreachable
	// (the breaker opens) and one INFO line when it is back, from Run, at
	// most one outage per LogInterval (default 10 s); outages in between
	// are counted in the next line.
	Logger      *slog.Logger
	LogInterval time.Duration
	// FailureMode names, in those lines, how requests are answered while
	// Redis is unreachable (the limiter's failure mode: error, allow or
	// deny).
	FailureMode string
}

// Defaults of Options.ConnectRetry and ConnectRetryMax: attempts at
// 0.1, 0.3, 0.7, 1.5 and 3.1 s, then every 5 s, so a Redis that comes up
// is found within about as long as was already waited, at most 5 s after
// it comes up (a Redis up after 1 s is found at 1.5 s).
const (
	DefaultConnectRetry    = 100 * time.Millisecond
	DefaultConnectRetryMax = 5 * time.Second
)

// MaxAnswerMargin bounds the time a Take leaves its caller to answer
// before the caller's deadline: a tenth of the time left, at most this.
const MaxAnswerMargin = 5 * time.Millisecond

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.RefundTimeout <= 0 {
		o.RefundTimeout = 50 * time.Millisecond
	}
	if o.BreakerFailures <= 0 {
		o.BreakerFailures = 3
	}
	if o.BreakerWindow <= 0 {
		o.BreakerWindow = 250 * time.Millisecond
	}
	if o.BreakerCooldown <= 0 {
		o.BreakerCooldown = 100 * time.Millisecond
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = time.Second
	}
	if o.ProbeTimeout <= 0 {
		o.ProbeTimeout = 500 * time.Millisecond
	}
	if o.ConnectRetry <= 0 {
		o.ConnectRetry = DefaultConnectRetry
	}
	if o.ConnectRetryMax <= 0 {
		o.ConnectRetryMax = DefaultConnectRetryMax
	}
	o.ConnectRetryMax = max(o.ConnectRetryMax, o.ConnectRetry)
	if o.LogInterval <= 0 {
		o.LogInterval = 10 * time.Second
	}
	return o
}
