package main

import (
	"context"
	"flag"
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/server"
	"github.com/sluicehq/sluice/store"
)

// extension adds to serve from another file of this command (metrics,
// debug endpoints) without serve knowing it, like backends. It registers
// from init; its settings live in the values newSetup binds, one per
// serve invocation.
type extension struct {
	name string
	// newSetup registers the extension's flags on one serve invocation's
	// flag set and returns its setup.
	newSetup func(fs *flag.FlagSet) extensionSetup
}

// extensionSetup runs after flags are parsed and the config is loaded,
// before the servers are built. It may add observers, gRPC options, HTTP
// handlers and goroutines to x.
type extensionSetup func(ctx context.Context, x *serveContext) error

var extensions []extension

func registerExtension(name string, newSetup func(fs *flag.FlagSet) extensionSetup) {
	extensions = append(extensions, extension{name: name, newSetup: newSetup})
}

// serveContext is what the store's setup and the extensions see and
// extend.
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
	// HTTPTLS reports that --http-addr is served over TLS (--tls-cert
	// with --tls-http).
	HTTPTLS bool
	// Observers are told about every decision.
	Observers []limiter.Observer
	// GRPCOptions are added to the gRPC server (stats handlers,
	// interceptors).
	GRPCOptions []grpc.ServerOption
	// Run are started with the serving context; serve waits for them.
	Run []func(ctx context.Context) error
	// Stop run in order once serve has drained and every Run has
	// returned: the last steps that must see every request's work (the
	// store's, then the extensions' in setup order). serve logs their
	// errors.
	Stop []func() error
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
	// Tracing, with a Tracer, traces the servers' calls and the
	// limiter's store calls (--tracing).
	Tracing server.Tracing
	// Counters serves /v1/counters (for the status page's lookup form).
	Counters *server.Counters
	// IgnoredFields counts the fields of Envoy's requests that Sluice
	// does not read.
	IgnoredFields *observe.IgnoredFields
	// Refunds and RefundAuth say who may give usage back (--refunds,
	// the admin token).
	Refunds    server.Refunds
	RefundAuth server.Authorizer
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
