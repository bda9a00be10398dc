package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/redact"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis"
)

// redisFlags are the redis backend's settings.
type redisFlags struct {
	url              string
	sentinel         string
	sentinelMaster   string
	cluster          string
	username         string
	password         string
	sentinelPassword string
	tls              bool
	tlsCA            string
	tlsCert          string
	tlsKey           string
	tlsServerName    string
	timeout          time.Duration
	pipelineWindow   time.Duration
	health           bool
	localCache       bool
	keyPrefix        string
	clock            string
}

// The redis backend: counters in Redis (single, Sentinel or Cluster), so
// every replica shares every limit.
func init() {
	registerBackend(backend{name: "redis", waits: true, newConfig: newRedisConfig, refVars: redisRefVars})
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
	fs.StringVar(&f.url, "redis-url", "", "redis store: `URL` of a single Redis: redis://[user:password@]host:port[/db], rediss:// (TLS), unix:///path.sock")
	fs.StringVar(&f.sentinel, "redis-sentinel", "", "redis store: comma-separated sentinel `addresses` (with --redis-sentinel-master), instead of --redis-url")
	fs.StringVar(&f.sentinelMaster, "redis-sentinel-master", "", "redis store: `name` of the master the sentinels monitor")
	fs.StringVar(&f.cluster, "redis-cluster", "", "redis store: comma-separated seed `addresses` of a Redis Cluster, instead of --redis-url")
	fs.StringVar(&f.username, "redis-username", "", "redis store: ACL user (overrides the URL's)")
	fs.StringVar(&f.password, "redis-password", "", "redis store: password (overrides the URL's)")
	fs.StringVar(&f.sentinelPassword, "redis-sentinel-password", "", "redis store: password of the sentinels (default: --redis-password)")
	fs.BoolVar(&f.tls, "redis-tls", false, "redis store: connect with TLS (implied by rediss://)")
	fs.StringVar(&f.tlsCA, "redis-tls-ca", "", "redis store: PEM `file` of the CA that signed Redis's certificate (default: system roots)")
	fs.StringVar(&f.tlsCert, "redis-tls-cert", "", "redis store: PEM `file` of the client certificate")
	fs.StringVar(&f.tlsKey, "redis-tls-key", "", "redis store: PEM `file` of the client certificate's key")
	fs.StringVar(&f.tlsServerName, "redis-tls-server-name", "", "redis store: name to verify Redis's certificate against (default: the host)")
	fs.DurationVar(&f.pipelineWindow, "redis-pipeline-window", 0, "redis store: under concurrent load, wait up to this long after each write to Redis so more commands share the next (up to this much latency; concurrent requests already share script calls, so 0, write at once, measured fastest)")
	fs.DurationVar(&f.timeout, "redis-timeout", time.Second, "redis store: most time a request waits for Redis, and the wait of callers that state no deadline; a gRPC caller's grpc-timeout (Envoy's filter timeout), or an HTTP caller's Sluice-Timeout header, shortens it, less a margin to answer (a tenth, at most 5ms)")
	fs.Func("redis-failure-mode", "redis store: same as --store-failure-mode: error | allow | deny", func(v string) error {
		return fs.Set("store-failure-mode", v)
	})
	fs.BoolVar(&f.health, "redis-health", false, "redis store: report NOT_SERVING while Redis is unreachable")
	fs.BoolVar(&f.localCache, "redis-local-cache", true, "redis store: answer keys known to be over their limit without asking Redis")
	fs.StringVar(&f.keyPrefix, "redis-key-prefix", "", "redis store: prefix of every Redis key")
	fs.StringVar(&f.clock, "redis-clock", "script-arg", "redis store: token-bucket clock: script-arg (this process's) | server (Redis TIME)")
}

func (c *redisConfig) open(ctx context.Context, logger *slog.Logger, clock store.Clock) (openStore, error) {
	opt, err := c.f.options()
	if err != nil {
		return openStore{}, err
	}
	opt.Clock = clock
	opt.Logger, opt.FailureMode = logger, flagValue(c.fs, "store-failure-mode")
	calls := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "sluice", Subsystem: "redis",
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
	st, err := redis.New(ctx, opt)
	if err != nil {
		return openStore{}, err
	}
	logger.Info("redis store", "deployment", c.f.deployment(), "timeout", opt.Timeout,
		"clock", c.f.clock, "local_cache", !opt.NoLocalCache, "key_prefix", opt.KeyPrefix)
	setup := func(x *serveContext) error { return c.setup(x, st, calls) }
	return openStore{Store: st, closer: st, run: st.Run, setup: setup}, nil
}

// setup registers the store's metrics; with --redis-health, health
// follows Redis as well as the config.
func (c *redisConfig) setup(x *serveContext, st *redis.Store, calls *prometheus.HistogramVec) error {
	if err := registerRedisMetrics(x.Registry, st); err != nil {
		return err
	}
	if err := x.Registry.Register(calls); err != nil {
		return err
	}
	if c.f.health {
		x.Ready = append(x.Ready, st.Healthy)
		x.Run = append(x.Run, func(ctx context.Context) error {
			return followHealth(ctx, st, x, 50*time.Millisecond)
		})
	}
	return nil
}

func registerRedisMetrics(reg prometheus.Registerer, st *redis.Store) error {
	opts := func(name, help string) prometheus.GaugeOpts {
		return prometheus.GaugeOpts{Namespace: "sluice", Subsystem: "redis", Name: name, Help: help}
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
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts(opts("refund_failures_total", "Cluster refunds that failed: takes left in place until their keys expire (over-deny).")),
			func() float64 { return float64(st.Stats().RefundFailures) })),
		reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts(opts("failed_takes_total", "Requests the Redis store failed (answered by the failure mode): breaker open, out of time, Redis unreachable.")),
			func() float64 { return float64(st.Stats().Failed) })),
		reg.Register(transitions{st}),
	)
}

// transitions is sluice_redis_transitions_total{to="down"|"up"}: the
// circuit breaker's openings and closings.
type transitions struct{ st *redis.Store }

var transitionsDesc = prometheus.NewDesc("sluice_redis_transitions_total",
	"Transitions of the Redis store's state: to=down when the circuit breaker opens (Redis unreachable), to=up when it closes.",
	[]string{"to"}, nil)

func (c transitions) Describe(ch chan<- *prometheus.Desc) { ch <- transitionsDesc }

func (c transitions) Collect(ch chan<- prometheus.Metric) {
	s := c.st.Stats()
	ch <- prometheus.MustNewConstMetric(transitionsDesc, prometheus.CounterValue, float64(s.Opens), "down")
	ch <- prometheus.MustNewConstMetric(transitionsDesc, prometheus.CounterValue, float64(s.Closes), "up")
}

// followHealth updates x's health when st's health changes, checking
// every interval (st.Healthy is one of x.Ready, so a config reload while
// Redis is down keeps NOT_SERVING too). The store logs the transitions.
func followHealth(ctx context.Context, st *redis.Store, x *serveContext, interval time.Duration) error {
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

func (f *redisFlags) deployment() string {
	switch {
	case f.cluster != "":
		return "cluster"
	case f.sentinel != "":
		return "sentinel"
	}
	return "single"
}

func (f *redisFlags) options() (redis.Options, error) {
	o := redis.Options{URL: f.url, SentinelMaster: f.sentinelMaster, Username: f.username,
		Password: f.password, SentinelPassword: f.sentinelPassword, Timeout: f.timeout, PipelineWindow: f.pipelineWindow, KeyPrefix: f.keyPrefix, NoLocalCache: !f.localCache}
	if f.sentinel != "" {
		o.SentinelAddrs = splitList(f.sentinel)
	}
	if f.cluster != "" {
		o.ClusterAddrs = splitList(f.cluster)
	}
	if f.url == "" && f.sentinel == "" && f.cluster == "" {
		return o, errors.New("redis store: give --redis-url, --redis-sentinel or --redis-cluster")
	}
	if f.timeout <= 0 {
		return o, errors.New("--redis-timeout must be positive")
	}
	if f.pipelineWindow < 0 || f.pipelineWindow >= f.timeout {
		return o, fmt.Errorf("--redis-pipeline-window %v: want 0 or more and less than --redis-timeout (%v)", f.pipelineWindow, f.timeout)
	}
	switch f.clock {
	case "script-arg":
	case "server":
		o.ServerClock = true
	default:
		return o, fmt.Errorf("--redis-clock %q: want script-arg or server", f.clock)
	}
	if f.tls || f.tlsCA != "" || f.tlsCert != "" || f.tlsServerName != "" {
		tc, err := f.tlsConfig()
		if err != nil {
			return o, err
		}
		o.TLS = tc
	}
	return o, nil
}

func (f *redisFlags) tlsConfig() (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: f.tlsServerName}
	if f.tlsCA != "" {
		pem, err := os.ReadFile(f.tlsCA)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--redis-tls-ca %s: no PEM certificate", f.tlsCA)
		}
	}
	if (f.tlsCert == "") != (f.tlsKey == "") {
		return nil, errors.New("--redis-tls-cert and --redis-tls-key go together")
	}
	if f.tlsCert != "" {
		c, err := tls.LoadX509KeyPair(f.tlsCert, f.tlsKey)
		if err != nil {
			return nil, fmt.Errorf("--redis-tls-cert: %w", err)
		}
		tc.Certificates = []tls.Certificate{c}
	}
	return tc, nil
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

// redisRefVars are envoyproxy/ratelimit's Redis variables. A separate
// per-second Redis (REDIS_PERSECOND) is refused.
var redisRefVars = slices.Concat([]refVar{
	{name: "REDIS_SOCKET_TYPE", with: "REDIS_URL"},
	{name: "REDIS_TYPE", with: "REDIS_URL"},
	{name: "REDIS_URL", apply: refApply{
		doc: "by `REDIS_TYPE` (any case): `SINGLE` (the default), `--redis-url` (`host:port` as `redis://host:port`, " +
			"`rediss://` with `REDIS_TLS=true`, `unix://` with `REDIS_SOCKET_TYPE=unix`; a URL with a scheme as given); " +
			"`SENTINEL`, `--redis-sentinel-master` and `--redis-sentinel` from `master,host:port[,host:port...]`; " +
			"`CLUSTER`, `--redis-cluster`; other types refused. With `BACKEND_TYPE` unset, `--store redis` (the reference's default)",
		fn: redisURLFromRef}},
	{name: "REDIS_POOL_SIZE", ignore: "every Redis call is pipelined on a few shared connections"},
	{name: "REDIS_AUTH", apply: refApply{
		doc: "`--redis-password`, or `--redis-username` and `--redis-password` from `user:password`",
		fn: func(e *refEnv, auth string) error {
			if user, pass, ok := strings.Cut(auth, ":"); ok {
				e.set("redis-username", user)
				e.set("redis-password", pass)
			} else {
				e.set("redis-password", auth)
			}
			return nil
		}}},
	{name: "REDIS_TLS", boolean: true, flag: "redis-tls"},
	{name: "REDIS_TLS_CLIENT_CERT", when: onRedisTLS, flag: "redis-tls-cert"},
	{name: "REDIS_TLS_CLIENT_KEY", when: onRedisTLS, flag: "redis-tls-key"},
	{name: "REDIS_TLS_CACERT", when: onRedisTLS, flag: "redis-tls-ca"},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", boolean: true, refuse: "set --redis-tls-server-name to the name in Redis's certificate"},
	{name: "REDIS_PIPELINE_WINDOW", flag: "redis-pipeline-window"},
	{name: "REDIS_PIPELINE_LIMIT", ignore: "concurrent requests share Redis script calls on their own"},
	{name: "REDIS_CLUSTER_PIPELINE_PARALLELISM", note: "not read: on Cluster a request's hash slots are called in parallel"},
	{name: "REDIS_PERSECOND", boolean: true, refuse: "Sluice keeps every limit in one Redis"},
}, refUnread("only with REDIS_PERSECOND=true, which is refused",
	"REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_POOL_SIZE",
	"REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_PIPELINE_WINDOW",
	"REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_PERSECOND_TIMEOUT",
	"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR"), []refVar{
	{name: "REDIS_SENTINEL_AUTH", flag: "redis-sentinel-password"},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", boolean: true, flag: "redis-health"},
	{name: "REDIS_TIMEOUT", flag: "redis-timeout", differs: "unset, 1s (the reference's default: 10s); a caller's `grpc-timeout` shortens the wait"},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", note: "not read: Sluice has no connection pool to run empty (calls are pipelined on a few shared connections)"},
}, refUnread("serve pings Redis once at startup and stops if it does not answer",
	"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME"), []refVar{
	{name: "CACHE_KEY_PREFIX", flag: "redis-key-prefix",
		differs: "the keys after the prefix are Sluice's (docs/REDIS.md), not the reference's: counters do not carry over between the two"},
})

var onRedisTLS = &refCond{doc: "`REDIS_TLS=true`", holds: func(e *refEnv) bool { return e.on("REDIS_TLS") }}

// redisURLFromRef maps REDIS_URL by REDIS_TYPE: host:port (a socket path
// with REDIS_SOCKET_TYPE=unix), "master,host:port,..." for Sentinel, a
// list of seeds for Cluster.
func redisURLFromRef(e *refEnv, url string) error {
	if !e.has("BACKEND_TYPE") {
		// The reference's default backend is Redis: its manifests set
		// REDIS_URL alone.
		e.set("store", "redis")
	}
	switch t := strings.ToUpper(e.getenv("REDIS_TYPE")); t {
	case "", "SINGLE":
		switch {
		case strings.Contains(url, "://"):
			// Already a URL (redis://, rediss://, unix://): as given.
			e.set("redis-url", url)
		case strings.EqualFold(e.getenv("REDIS_SOCKET_TYPE"), "unix"):
			e.set("redis-url", "unix://"+url)
		case e.on("REDIS_TLS"):
			e.set("redis-url", "rediss://"+url)
		default:
			e.set("redis-url", "redis://"+url)
		}
	case "SENTINEL":
		master, addrs, ok := strings.Cut(url, ",")
		if !ok {
			return fmt.Errorf("REDIS_URL=%s: Sentinel wants master,host:port[,host:port...]", redact.Addrs(url))
		}
		e.set("redis-sentinel-master", master)
		e.set("redis-sentinel", addrs)
	case "CLUSTER":
		e.set("redis-cluster", url)
	default:
		return fmt.Errorf("REDIS_TYPE=%s: want SINGLE, SENTINEL or CLUSTER", t)
	}
	return nil
}
