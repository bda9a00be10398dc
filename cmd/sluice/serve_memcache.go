package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache"
)

// The memcache backend: counters in memcached (several servers, or an
// SRV name), shared by every replica, as envoyproxy/ratelimit's
// BACKEND_TYPE=memcache. docs/MEMCACHED.md says where it is weaker than
// Redis.
func init() {
	registerBackend(backend{name: "memcache", waits: true, shared: true, newConfig: newMemcacheConfig, refVars: memcacheRefVars})
}

// memcacheConfig is one serve invocation's settings of the memcache
// backend.
type memcacheConfig struct {
	servers      string
	srv          string
	srvRefresh   time.Duration
	srvResolver  string
	maxIdleConns int
	timeout      time.Duration
	keyPrefix    string
	jitter       time.Duration
	modulo       bool
	health       bool
	tls          storeTLSFlags
}

func newMemcacheConfig(fs *flag.FlagSet) storeConfig {
	c := &memcacheConfig{}
	fs.StringVar(&c.servers, "memcache-servers", "", "memcache store: comma-separated memcached `addresses` (host:port), keys spread by rendezvous hashing")
	fs.StringVar(&c.srv, "memcache-srv", "", "memcache store: DNS SRV `name` (_service._proto.name) whose targets are the servers, instead of --memcache-servers")
	fs.DurationVar(&c.srvRefresh, "memcache-srv-refresh", 0, "memcache store: resolve --memcache-srv again at this interval (0: once, at startup)")
	fs.StringVar(&c.srvResolver, "memcache-srv-resolver", "", "memcache store: DNS server `host:port` to resolve --memcache-srv and its targets with (default: the system's resolver)")
	fs.IntVar(&c.maxIdleConns, "memcache-max-idle-conns", memcache.DefaultMaxIdleConns, "memcache store: idle connections kept per server (each call in flight holds one)")
	fs.DurationVar(&c.timeout, "memcache-timeout", memcache.DefaultTimeout, "memcache store: most time one round trip to memcached may take, dialling included")
	fs.StringVar(&c.keyPrefix, "memcache-key-prefix", "", "memcache store: prefix of every memcached key")
	fs.DurationVar(&c.jitter, "memcache-expiry-jitter", 0, "memcache store: with --key-format reference, a key in the reference's format expires up to this much later, at random, in whole seconds (EXPIRATION_JITTER_MAX_SECONDS)")
	fs.BoolVar(&c.modulo, "memcache-modulo", false, "memcache store: place each key on a server as envoyproxy/ratelimit does (CRC-32 of the key modulo the servers, in the order given) instead of by rendezvous hashing, so that its pods and Sluice's share keys on several servers (docs/MIGRATION.md); adding or removing a server then moves most keys")
	fs.BoolVar(&c.health, "memcache-health", false, "memcache store: report NOT_SERVING while a memcached server is unreachable")
	c.tls.register(fs, "memcache", "memcache store: ", "memcached", "the other --memcache-tls-* flags")
	return c
}

func (c *memcacheConfig) options() (memcache.Options, error) {
	o := memcache.Options{Servers: splitList(c.servers), SRV: c.srv, SRVRefresh: c.srvRefresh,
		MaxIdleConns: c.maxIdleConns, Timeout: c.timeout, KeyPrefix: c.keyPrefix, PlainJitterMax: int64(c.jitter / time.Second),
		ModuloServers: c.modulo}
	if err := checkJitter("--memcache-expiry-jitter", c.jitter); err != nil {
		return o, err
	}
	switch {
	case len(o.Servers) == 0 && o.SRV == "":
		return o, errors.New("memcache store: give --memcache-servers or --memcache-srv")
	case len(o.Servers) > 0 && o.SRV != "":
		return o, errors.New("memcache store: give --memcache-servers or --memcache-srv, not both")
	case c.timeout <= 0:
		return o, errors.New("--memcache-timeout must be positive")
	case c.maxIdleConns < 1:
		return o, errors.New("--memcache-max-idle-conns must be positive")
	case c.srvRefresh < 0:
		return o, errors.New("--memcache-srv-refresh must not be negative")
	}
	if c.srvResolver != "" {
		if _, _, err := net.SplitHostPort(c.srvResolver); err != nil {
			return o, fmt.Errorf("--memcache-srv-resolver %q: want host:port", c.srvResolver)
		}
		addr := c.srvResolver
		o.Resolver = &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
	}
	tc, err := c.tls.config()
	if err != nil {
		return o, err
	}
	o.TLS = tc
	return o, nil
}

func (c *memcacheConfig) open(ctx context.Context, logger *slog.Logger, clock store.Clock) (openStore, error) {
	opt, err := c.options()
	if err != nil {
		return openStore{}, err
	}
	opt.Clock, opt.Logger = clock, logger
	c.tls.warn(logger, "memcache store", "memcached")
	st, err := memcache.New(ctx, opt)
	if err != nil {
		return openStore{}, err
	}
	if err := st.Connect(); err != nil {
		st.Close()
		return openStore{}, err
	}
	logger.Info("memcache store", "servers", st.Stats().Servers, "srv", opt.SRV, "srv_refresh", opt.SRVRefresh,
		"timeout", opt.Timeout, "max_idle_conns", opt.MaxIdleConns, "tls", opt.TLS != nil, "key_prefix", opt.KeyPrefix)
	setup := func(x *serveContext) error {
		if err := registerMemcacheMetrics(x.Registry, st); err != nil {
			return err
		}
		// Until every server first answers (one may not be up yet at
		// startup), health says NOT_SERVING, --memcache-health or not.
		readyOnceUp(x, st.Connected())
		if c.health {
			x.Ready = append(x.Ready, st.Healthy)
			x.Run = append(x.Run, func(ctx context.Context) error {
				return followHealth(ctx, st, x, 50*time.Millisecond)
			})
		}
		return nil
	}
	return openStore{Store: st, closer: st, run: st.Run, setup: setup}, nil
}

func registerMemcacheMetrics(reg prometheus.Registerer, st *memcache.Store) error {
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "memcache", Name: name, Help: help}
	}
	counter := func(name, help string, v func(memcache.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts(opts(name, help)), func() float64 { return float64(v(st.Stats())) })
	}
	return errors.Join(
		reg.Register(prometheus.NewGaugeFunc(opts("up", "1 while the last probe reached every memcached server, else 0."), func() float64 {
			if st.Healthy() {
				return 1
			}
			return 0
		})),
		reg.Register(prometheus.NewGaugeFunc(opts("servers", "memcached servers keys are spread over."),
			func() float64 { return float64(len(st.Stats().Servers)) })),
		reg.Register(counter("cas_retries_total", "gets/cas round trips of token buckets and sliding windows lost to a concurrent writer.",
			func(s memcache.Stats) uint64 { return s.CASRetries })),
		reg.Register(counter("cas_exhausted_total", "Hits that ran out of CAS attempts (their request failed).",
			func(s memcache.Stats) uint64 { return s.CASExhausted })),
		reg.Register(counter("rollback_failures_total", "Takes of a denied request that could not be given back: counted until their window or bucket lets them go (over-deny).",
			func(s memcache.Stats) uint64 { return s.RollbackFailures })),
	)
}

// memcacheRefVars are envoyproxy/ratelimit's memcached variables, read
// with BACKEND_TYPE=memcache.
var memcacheRefVars = []refVar{
	{name: "MEMCACHE_HOST_PORT", when: onMemcache, unmet: onMemcacheUnmet, flag: "memcache-servers",
		conv: refConv{doc: "a comma-separated list of host:port", fn: func(_ *refEnv, v string) (string, error) {
			return strings.Join(splitList(v), ","), nil
		}}},
	{name: "MEMCACHE_MAX_IDLE_CONNS", when: onMemcache, unmet: onMemcacheUnmet, flag: "memcache-max-idle-conns", conv: refConv{
		doc: "unset, Sluice's default of 64 rather than the reference's 2: every call in flight holds a connection, and one past the idle bound is closed after its call",
		fn:  func(_ *refEnv, v string) (string, error) { return v, nil }}},
	{name: "MEMCACHE_SRV", when: onMemcache, unmet: onMemcacheUnmet, flag: "memcache-srv"},
	{name: "MEMCACHE_SRV_REFRESH", when: onMemcache, unmet: onMemcacheUnmet, flag: "memcache-srv-refresh"},
	{name: "MEMCACHE_TLS", boolean: true, when: onMemcache, unmet: onMemcacheUnmet, flag: "memcache-tls"},
	{name: "MEMCACHE_TLS_CLIENT_CERT", when: onMemcacheTLS, flag: "memcache-tls-cert"},
	{name: "MEMCACHE_TLS_CLIENT_KEY", when: onMemcacheTLS, flag: "memcache-tls-key"},
	{name: "MEMCACHE_TLS_CACERT", when: onMemcacheTLS, flag: "memcache-tls-ca"},
	{name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", boolean: true, when: onMemcacheTLS, flag: "memcache-tls-skip-hostname-verification"},
}

const onMemcacheUnmet = " (read only with BACKEND_TYPE=memcache)"

var (
	onMemcache = &refCond{doc: "`BACKEND_TYPE=memcache`", holds: func(e *refEnv) bool {
		return strings.EqualFold(e.getenv("BACKEND_TYPE"), "memcache")
	}}
	onMemcacheTLS = &refCond{within: onMemcache, doc: "`MEMCACHE_TLS=true`", holds: func(e *refEnv) bool { return e.on("MEMCACHE_TLS") }}
)
