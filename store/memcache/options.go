package memcache

import (
	"crypto/tls"
	"log/slog"
	"net"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Default values of Options' zero fields.
const (
	DefaultTimeout         = 500 * time.Millisecond
	DefaultMaxIdleConns    = 64
	DefaultCASAttempts     = 64
	DefaultProbeInterval   = time.Second
	DefaultConnectRetry    = 100 * time.Millisecond
	DefaultConnectRetryMax = 5 * time.Second
	defaultExpiryGraceSec  = 5
)

// Options configure a Store. The zero value of every field means its
// default; Servers or SRV is needed.
type Options struct {
	// Servers are memcached addresses, host:port (or a Unix socket's
	// path). Keys are spread over them by rendezvous hashing.
	Servers []string
	// SRV is a DNS SRV name, _service._proto.name, whose targets are the
	// servers, instead of Servers (envoyproxy/ratelimit's MEMCACHE_SRV).
	SRV string
	// SRVRefresh, when positive, makes Run resolve SRV again at this
	// interval; zero resolves it once, in New (or, if it does not resolve
	// yet, in Run until it does).
	SRVRefresh time.Duration
	// Resolver looks up SRV and the servers' host names; nil is
	// net.DefaultResolver.
	Resolver *net.Resolver
	// TLS, if not nil, encrypts every connection.
	TLS *tls.Config
	// Timeout bounds each round trip to memcached, dialling included
	// (default DefaultTimeout). The client library takes no context: a
	// Take whose ctx can end runs in a goroutine of its own and returns
	// when ctx ends; the work checks ctx between round trips and stops at
	// the next one. MaxIdleConns such Takes left running fail new ones at
	// once.
	Timeout time.Duration
	// MaxIdleConns is the idle connections kept per server (default
	// DefaultMaxIdleConns). Each call in flight holds one connection (the
	// library does not pipeline), and one above this bound is closed
	// after its call: under concurrent load a low bound dials per call.
	MaxIdleConns int
	// KeyPrefix is put before every key.
	KeyPrefix string
	// ModuloServers places each key on a server as envoyproxy/ratelimit's
	// memcached client does (gomemcache's ServerList: the CRC-32 of the
	// key modulo the number of servers, in the order given), instead of
	// by rendezvous hashing, so that with several servers its pods and
	// this store find a key on the same server (docs/MIGRATION.md). Adding
	// or removing a server then moves most keys.
	ModuloServers bool
	// PlainJitterMax adds a random 0 to PlainJitterMax-1 seconds to the
	// expiry of each key in envoyproxy/ratelimit's layout (store.Hit.Plain,
	// store.PlainKeys), as its EXPIRATION_JITTER_MAX_SECONDS does.
	PlainJitterMax int64
	// Clock, when set, is read when a denied batch rolls back what it
	// took (as memory.Options.Clock). Nil rolls back as of the batch's now.
	Clock store.Clock
	// CASAttempts bounds the gets/cas round trips of one hit on a token
	// bucket or sliding window under contention (default
	// DefaultCASAttempts); past it the Take fails.
	CASAttempts int
	// ProbeInterval is how often Run pings every server for Healthy
	// (default DefaultProbeInterval).
	ProbeInterval time.Duration
	// ConnectRetry is the wait before Run pings again servers that Connect
	// could not reach (default DefaultConnectRetry); each later attempt
	// waits twice as long, at most ConnectRetryMax (default
	// DefaultConnectRetryMax).
	ConnectRetry, ConnectRetryMax time.Duration
	// Logger receives the store's warnings (SRV lookups that failed,
	// health transitions); nil discards them.
	Logger *slog.Logger
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = DefaultMaxIdleConns
	}
	if o.CASAttempts <= 0 {
		o.CASAttempts = DefaultCASAttempts
	}
	if o.ProbeInterval <= 0 {
		o.ProbeInterval = DefaultProbeInterval
	}
	if o.ConnectRetry <= 0 {
		o.ConnectRetry = DefaultConnectRetry
	}
	if o.ConnectRetryMax <= 0 {
		o.ConnectRetryMax = DefaultConnectRetryMax
	}
	o.ConnectRetryMax = max(o.ConnectRetryMax, o.ConnectRetry)
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}
