package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/split"
)

// redisFlags are the redis backend's settings: the Redis of every limit
// (--redis-*) and, optionally, a second one for the per-second limits
// (--redis-persecond-*), the reference's REDIS_PERSECOND.
type redisFlags struct {
	redisConn
	perSecond  redisConn
	health     bool
	localCache bool
	keyPrefix  string
	jitter     time.Duration
	clock      string
	// connectRetry, connectRetryMax and connectMaxWait are the back-off
	// of connecting to a Redis not up yet at startup.
	connectRetry, connectRetryMax, connectMaxWait time.Duration
}

// redisConn are the settings of one Redis deployment and of the
// connections to it.
type redisConn struct {
	prefix           string // of its flags' names: "redis" or "redis-persecond"
	url              string
	sentinel         string
	sentinelMaster   string
	cluster          string
	username         string
	password         string
	sentinelPassword string
	tls              storeTLSFlags
	timeout          time.Duration
	pipelineWindow   time.Duration
}

// The redis backend: counters in Redis (single, Sentinel or Cluster), so
// every replica shares every limit.
func init() {
	registerBackend(backend{name: "redis", waits: true, shared: true, newConfig: newRedisConfig, refVars: redisRefVars})
}

// redisConfig is one serve invocation's settings of the redis backend.
type redisConfig struct {
	f  redisFlags
	fs *flag.FlagSet // serve's, whose --store-failure-mode the store follows
}

func newRedisConfig(fs *flag.FlagSet) storeConfig {
	c := &redisConfig{fs: fs}
	c.f.register(fs)
	return c
}

func (f *redisFlags) register(fs *flag.FlagSet) {
	f.redisConn.register(fs, "redis", "redis store: ")
	f.perSecond.register(fs, "redis-persecond", "redis store, per-second Redis: ")
	fs.Func("redis-failure-mode", "redis store: same as --store-failure-mode: error | allow | deny", func(v string) error {
		return fs.Set("store-failure-mode", v)
	})
	fs.BoolVar(&f.health, "redis-health", false, "redis store: report NOT_SERVING while Redis (either, with --redis-persecond-*) is unreachable")
	fs.BoolVar(&f.localCache, "redis-local-cache", true, "redis store: answer keys known to be over their limit without asking Redis")
	fs.StringVar(&f.keyPrefix, "redis-key-prefix", "", "redis store: prefix of every Redis key")
	fs.DurationVar(&f.jitter, "redis-expiry-jitter", 0, "redis store: with --key-format reference, each write of a key in the reference's format expires up to this much later, at random, in whole seconds (EXPIRATION_JITTER_MAX_SECONDS)")
	fs.StringVar(&f.clock, "redis-clock", "script-arg", "redis store: token-bucket clock: script-arg (this process's) | server (Redis TIME)")
	fs.DurationVar(&f.connectRetry, "redis-connect-retry", redis.DefaultConnectRetry, "redis store: a Redis not reachable at startup is tried again after this long, "+
		"then twice as long each time up to --redis-connect-retry-max; meanwhile health is NOT_SERVING and requests are answered by --store-failure-mode")
	fs.DurationVar(&f.connectRetryMax, "redis-connect-retry-max", redis.DefaultConnectRetryMax, "redis store: longest wait between attempts to reach a Redis not reachable at startup")
	fs.DurationVar(&f.connectMaxWait, "redis-connect-max-wait", 0, "redis store: exit if Redis has not answered this long after startup (0: wait for ever)")
}

// register adds the flags of one Redis: --NAME-url and so on, with prefix
// NAME; the per-second one's keep the main one's defaults.
func (f *redisConn) register(fs *flag.FlagSet, name, usage string) {
	f.prefix = name
	p := name + "-"
	if name == "redis" {
		fs.StringVar(&f.url, p+"url", "", usage+"`URL` of a single Redis: redis://[user:password@]host:port[/db], rediss:// (TLS), unix:///path.sock")
	} else {
		fs.StringVar(&f.url, p+"url", "", usage+"`URL` of a second Redis (as --redis-url) that holds the limits whose period is under a minute (a unit of second), "+
			"instead of the first (the reference's REDIS_PERSECOND)")
	}
	fs.StringVar(&f.sentinel, p+"sentinel", "", usage+"comma-separated sentinel `addresses` (with --"+p+"sentinel-master), instead of --"+p+"url")
	fs.StringVar(&f.sentinelMaster, p+"sentinel-master", "", usage+"`name` of the master the sentinels monitor")
	fs.StringVar(&f.cluster, p+"cluster", "", usage+"comma-separated seed `addresses` of a Redis Cluster, instead of --"+p+"url")
	fs.StringVar(&f.username, p+"username", "", usage+"ACL user (overrides the URL's)")
	fs.StringVar(&f.password, p+"password", "", usage+"password (overrides the URL's)")
	fs.StringVar(&f.sentinelPassword, p+"sentinel-password", "", usage+"password of the sentinels (default: --"+p+"password)")
	f.tls.register(fs, name, usage, "Redis", "rediss://")
	fs.DurationVar(&f.pipelineWindow, p+"pipeline-window", 0, usage+"under concurrent load, wait up to this long after each write to Redis so more commands share the next (up to this much latency; concurrent requests already share script calls, so 0, write at once, measured fastest)")
	fs.DurationVar(&f.timeout, p+"timeout", time.Second, usage+"most time a request waits for Redis, and the wait of callers that state no deadline; a gRPC caller's grpc-timeout (Envoy's filter timeout), or an HTTP caller's Sluice-Timeout header, shortens it, less a margin to answer (a tenth, at most 5ms)")
}

func (c *redisConfig) open(ctx context.Context, logger *slog.Logger, clock store.Clock) (openStore, error) {
	// Every setting is checked before either Redis is asked.
	mainOpt, err := c.f.options(&c.f.redisConn)
	if err != nil {
		return openStore{}, err
	}
	var psOpt redis.Options
	if c.f.perSecond.given() {
		if psOpt, err = c.f.options(&c.f.perSecond); err != nil {
			return openStore{}, err
		}
	}
	main, err := c.openOne(ctx, logger, clock, &c.f.redisConn, mainOpt)
	if err != nil {
		return openStore{}, err
	}
	if !c.f.perSecond.given() {
		setup := func(x *serveContext) error { return c.setup(x, nil, main) }
		return openStore{Store: main.Store, closer: main, run: main.Run, setup: setup}, nil
	}
	ps, err := c.openOne(ctx, logger, clock, &c.f.perSecond, psOpt)
	if err != nil {
		main.Close()
		return openStore{}, err
	}
	sp := split.New(main.Store, ps.Store, perSecond, split.Options{})
	// Either Run's error (a Redis not reachable within
	// --redis-connect-max-wait) stops the other: serve then exits.
	run := func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			err := ps.Run(ctx)
			if err != nil {
				cancel()
			}
			done <- err
		}()
		err := main.Run(ctx)
		if err != nil {
			cancel()
		}
		return errors.Join(err, <-done)
	}
	setup := func(x *serveContext) error { return c.setup(x, sp, main, ps) }
	return openStore{Store: sp, closer: closers{main, ps}, run: run, setup: setup}, nil
}

// perSecond is the route of a split store: the hits whose rule's period
// (window, refill period) is under a minute go to the per-second Redis.
// That is the reference's REDIS_PERSECOND rule, limits of unit SECOND,
// for every limit it can express; with Sluice's unit_multiplier it is a
// unit of second below 60 of them (60 seconds are a minute, whose counter
// key a minute's limit shares, so that a key always lives in one Redis).
func perSecond(h *store.Hit) bool { return h.Rule.Period() < time.Minute }

// redisStore is one Redis store with its latency histogram, which setup
// registers.
type redisStore struct {
	*redis.Store
	conn  *redisConn
	calls *prometheus.HistogramVec
}

// subsystem is the metrics' subsystem of r's store: sluice_redis_* for
// the main Redis, sluice_redis_persecond_* for the per-second one.
func (r redisConn) subsystem() string { return strings.ReplaceAll(r.prefix, "-", "_") }

// openOne opens the store of one Redis, conn, whose options are opt.
func (c *redisConfig) openOne(ctx context.Context, logger *slog.Logger, clock store.Clock, conn *redisConn, opt redis.Options) (redisStore, error) {
	opt.Clock = clock
	opt.Logger, opt.FailureMode = logger, flagValue(c.fs, "store-failure-mode")
	calls := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "sluice", Subsystem: conn.subsystem(),
		Name: "call_duration_seconds", Help: "Redis round trips of a request (one script call, or one per slot on Cluster), by result.",
		Buckets: observe.LatencyBuckets}, []string{"result"})
	ok, failed := calls.WithLabelValues("ok"), calls.WithLabelValues("error")
	opt.OnCall = func(d time.Duration, err error) {
		if err != nil {
			failed.Observe(d.Seconds())
		} else {
			ok.Observe(d.Seconds())
		}
	}
	conn.tls.warn(logger, "redis store", "Redis")
	st, err := redis.New(ctx, opt)
	if err != nil {
		if conn.prefix != "redis" {
			err = fmt.Errorf("per-second Redis: %w", err)
		}
		return redisStore{}, err
	}
	msg := "redis store"
	if conn.prefix != "redis" {
		msg += " (per-second limits)"
	}
	logger.Info(msg, "deployment", conn.deployment(), "timeout", opt.Timeout,
		"clock", c.f.clock, "local_cache", !opt.NoLocalCache, "key_prefix", opt.KeyPrefix)
	return redisStore{Store: st, conn: conn, calls: calls}, nil
}

// closers closes each of its closers.
type closers []io.Closer

func (cs closers) Close() error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// setup registers the metrics of stores and of sp, the split store over
// them when there is a per-second Redis (else nil); with --redis-health, health follows every Redis as well as the
// config.
func (c *redisConfig) setup(x *serveContext, sp *split.Store, stores ...redisStore) error {
	for _, st := range stores {
		if err := registerRedisMetrics(x.Registry, st.Store, st.conn.subsystem()); err != nil {
			return err
		}
		if err := x.Registry.Register(st.calls); err != nil {
			return err
		}
		// Until Redis first answers (it may not be up yet at startup),
		// health says NOT_SERVING, --redis-health or not.
		readyOnceUp(x, st.Connected())
		if c.f.health {
			x.Ready = append(x.Ready, st.Healthy)
			x.Run = append(x.Run, func(ctx context.Context) error {
				return followHealth(ctx, st.Store, x, 50*time.Millisecond)
			})
		}
	}
	if sp != nil {
		err := x.Registry.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "redis_persecond",
			Name: "split_refund_failures_total", Help: "Requests on both Redis whose refund failed (the takes one Redis committed while the other denied or failed): left in place until their keys expire (over-deny)."},
			func() float64 { return float64(sp.Stats().RefundFailures) }))
		if err != nil {
			return err
		}
	}
	return nil
}

// registerRedisMetrics registers st's metrics, sluice_<subsystem>_*.
func registerRedisMetrics(reg prometheus.Registerer, st *redis.Store, subsystem string) error {
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "sluice", Subsystem: subsystem, Name: name, Help: help}
	}
	up := func() float64 {
		if st.Stats().Healthy {
			return 1
		}
		return 0
	}
	return errors.Join(
		reg.Register(prometheus.NewGaugeFunc(opts("up", "1 while Redis answers, 0 while the circuit breaker is open."), up)),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts(opts("local_answers_total", "Requests the local over-limit cache answered without Redis.")),
			func() float64 { return float64(st.Stats().LocalAnswers) })),
		reg.Register(prometheus.NewGaugeFunc(opts("local_cache_keys", "Keys in the local over-limit cache."),
			func() float64 { return float64(st.Stats().LocalKeys) })),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts(opts("refund_failures_total", "Refunds that failed (Cluster slots that committed in a denied request; increments of a denied request on the reference's keys): takes left in place until their keys expire (over-deny).")),
			func() float64 { return float64(st.Stats().RefundFailures) })),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts(opts("failed_takes_total", "Requests the Redis store failed (answered by the failure mode): breaker open, out of time, Redis unreachable.")),
			func() float64 { return float64(st.Stats().Failed) })),
		reg.Register(transitions{st, prometheus.NewDesc("sluice_"+subsystem+"_transitions_total",
			"Transitions of the Redis store's state: to=down when the circuit breaker opens (Redis unreachable), to=up when it closes.",
			[]string{"to"}, nil)}),
	)
}

// transitions is sluice_redis_transitions_total{to="down"|"up"} (or
// sluice_redis_persecond_...): the circuit breaker's openings and
// closings.
type transitions struct {
	st   *redis.Store
	desc *prometheus.Desc
}

func (c transitions) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c transitions) Collect(ch chan<- prometheus.Metric) {
	s := c.st.Stats()
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(s.Opens), "down")
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(s.Closes), "up")
}

// readyOnceUp makes x's health wait for up, a store's first answer: a
// Ready condition, and a task that updates health when up closes.
func readyOnceUp(x *serveContext, up <-chan struct{}) {
	x.Ready = append(x.Ready, func() bool {
		select {
		case <-up:
			return true
		default:
			return false
		}
	})
	x.Run = append(x.Run, func(ctx context.Context) error {
		select {
		case <-ctx.Done():
		case <-up:
			x.UpdateHealth()
		}
		return nil
	})
}

// followHealth updates x's health when st's health changes, checking
// every interval (st.Healthy is one of x.Ready, so a config reload while
// the store is down keeps NOT_SERVING too). The store logs the
// transitions.
func followHealth(ctx context.Context, st interface{ Healthy() bool }, x *serveContext, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	was := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		ok := st.Healthy()
		if ok != was {
			x.UpdateHealth()
		}
		was = ok
	}
}

// given reports whether f names a deployment: always for the main Redis
// (options says when it does not), for the per-second one when it is used.
func (f *redisConn) given() bool { return f.url != "" || f.sentinel != "" || f.cluster != "" }

func (f *redisConn) deployment() string {
	switch {
	case f.cluster != "":
		return "cluster"
	case f.sentinel != "":
		return "sentinel"
	}
	return "single"
}

// options are the store options of conn, one of f's Redis.
func (f *redisFlags) options(conn *redisConn) (redis.Options, error) {
	o := redis.Options{URL: conn.url, SentinelMaster: conn.sentinelMaster, Username: conn.username,
		Password: conn.password, SentinelPassword: conn.sentinelPassword, Timeout: conn.timeout, PipelineWindow: conn.pipelineWindow,
		KeyPrefix: f.keyPrefix, NoLocalCache: !f.localCache, PlainJitterMax: int64(f.jitter / time.Second),
		ConnectRetry: f.connectRetry, ConnectRetryMax: f.connectRetryMax, ConnectMaxWait: f.connectMaxWait}
	if err := checkJitter("--redis-expiry-jitter", f.jitter); err != nil {
		return o, err
	}
	if conn.sentinel != "" {
		o.SentinelAddrs = splitList(conn.sentinel)
	}
	if conn.cluster != "" {
		o.ClusterAddrs = splitList(conn.cluster)
	}
	p := "--" + conn.prefix + "-"
	if !conn.given() {
		return o, fmt.Errorf("redis store: give %surl, %ssentinel or %scluster", p, p, p)
	}
	if conn.timeout <= 0 {
		return o, fmt.Errorf("%stimeout must be positive", p)
	}
	if f.connectRetry <= 0 || f.connectRetryMax < f.connectRetry || f.connectMaxWait < 0 {
		return o, fmt.Errorf("--redis-connect-retry %v, --redis-connect-retry-max %v, --redis-connect-max-wait %v: want a positive retry, a maximum at least as long, a wait of 0 or more",
			f.connectRetry, f.connectRetryMax, f.connectMaxWait)
	}
	if conn.pipelineWindow < 0 || conn.pipelineWindow >= conn.timeout {
		return o, fmt.Errorf("%spipeline-window %v: want 0 or more and less than %stimeout (%v)", p, conn.pipelineWindow, p, conn.timeout)
	}
	switch f.clock {
	case "script-arg":
	case "server":
		o.ServerClock = true
	default:
		return o, fmt.Errorf("--redis-clock %q: want script-arg or server", f.clock)
	}
	tc, err := conn.tls.config()
	if err != nil {
		return o, err
	}
	o.TLS = tc
	return o, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// redisRefVars are envoyproxy/ratelimit's Redis variables: the Redis of
// every limit, and with REDIS_PERSECOND=true a second one for the limits
// of unit second (--redis-persecond-*).
var redisRefVars = slices.Concat([]refVar{
	{name: "REDIS_SOCKET_TYPE", with: "REDIS_URL"},
	{name: "REDIS_TYPE", with: "REDIS_URL"},
	{name: "REDIS_URL", apply: refApply{
		doc: "by `REDIS_TYPE` (any case): `SINGLE` (the default), `--redis-url` (`host:port` as `redis://host:port`, " +
			"`rediss://` with `REDIS_TLS=true`, `unix://` with `REDIS_SOCKET_TYPE=unix`; a URL with a scheme as given); " +
			"`SENTINEL`, `--redis-sentinel-master` and `--redis-sentinel` from `master,host:port[,host:port...]`; " +
			"`CLUSTER`, `--redis-cluster`; other types refused. With `BACKEND_TYPE` unset, `--store redis` (the reference's default)",
		fn: func(e *refEnv, url string) error {
			if !e.has("BACKEND_TYPE") {
				// The reference's default backend is Redis: its manifests
				// set REDIS_URL alone.
				e.set("store", "redis")
			}
			return redisURLFromRef(e, "REDIS_", "redis-", url)
		}}},
	{name: "REDIS_POOL_SIZE", ignore: "every Redis call is pipelined on a few shared connections"},
	{name: "REDIS_AUTH", apply: redisAuthFromRef("redis-")},
	{name: "REDIS_TLS", boolean: true, flag: "redis-tls"},
	{name: "REDIS_TLS_CLIENT_CERT", when: onAnyRedisTLS, apply: redisTLSFromRef("tls-cert")},
	{name: "REDIS_TLS_CLIENT_KEY", when: onAnyRedisTLS, apply: redisTLSFromRef("tls-key")},
	{name: "REDIS_TLS_CACERT", when: onAnyRedisTLS, apply: redisTLSFromRef("tls-ca")},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", boolean: true, when: onAnyRedisTLS, apply: refApply{
		doc: "`true`: `--redis-tls-skip-hostname-verification` (and `--redis-persecond-...` with `REDIS_PERSECOND_TLS=true`): " +
			"Redis's certificate must chain to `REDIS_TLS_CACERT` (or the system roots), whatever name it holds, as in the reference; " +
			"logged as a warning at startup (`--redis-tls-server-name` is the safer way)",
		fn: func(e *refEnv, v string) error {
			if v == "true" {
				redisTLSSet(e, "tls-skip-hostname-verification", v)
			}
			return nil
		}}},
	{name: "REDIS_PIPELINE_WINDOW", flag: "redis-pipeline-window"},
	{name: "REDIS_PIPELINE_LIMIT", ignore: "concurrent requests share Redis script calls on their own"},
	{name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", note: "not read: on Cluster a request's hash slots are called in parallel"},
	{name: "REDIS_PERSECOND", boolean: true, apply: refApply{
		doc: "`true` reads `REDIS_PERSECOND_URL` (needed) and the other `REDIS_PERSECOND_*`: a second Redis, on `--redis-persecond-*`, " +
			"holds the limits of unit second (with `unit_multiplier`, of a period under a minute; docs/REDIS.md)",
		fn: func(e *refEnv, v string) error {
			if v == "true" && !e.has("REDIS_PERSECOND_URL") {
				return errors.New("REDIS_PERSECOND=true needs REDIS_PERSECOND_URL")
			}
			return nil
		}}},
	{name: "REDIS_PERSECOND_SOCKET_TYPE", with: "REDIS_PERSECOND_URL"},
	{name: "REDIS_PERSECOND_TYPE", with: "REDIS_PERSECOND_URL"},
	{name: "REDIS_PERSECOND_URL", when: onPerSecond, apply: refApply{
		doc: "as `REDIS_URL`, by `REDIS_PERSECOND_TYPE`, `REDIS_PERSECOND_SOCKET_TYPE` and `REDIS_PERSECOND_TLS`: " +
			"`--redis-persecond-url`, `--redis-persecond-sentinel-master` and `--redis-persecond-sentinel`, or `--redis-persecond-cluster`",
		fn: func(e *refEnv, url string) error {
			return redisURLFromRef(e, "REDIS_PERSECOND_", "redis-persecond-", url)
		}}},
	{name: "REDIS_PERSECOND_POOL_SIZE", when: onPerSecond, ignore: "every Redis call is pipelined on a few shared connections"},
	{name: "REDIS_PERSECOND_AUTH", when: onPerSecond, apply: redisAuthFromRef("redis-persecond-")},
	{name: "REDIS_PERSECOND_TLS", boolean: true, when: onPerSecond, flag: "redis-persecond-tls"},
	{name: "REDIS_SENTINEL_AUTH", flag: "redis-sentinel-password"},
	{name: "REDIS_PERSECOND_SENTINEL_AUTH", when: onPerSecond, flag: "redis-persecond-sentinel-password"},
	{name: "REDIS_PERSECOND_PIPELINE_WINDOW", when: onPerSecond, flag: "redis-persecond-pipeline-window"},
	{name: "REDIS_PERSECOND_PIPELINE_LIMIT", when: onPerSecond, ignore: "concurrent requests share Redis script calls on their own"},
	{name: "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", note: "not read: on Cluster a request's hash slots are called in parallel"},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", boolean: true, flag: "redis-health"},
	{name: "REDIS_TIMEOUT", flag: "redis-timeout", differs: "unset, 1s (the reference's default: 10s); a caller's `grpc-timeout` shortens the wait"},
	{name: "REDIS_PERSECOND_TIMEOUT", when: onPerSecond, flag: "redis-persecond-timeout"},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", note: "not read: Sluice has no connection pool to run empty (calls are pipelined on a few shared connections)"},
	{name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", note: "not read: as `REDIS_POOL_ON_EMPTY_BEHAVIOR`"},
	{name: "REDIS_STARTUP_INITIAL_INTERVAL", flag: "redis-connect-retry", differs: "unset, 100ms (the reference's default: 1s)"},
	{name: "REDIS_STARTUP_MAX_INTERVAL", flag: "redis-connect-retry-max", differs: "unset, 5s (the reference's default: 30s)"},
	{name: "REDIS_STARTUP_MAX_ELAPSED_TIME", flag: "redis-connect-max-wait"},
}, []refVar{
	{name: "CACHE_KEY_PREFIX", apply: refApply{doc: "`--redis-key-prefix` and `--memcache-key-prefix`",
		fn: func(e *refEnv, v string) error {
			e.set("redis-key-prefix", v)
			e.set("memcache-key-prefix", v)
			return nil
		}},
		differs: "with the reference's store settings the fixed windows it can express keep its keys after the prefix (`--key-format reference`, see `EXPIRATION_JITTER_MAX_SECONDS`); " +
			"token buckets, sliding windows, calendar periods, unit multipliers, wide limits and several limits per descriptor keep Sluice's (docs/MIGRATION.md)"},
})

var (
	onPerSecond = &refCond{doc: "`REDIS_PERSECOND=true`", holds: func(e *refEnv) bool { return e.on("REDIS_PERSECOND") }}
	// onAnyRedisTLS: the reference builds one TLS configuration, from
	// REDIS_TLS_*, for whichever of its Redis has TLS on.
	onAnyRedisTLS = &refCond{doc: "`REDIS_TLS=true` or `REDIS_PERSECOND_TLS=true`", holds: func(e *refEnv) bool {
		return e.on("REDIS_TLS") || e.on("REDIS_PERSECOND") && e.on("REDIS_PERSECOND_TLS")
	}}
)

// redisTLSFromRef maps a REDIS_TLS_* file onto --redis-NAME and, with a
// per-second Redis on TLS, --redis-persecond-NAME.
func redisTLSFromRef(name string) refApply {
	return refApply{doc: "`--redis-" + name + "` with `REDIS_TLS=true`, `--redis-persecond-" + name + "` with `REDIS_PERSECOND_TLS=true`",
		fn: func(e *refEnv, v string) error {
			redisTLSSet(e, name, v)
			return nil
		}}
}

// redisTLSSet sets --redis-NAME to v if the main Redis has TLS on, and
// --redis-persecond-NAME if the per-second one does.
func redisTLSSet(e *refEnv, name, v string) {
	if e.on("REDIS_TLS") {
		e.set("redis-"+name, v)
	}
	if e.on("REDIS_PERSECOND") && e.on("REDIS_PERSECOND_TLS") {
		e.set("redis-persecond-"+name, v)
	}
}

// redisAuthFromRef maps REDIS_AUTH (or REDIS_PERSECOND_AUTH) onto the
// password flag of the Redis whose flags begin with prefix, or its
// username and password from user:password.
func redisAuthFromRef(prefix string) refApply {
	return refApply{
		doc: "`--" + prefix + "password`, or `--" + prefix + "username` and `--" + prefix + "password` from `user:password`",
		fn: func(e *refEnv, auth string) error {
			if user, pass, ok := strings.Cut(auth, ":"); ok {
				e.set(prefix+"username", user)
				e.set(prefix+"password", pass)
			} else {
				e.set(prefix+"password", auth)
			}
			return nil
		}}
}

// redisURLFromRef maps url, REDIS_URL (env is "REDIS_", flags "redis-")
// or REDIS_PERSECOND_URL, by <env>TYPE: host:port (a socket path with
// <env>SOCKET_TYPE=unix, rediss:// with <env>TLS=true),
// "master,host:port,..." for Sentinel, a list of seeds for Cluster.
func redisURLFromRef(e *refEnv, env, flags, url string) error {
	switch t := strings.ToUpper(e.getenv(env + "TYPE")); t {
	case "", "SINGLE":
		switch {
		case strings.Contains(url, "://"):
			// Already a URL (redis://, rediss://, unix://): as given.
			e.set(flags+"url", url)
		case strings.EqualFold(e.getenv(env+"SOCKET_TYPE"), "unix"):
			e.set(flags+"url", "unix://"+url)
		case e.on(env + "TLS"):
			e.set(flags+"url", "rediss://"+url)
		default:
			e.set(flags+"url", "redis://"+url)
		}
	case "SENTINEL":
		master, addrs, ok := strings.Cut(url, ",")
		if !ok {
			return fmt.Errorf("%sURL=%s: Sentinel wants master,host:port[,host:port...]", env, redact.Addrs(url))
		}
		e.set(flags+"sentinel-master", master)
		e.set(flags+"sentinel", addrs)
	case "CLUSTER":
		e.set(flags+"cluster", url)
	default:
		return fmt.Errorf("%sTYPE=%s: want SINGLE, SENTINEL or CLUSTER", env, t)
	}
	return nil
}

// checkJitter checks an expiry jitter flag: whole seconds, 0 or more, as
// EXPIRATION_JITTER_MAX_SECONDS counts it.
func checkJitter(name string, d time.Duration) error {
	if d < 0 || d%time.Second != 0 {
		return fmt.Errorf("%s %v: want whole seconds, 0 or more", name, d)
	}
	return nil
}
