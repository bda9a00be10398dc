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
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/observe/tracing"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
)

func init() {
	register(command{name: "serve", summary: "run the rate-limit service (Envoy RLS v3, sluice.v1, HTTP)", run: runServe})
	register(command{name: "ratelimit", summary: "serve as envoyproxy/ratelimit's binary: arguments serve does not know are ignored", run: runRatelimit})
}

func runServe(ctx context.Context, args []string, _, stderr io.Writer) int {
	return exitCode(serve(ctx, args, os.Getenv, stderr, nil), "sluice serve:", stderr)
}

func runRatelimit(ctx context.Context, args []string, _, stderr io.Writer) int {
	return exitCode(serveRef(ctx, args, os.Getenv, stderr, nil), "ratelimit:", stderr)
}

func exitCode(err error, prefix string, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	}
	fmt.Fprintln(stderr, prefix, err)
	return 1
}

// serve runs until ctx is done, then drains. ready, if not nil, receives
// the bound addresses once both listeners are open (for tests).
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(grpcAddr, httpAddr net.Addr)) error {
	return newServeCmd(stderr).serve(ctx, args, getenv, stderr, ready)
}

// serveRef is serve as envoyproxy/ratelimit's binary runs: the reference
// reads only its environment and ignores its arguments (Envoy AI
// Gateway's QuotaPolicy Deployment passes --quotaRateLimitServiceHost), so
// the flags serve does not know, and positional arguments, are dropped
// and named in one warning (refArgs); the flags it knows still apply.
func serveRef(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(grpcAddr, httpAddr net.Addr)) error {
	c := newServeCmd(stderr)
	args, c.ignored = refArgs(c.fs, args)
	return c.serve(ctx, args, getenv, stderr, ready)
}

func (c *serveCmd) serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer, ready func(grpcAddr, httpAddr net.Addr)) error {
	logger, err := c.parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	if getenv("GOGC") == "" {
		// A rate limiter's live heap is small and its garbage is per
		// request: the GC takes 10-15% of the server's CPU under load at
		// GOGC=100, about half that at 200. GOGC overrides it.
		debug.SetGCPercent(serveGCPercent)
	}
	return c.run(ctx, logger, ready)
}

// serveGCPercent is serve's GOGC unless the environment sets one.
const serveGCPercent = 200

// serveCmd is one serve invocation: its flag set and the values every
// flag is parsed into, serve's own, each backend's and each extension's,
// so two invocations in one process share none of them.
type serveCmd struct {
	fs      *flag.FlagSet
	flags   serveFlags
	stores  map[string]storeConfig // by backend name
	exts    []namedSetup           // in the extensions' order
	ignored ignoredArgs            // dropped by refArgs, to warn of
	// clock is the clock run counts with; nil means a new wall clock.
	// Tests share one among several invocations and move it forward
	// (AtLeast) to end a window without waiting for it.
	clock *store.WallClock
}

type namedSetup struct {
	name  string
	setup extensionSetup
}

// newServeCmd registers serve's flags, the backends' and the extensions'
// on a new flag set.
func newServeCmd(stderr io.Writer) *serveCmd {
	c := &serveCmd{fs: flag.NewFlagSet("serve", flag.ContinueOnError), stores: map[string]storeConfig{}}
	c.fs.SetOutput(stderr)
	c.flags.register(c.fs)
	for _, n := range backendNames() {
		c.stores[n] = backends[n].newConfig(c.fs)
	}
	for _, e := range extensions {
		c.exts = append(c.exts, namedSetup{e.name, e.newSetup(c.fs)})
	}
	c.fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: sluice serve --config PATH | --config-source xds --xds-server ADDR [flags]\n\nEvery flag can also be set as SLUICE_<FLAG> (e.g. SLUICE_GRPC_ADDR).\n\nflags:")
		c.fs.PrintDefaults()
	}
	return c
}

// parse parses args, then the environment (applyEnv), and returns the
// logger the flags ask for, with the environment's warnings logged.
func (c *serveCmd) parse(args []string, getenv func(string) string, stderr io.Writer) (*slog.Logger, error) {
	if err := c.fs.Parse(args); err != nil {
		return nil, err
	}
	if c.fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %q", c.fs.Args())
	}
	warnings, err := applyEnv(c.fs, getenv)
	if err != nil {
		return nil, err
	}
	logger, err := newLogger(stderr, c.flags.logFormat, c.flags.logLevel)
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		logger.Warn(w)
	}
	if len(c.ignored.flags) > 0 || c.ignored.positional > 0 {
		logger.Warn("arguments ignored: envoyproxy/ratelimit reads only its environment (values not shown)",
			"flags", strings.Join(c.ignored.flags, " "), "positional", c.ignored.positional)
	}
	return logger, nil
}

// run serves until ctx is done, in steps: check the flags, open the
// config, open the store, set up the extensions, build the limiter and
// the servers, start them, wait, drain, run the stop steps (the store's
// and the extensions').
func (c *serveCmd) run(ctx context.Context, logger *slog.Logger, ready func(grpcAddr, httpAddr net.Addr)) error {
	f := &c.flags
	lopts, b, err := f.check()
	if err != nil {
		return err
	}
	reloader, err := f.openConfig(logger)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	clock := c.clock
	if clock == nil {
		clock = store.NewWallClock()
	}
	st, err := c.openStore(ctx, logger, clock)
	if err != nil {
		return err
	}
	defer st.closer.Close()
	x, err := c.setup(ctx, logger, reloader, st, clock)
	if err != nil {
		return err
	}
	lim := buildLimiter(x, lopts, f.store)
	srv, err := f.newServers(x, lim, b.waits)
	if err != nil {
		return err
	}
	if err := srv.listen(f.grpcAddr, f.httpAddr, f.grpcSocketMode); err != nil {
		return err
	}
	f.followConfig(x)
	t := srv.start(ctx, x, clock)
	logger.Info("serving", "grpc", srv.grpcLis.Addr().String(), "http", srv.httpLis.Addr().String(),
		"store", f.store, "config", f.configName(), "tls", f.tlsCert != "", "mtls", f.tlsClientCA != "")
	if ready != nil {
		ready(srv.grpcLis.Addr(), srv.httpLis.Addr())
	}
	runErr := t.wait(ctx, logger)
	srv.drain(x.Health, f.drainTimeout, logger)
	cancel()
	t.wg.Wait()
	for _, stop := range x.Stop {
		if err := stop(); err != nil {
			logger.Error("stop", "err", err)
		}
	}
	logger.Info("stopped")
	return runErr
}

// openStore opens the store of --store with that backend's flags.
func (c *serveCmd) openStore(ctx context.Context, logger *slog.Logger, clock store.Clock) (openStore, error) {
	st, err := c.stores[c.flags.store].open(ctx, logger, clock)
	if err != nil {
		return openStore{}, fmt.Errorf("store %s: %w", c.flags.store, err)
	}
	return st, nil
}

// setup builds the context the store and the extensions extend, and
// runs their setups.
func (c *serveCmd) setup(ctx context.Context, logger *slog.Logger, reloader *config.Reloader, st openStore, clock store.Clock) (*serveContext, error) {
	x := &serveContext{Logger: logger, Registry: prometheus.NewRegistry(), Config: reloader,
		Health: server.NewHealth(), HTTP: http.NewServeMux(), HTTPBounds: c.flags.http, Store: st.Store, Clock: clock,
		HTTPTLS: c.flags.tlsCert != "" && c.flags.tlsHTTP}
	// Fields Sluice does not use, of pushed configs and of requests.
	ignored, err := observe.NewConfigIgnoredFields(x.Registry)
	if err != nil {
		return nil, err
	}
	c.flags.source.ignored.Store(ignored)
	if x.IgnoredFields, err = observe.NewRequestIgnoredFields(x.Registry, logger); err != nil {
		return nil, err
	}
	if st.run != nil {
		x.Run = append(x.Run, st.run)
	}
	if st.stop != nil {
		x.Stop = append(x.Stop, st.stop)
	}
	if c.flags.source.requireDomain {
		x.Ready = append(x.Ready, func() bool { t := reloader.Current(); return t != nil && len(t.Domains()) > 0 })
	}
	if st.setup != nil {
		if err := st.setup(x); err != nil {
			return nil, fmt.Errorf("%s: %w", c.flags.store, err)
		}
	}
	for _, e := range c.exts {
		if err := e.setup(ctx, x); err != nil {
			return nil, fmt.Errorf("%s: %w", e.name, err)
		}
	}
	return x, nil
}

// buildLimiter builds the limiter on x's config and store (of kind
// storeKind, traced with x.Tracing), telling the extensions' observers
// about every decision.
func buildLimiter(x *serveContext, o limiter.Options, storeKind string) *limiter.Limiter {
	o.Observer = observers(x.Observers)
	o.Clock = x.Clock
	st := x.Store
	if x.Tracing.Tracer != nil {
		st = tracing.Store(st, x.Tracing.Tracer, storeKind)
	}
	x.Limiter = limiter.New(x.Config, st, o)
	return x.Limiter
}

// servers are serve's gRPC and HTTP servers and, once listen has
// succeeded, their listeners.
type servers struct {
	grpc             *grpc.Server
	http             *http.Server
	grpcLis, httpLis net.Listener
}

// newServers builds the gRPC and HTTP servers of lim, and mounts the
// HTTP API on x.HTTP. waits is the backend's (blockingWorkers).
func (f *serveFlags) newServers(x *serveContext, lim *limiter.Limiter, waits bool) (*servers, error) {
	sopts := server.Options{ResponseHeaders: f.responseHeaders, HeaderNames: f.headers,
		IETFHeaders: f.ietfHeaders, DynamicMetadata: f.dynamicMetadata, MaxBodyBytes: f.http.maxBody, Tracing: x.Tracing,
		OnIgnoredField: x.IgnoredFields.Field}
	sopts.Refunds, sopts.RefundAuth = x.Refunds, x.RefundAuth
	gopts := server.GRPCOptions{Options: sopts, Logger: x.Logger, MaxRecvMsgSize: f.maxRecvMsgSize,
		MaxConnectionAge: f.maxConnAge, MaxConnectionAgeGrace: f.maxConnAgeGrace,
		KeepaliveTime: f.keepaliveTime, KeepaliveTimeout: f.keepaliveTimeout, MaxConcurrentStreams: uint32(f.maxStreams),
		ServerOptions: x.GRPCOptions, Quota: x.Quota}
	if waits {
		gopts.StreamWorkers = blockingWorkers * runtime.GOMAXPROCS(0)
	}
	var root http.Handler = x.HTTP
	if x.HTTPRoot != nil {
		root = x.HTTPRoot
	}
	httpSrv := f.http.server(root, x.Logger, true)
	if f.tlsCert != "" {
		certs, err := server.NewCertReloaderSAN(f.tlsCert, f.tlsKey, f.tlsClientCA, f.tlsClientSAN, x.Logger)
		if err != nil {
			return nil, err
		}
		gopts.TLS = certs.Config()
		if f.tlsHTTP {
			httpSrv.TLSConfig = certs.Config()
		}
	}
	grpcSrv := server.NewGRPC(lim, x.Health, gopts)
	httpHandler := server.NewHTTP(lim, x.Health, sopts)
	for _, p := range httpHandler.Patterns() {
		x.HTTP.Handle(p, httpHandler)
	}
	return &servers{grpc: grpcSrv, http: httpSrv}, nil
}

// listen opens the servers' listeners: gRPC's on a unix socket when
// grpcAddr is unix://PATH (see listenUnix), with socketMode.
func (s *servers) listen(grpcAddr, httpAddr string, socketMode socketMode) error {
	var err error
	if path, ok := strings.CutPrefix(grpcAddr, "unix://"); ok {
		s.grpcLis, err = listenUnix(path, socketMode)
	} else {
		s.grpcLis, err = net.Listen("tcp", grpcAddr)
	}
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	if s.httpLis, err = net.Listen("tcp", httpAddr); err != nil {
		s.grpcLis.Close()
		return fmt.Errorf("--http-addr: %w", err)
	}
	return nil
}

// followConfig makes health follow the config: serving only with a
// table, so before the first one (--allow-empty-config) health says
// NOT_SERVING and requests get UNAVAILABLE. With --xds-overlay it adds the
// overlay's watcher to the tasks.
func (f *serveFlags) followConfig(x *serveContext) {
	x.Config.OnReload(func(t *config.Table, _ error) { x.Health.SetServing(x.serving(t)) })
	x.UpdateHealth()
	if p := f.source.xdsOverlay; p != "" {
		x.Run = append(x.Run, func(ctx context.Context) error { return x.Config.RunOverlay(ctx, p) })
	}
	if x.Config.Current() == nil {
		x.Logger.Warn("no config loaded yet; NOT_SERVING until one is", "config", f.configName())
	} else if f.source.startWithoutConfig {
		x.Logger.Info("no limits until the first xDS push (--start-without-config)", "config", f.configName())
	}
}

// tasks are serve's goroutines: the servers, the config watcher, the
// clock and the Run of the store and the extensions.
type tasks struct {
	wg   sync.WaitGroup
	errc chan error
}

// start starts the servers on their listeners and every other task.
func (s *servers) start(ctx context.Context, x *serveContext, clock *store.WallClock) *tasks {
	t := &tasks{errc: make(chan error, 4+len(x.Run))}
	t.start("grpc", func() error { return s.grpc.Serve(s.grpcLis) })
	t.start("http", s.serveHTTP)
	t.start("config watcher", func() error { return x.Config.Run(ctx) })
	t.start("clock", func() error { return reanchor(ctx, clock) })
	for i, fn := range x.Run {
		t.start(fmt.Sprintf("background task %d", i), func() error { return fn(ctx) })
	}
	return t
}

func (t *tasks) start(name string, fn func() error) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		if err := fn(); err != nil {
			t.errc <- fmt.Errorf("%s: %w", name, err)
		}
	}()
}

// wait returns nil when ctx is done, or the error of the first task
// that fails.
func (t *tasks) wait(ctx context.Context, logger *slog.Logger) error {
	select {
	case <-ctx.Done():
		return nil
	case err := <-t.errc:
		logger.Error("stopping", "err", err)
		return err
	}
}

func (s *servers) serveHTTP() error {
	var err error
	if s.http.TLSConfig != nil {
		err = s.http.ServeTLS(s.httpLis, "", "")
	} else {
		err = s.http.Serve(s.httpLis)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// drain stops the servers: NOT_SERVING first, then stop accepting and
// let in-flight requests finish within timeout (--drain-timeout).
func (s *servers) drain(health *server.Health, timeout time.Duration, logger *slog.Logger) {
	health.Shutdown()
	logger.Info("draining", "timeout", timeout)
	drainCtx, drainCancel := context.WithTimeout(context.Background(), timeout)
	defer drainCancel()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	httpErr := s.http.Shutdown(drainCtx)
	select {
	case <-done:
	case <-drainCtx.Done():
		logger.Warn("drain timeout: closing the remaining gRPC connections")
		s.grpc.Stop()
		<-done
	}
	if httpErr != nil {
		s.http.Close()
	}
}

// reanchor lets the clock follow steps of the system's wall clock.
func reanchor(ctx context.Context, c *store.WallClock) error {
	return every(ctx, 10*time.Second, c.Reanchor)
}

// every calls fn every d until ctx ends: a long-lived task of serve's.
func every(ctx context.Context, d time.Duration, fn func()) error {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			fn()
		}
	}
}
