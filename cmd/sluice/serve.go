package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
)

func init() {
	register(command{name: "serve", summary: "run the rate-limit service (Envoy RLS v3, sluice.v1, HTTP)", run: runServe})
}

// serveFlags are serve's own settings. Backends and extensions add theirs
// to the same flag set.
type serveFlags struct {
	config           string
	allowEmptyConfig bool
	mergeDomains     bool
	grpcAddr         string
	httpAddr         string
	store            string
	logFormat        string
	logLevel         string
	shadowMode       bool
	quotaMode        bool
	dynamicMetadata  bool
	ietfHeaders      bool
	deniedHits       string
	failureMode      string
	maxDescriptors   int
	maxEntries       int
	maxValueBytes    int
	responseHeaders  bool
	headers          server.Headers
	tlsCert          string
	tlsKey           string
	tlsClientCA      string
	tlsHTTP          bool
	drainTimeout     time.Duration
	maxRecvMsgSize   int
	maxConnAge       time.Duration
	maxConnAgeGrace  time.Duration
	keepaliveTime    time.Duration
	keepaliveTimeout time.Duration
	http             httpBounds
	maxStreams       int
	source           sourceFlags
}

func (f *serveFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.config, "config", "", "limits `path`: a YAML file or a directory of them (required)")
	fs.BoolVar(&f.allowEmptyConfig, "allow-empty-config", false, "start with an empty config directory, NOT_SERVING until a valid config appears in it")
	fs.BoolVar(&f.mergeDomains, "merge-domains", false, "let several files define the same domain (merged)")
	fs.StringVar(&f.grpcAddr, "grpc-addr", ":8081", "gRPC listen `address` (Envoy RLS v3, sluice.v1, health, reflection)")
	fs.StringVar(&f.httpAddr, "http-addr", ":8080", "HTTP listen `address` (/healthcheck, /json, /v1/check)")
	fs.StringVar(&f.store, "store", "memory", "counter store: "+strings.Join(backendNames(), "|"))
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text|json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug (logs every gRPC call) | info | warn | error")
	fs.BoolVar(&f.shadowMode, "shadow-mode", false, "global shadow mode: count and report, but answer every request OK")
	fs.BoolVar(&f.quotaMode, "quota-mode", false, "global quota mode: every descriptor is a quota descriptor; a request is over only if all of them are")
	fs.BoolVar(&f.dynamicMetadata, "response-dynamic-metadata", false, "fill Envoy's dynamic_metadata with the domain, descriptors, hits addend and the matched rules' metadata")
	fs.StringVar(&f.deniedHits, "denied-hits", "drop", "what a denied hit consumes: drop (nothing) | saturate (up to the limit)")
	fs.StringVar(&f.failureMode, "store-failure-mode", "error", "answer when the store fails: error (gRPC UNAVAILABLE) | allow | deny")
	fs.IntVar(&f.maxDescriptors, "max-descriptors", limiter.DefaultMaxDescriptors, "most descriptors in one request")
	fs.IntVar(&f.maxEntries, "max-entries", limiter.DefaultMaxEntries, "most entries in one descriptor")
	fs.IntVar(&f.maxValueBytes, "max-value-bytes", config.DefaultMaxValueBytes, "longer descriptor values are hashed in counter keys")
	fs.BoolVar(&f.responseHeaders, "response-headers", false, "add RateLimit-Limit/-Remaining/-Reset (and Retry-After) to Envoy's response_headers_to_add")
	fs.BoolVar(&f.ietfHeaders, "ietf-headers", false, "add the IETF draft's RateLimit-Policy and RateLimit fields to Envoy's response_headers_to_add and to /v1/check answers")
	fs.StringVar(&f.headers.Limit, "header-limit", "RateLimit-Limit", "name of the limit response header")
	fs.StringVar(&f.headers.Remaining, "header-remaining", "RateLimit-Remaining", "name of the remaining response header")
	fs.StringVar(&f.headers.Reset, "header-reset", "RateLimit-Reset", "name of the reset response header")
	fs.StringVar(&f.tlsCert, "tls-cert", "", "serve gRPC and HTTP over TLS with this certificate `file` (reloaded when it changes)")
	fs.StringVar(&f.tlsKey, "tls-key", "", "the TLS private key `file`")
	fs.StringVar(&f.tlsClientCA, "tls-client-ca", "", "require client certificates signed by this CA bundle `file` (mTLS)")
	fs.BoolVar(&f.tlsHTTP, "tls-http", true, "with --tls-cert, serve --http-addr over TLS too (false: TLS on gRPC only, as envoyproxy/ratelimit)")
	fs.DurationVar(&f.drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM, how long in-flight requests may take before connections are closed")
	fs.IntVar(&f.maxRecvMsgSize, "max-recv-msg-size", 1<<20, "largest gRPC request in bytes")
	fs.DurationVar(&f.maxConnAge, "max-connection-age", 0, "close gRPC connections after this long so clients rebalance (0: never)")
	fs.DurationVar(&f.maxConnAgeGrace, "max-connection-age-grace", 0, "time for in-flight calls after max-connection-age (0: unlimited)")
	fs.DurationVar(&f.keepaliveTime, "keepalive-time", 0, "ping idle gRPC clients after this long (0: gRPC's 2h)")
	fs.DurationVar(&f.keepaliveTimeout, "keepalive-timeout", 0, "close a connection whose ping is unanswered this long (0: gRPC's 20s)")
	f.http.register(fs)
	fs.IntVar(&f.maxStreams, "grpc-max-concurrent-streams", server.DefaultMaxConcurrentStreams, "most concurrent gRPC calls and streams on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS); clients open more connections or wait")
	f.source.register(fs)
}

// extension adds to serve from another file of this command (metrics,
// debug endpoints) without serve knowing it, like backends.
type extension struct {
	name string
	// flags registers the extension's flags on serve's flag set.
	flags func(fs *flag.FlagSet)
	// setup runs after flags are parsed and the config is loaded, before
	// the servers are built. It may add observers, gRPC options, HTTP
	// handlers and goroutines to x.
	setup func(ctx context.Context, x *serveContext) error
}

var extensions []extension

func registerExtension(e extension) { extensions = append(extensions, e) }

// serveContext is what extensions see and extend.
type serveContext struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	Config   *config.Reloader
	Health   *server.Health
	// HTTP is the mux of --http-addr; serve mounts its endpoints on it.
	HTTP *http.ServeMux
	// HTTPRoot, if set, serves --http-addr in place of HTTP, which it
	// wraps (request metrics).
	HTTPRoot http.Handler
	// HTTPBounds bound every HTTP server, extensions' included.
	HTTPBounds httpBounds
	// Observers are told about every decision.
	Observers []limiter.Observer
	// GRPCOptions are added to the gRPC server (stats handlers,
	// interceptors).
	GRPCOptions []grpc.ServerOption
	// Run are started with the serving context; serve waits for them.
	Run []func(ctx context.Context) error
	// Ready are conditions besides a loaded config that health requires
	// (Redis reachable, with --redis-health). An extension that adds one
	// calls UpdateHealth when it changes.
	Ready []func() bool
	// Limiter is set after setup, for extensions' goroutines.
	Limiter *limiter.Limiter
	// Store is the backend's store and Clock the limiter's clock.
	Store store.Store
	Clock store.Clock
	// Quota, if set, serves Envoy's Rate Limit Quota Service on the gRPC
	// port.
	Quota *quota.Service
}

// serving reports whether to serve with config table t: there is one and
// every Ready condition holds.
func (x *serveContext) serving(t *config.Table) bool {
	if t == nil {
		return false
	}
	for _, ok := range x.Ready {
		if !ok() {
			return false
		}
	}
	return true
}

// UpdateHealth sets health from the current config and the Ready
// conditions.
func (x *serveContext) UpdateHealth() { x.Health.SetServing(x.serving(x.Config.Current())) }

func runServe(ctx context.Context, args []string, _, stderr io.Writer) int {
	if err := serve(ctx, args, os.Getenv, stderr, nil); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "sluice serve:", err)
		return 1
	}
	return 0
}

// serve runs until ctx is done, then drains. ready, if not nil, receives
// the bound addresses once both listeners are open (for tests).
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(grpcAddr, httpAddr net.Addr)) error {
	var f serveFlags
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f.register(fs)
	for _, n := range backendNames() {
		if b := backends[n]; b.flags != nil {
			b.flags(fs)
		}
	}
	for _, e := range extensions {
		if e.flags != nil {
			e.flags(fs)
		}
	}
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sluice serve --config PATH | --config-source xds --xds-server ADDR [flags]\n\nEvery flag can also be set as SLUICE_<FLAG> (e.g. SLUICE_GRPC_ADDR).\n\nflags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	warnings, err := applyEnv(fs, getenv)
	if err != nil {
		return err
	}
	logger, err := newLogger(stderr, f.logFormat, f.logLevel)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		logger.Warn(w)
	}
	if getenv("GOGC") == "" {
		// A rate limiter's live heap is small and its garbage is per
		// request: the GC takes 10-15% of the server's CPU under load at
		// GOGC=100, about half that at 200. GOGC overrides it.
		debug.SetGCPercent(serveGCPercent)
	}
	return run(ctx, &f, logger, ready)
}

// serveGCPercent is serve's GOGC unless the environment sets one.
const serveGCPercent = 200

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// limiterOptions checks the policy flags.
func (f *serveFlags) limiterOptions() (limiter.Options, error) {
	o := limiter.Options{MaxDescriptors: f.maxDescriptors, MaxEntries: f.maxEntries, ShadowMode: f.shadowMode, QuotaMode: f.quotaMode}
	switch f.deniedHits {
	case "drop":
	case "saturate":
		o.SaturateDenied = true
	default:
		return o, fmt.Errorf("--denied-hits %q: want drop or saturate", f.deniedHits)
	}
	m, err := limiter.ParseFailureMode(f.failureMode)
	if err != nil {
		return o, fmt.Errorf("--store-failure-mode: %w", err)
	}
	o.FailureMode = m
	if f.maxDescriptors < 1 || f.maxEntries < 1 {
		return o, errors.New("--max-descriptors and --max-entries must be at least 1")
	}
	return o, nil
}

func run(ctx context.Context, f *serveFlags, logger *slog.Logger, ready func(grpcAddr, httpAddr net.Addr)) error {
	lopts, err := f.limiterOptions()
	if err != nil {
		return err
	}
	b, ok := backends[f.store]
	if !ok {
		return fmt.Errorf("--store %q: unknown store (have %s)", f.store, strings.Join(backendNames(), ", "))
	}
	if (f.tlsCert == "") != (f.tlsKey == "") || f.tlsClientCA != "" && f.tlsCert == "" {
		return errors.New("TLS needs both --tls-cert and --tls-key (and --tls-client-ca only with them)")
	}
	if err := f.http.check(); err != nil {
		return err
	}
	if f.maxStreams < 1 || f.maxStreams > 1<<31-1 {
		return errors.New("--grpc-max-concurrent-streams must be between 1 and 2^31-1")
	}

	reloader, err := f.openConfig(logger)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	clock := store.NewWallClock()
	st, closer, storeRun, err := b.open(ctx, logger, clock)
	if err != nil {
		return fmt.Errorf("store %s: %w", f.store, err)
	}
	defer closer.Close()

	health := server.NewHealth()
	x := &serveContext{Logger: logger, Registry: prometheus.NewRegistry(), Config: reloader,
		Health: health, HTTP: http.NewServeMux(), HTTPBounds: f.http, Store: st, Clock: clock}
	if storeRun != nil {
		x.Run = append(x.Run, storeRun)
	}
	if f.source.requireDomain {
		x.Ready = append(x.Ready, func() bool { t := reloader.Current(); return t != nil && len(t.Domains()) > 0 })
	}
	for _, e := range extensions {
		if e.setup == nil {
			continue
		}
		if err := e.setup(ctx, x); err != nil {
			return fmt.Errorf("%s: %w", e.name, err)
		}
	}
	lopts.Observer = observers(x.Observers)
	lopts.Clock = clock
	lim := limiter.New(reloader, st, lopts)
	x.Limiter = lim

	sopts := server.Options{ResponseHeaders: f.responseHeaders, HeaderNames: f.headers,
		IETFHeaders: f.ietfHeaders, DynamicMetadata: f.dynamicMetadata, MaxBodyBytes: f.http.maxBody}
	gopts := server.GRPCOptions{Options: sopts, Logger: logger, MaxRecvMsgSize: f.maxRecvMsgSize,
		MaxConnectionAge: f.maxConnAge, MaxConnectionAgeGrace: f.maxConnAgeGrace,
		KeepaliveTime: f.keepaliveTime, KeepaliveTimeout: f.keepaliveTimeout, MaxConcurrentStreams: uint32(f.maxStreams),
		ServerOptions: x.GRPCOptions, Quota: x.Quota}
	if b.waits {
		gopts.StreamWorkers = blockingWorkers * runtime.GOMAXPROCS(0)
	}
	var root http.Handler = x.HTTP
	if x.HTTPRoot != nil {
		root = x.HTTPRoot
	}
	httpSrv := f.http.server(root, logger, true)
	if f.tlsCert != "" {
		certs, err := server.NewCertReloader(f.tlsCert, f.tlsKey, f.tlsClientCA, logger)
		if err != nil {
			return err
		}
		gopts.TLS = certs.Config()
		if f.tlsHTTP {
			httpSrv.TLSConfig = certs.Config()
		}
	}
	grpcSrv := server.NewGRPC(lim, health, gopts)
	httpHandler := server.NewHTTP(lim, health, sopts)
	for _, p := range httpHandler.Patterns() {
		x.HTTP.Handle(p, httpHandler)
	}

	grpcLis, err := net.Listen("tcp", f.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	httpLis, err := net.Listen("tcp", f.httpAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("--http-addr: %w", err)
	}

	// Serving only with a table: before the first one (--allow-empty-
	// config) health says NOT_SERVING and requests get UNAVAILABLE.
	reloader.OnReload(func(t *config.Table, _ error) { health.SetServing(x.serving(t)) })
	x.UpdateHealth()
	if reloader.Current() == nil {
		logger.Warn("no config loaded yet; NOT_SERVING until one is", "config", f.configName())
	} else if f.source.startWithoutConfig {
		logger.Info("no limits until the first xDS push (--start-without-config)", "config", f.configName())
	}

	var wg sync.WaitGroup
	errc := make(chan error, 4+len(x.Run))
	start := func(name string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := fn(); err != nil {
				errc <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	start("grpc", func() error { return grpcSrv.Serve(grpcLis) })
	start("http", func() error {
		var err error
		if httpSrv.TLSConfig != nil {
			err = httpSrv.ServeTLS(httpLis, "", "")
		} else {
			err = httpSrv.Serve(httpLis)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	})
	start("config watcher", func() error { return reloader.Run(ctx) })
	start("clock", func() error { return reanchor(ctx, clock) })
	for i, fn := range x.Run {
		start(fmt.Sprintf("background task %d", i), func() error { return fn(ctx) })
	}
	logger.Info("serving", "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(),
		"store", f.store, "config", f.configName(), "tls", f.tlsCert != "", "mtls", f.tlsClientCA != "")
	if ready != nil {
		ready(grpcLis.Addr(), httpLis.Addr())
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
		logger.Error("stopping", "err", runErr)
	}

	// Drain: NOT_SERVING first, then stop accepting and let in-flight
	// requests finish within --drain-timeout.
	health.Shutdown()
	logger.Info("draining", "timeout", f.drainTimeout)
	drainCtx, drainCancel := context.WithTimeout(context.Background(), f.drainTimeout)
	defer drainCancel()
	done := make(chan struct{})
	go func() {
		grpcSrv.GracefulStop()
		close(done)
	}()
	httpErr := httpSrv.Shutdown(drainCtx)
	select {
	case <-done:
	case <-drainCtx.Done():
		logger.Warn("drain timeout: closing the remaining gRPC connections")
		grpcSrv.Stop()
		<-done
	}
	if httpErr != nil {
		httpSrv.Close()
	}
	cancel()
	wg.Wait()
	logger.Info("stopped")
	return runErr
}

// reanchor lets the clock follow steps of the system's wall clock.
func reanchor(ctx context.Context, c *store.WallClock) error {
	t := time.NewTicker(10 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.Reanchor()
		}
	}
}

// observers combines the extensions' observers; nil when there are none.
func observers(os []limiter.Observer) limiter.Observer {
	switch len(os) {
	case 0:
		return nil
	case 1:
		return os[0]
	}
	return multiObserver(os)
}

type multiObserver []limiter.Observer

func (m multiObserver) Observe(domain string, entries []config.Entry, rule *config.Rule, st *limiter.Status) {
	for _, o := range m {
		o.Observe(domain, entries, rule, st)
	}
}

func (m multiObserver) StoreFailed(domain string, mode limiter.FailureMode, err error) {
	for _, o := range m {
		o.StoreFailed(domain, mode, err)
	}
}
