package main

import (
	"context"
	"errors"
	"flag"
	"fmt"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/server"
)

// The counter endpoints on the HTTP port: GET/POST /v1/counters (a lookup
// that consumes nothing) and POST /v1/counters/reset, on with
// --admin-token-file. They register before the status page (files
// initialise in name order), whose lookup form calls them.
func init() {
	registerExtension("counters", func(fs *flag.FlagSet) extensionSetup {
		f := &countersServeFlags{}
		fs.StringVar(&f.tokenFile, "admin-token-file", "", "turn on POST /v1/counters/reset: it needs \"Authorization: Bearer TOKEN\", TOKEN being this `file`'s content (at least 16 bytes, read again when the file changes); off by default")
		fs.StringVar(&f.refunds, "refunds", "allow", "who may give usage back (is_negative_hits, COST_KIND_REFUND): allow (anyone, as anyone may send hits), token (callers sending \"authorization: Bearer\" the admin token of --admin-token-file) or deny (no one)")
		return f.setup
	})
}

type countersServeFlags struct {
	tokenFile string
	refunds   string
}

func (f *countersServeFlags) setup(_ context.Context, x *serveContext) error {
	rules := perRule(x) // sluice_counter_resets_total, dropped with the rules that leave the config
	if rules == nil {
		return errors.New("the counter endpoints need the per-rule counters")
	}
	refunds, err := server.ParseRefunds(f.refunds)
	if err != nil {
		return fmt.Errorf("--refunds %q: want allow, token or deny", f.refunds)
	}
	if refunds == server.RefundsToken && f.tokenFile == "" {
		return errors.New("--refunds token needs --admin-token-file")
	}
	x.Refunds = refunds
	opts := server.CountersOptions{Logger: x.Logger, MaxBodyBytes: x.HTTPBounds.maxBody, OnReset: rules.Reset}
	if f.tokenFile != "" {
		tok, err := newAdminToken(f.tokenFile, x.Logger)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		opts.Auth = tok
		x.RefundAuth = tok
		x.Logger.Info("counter resets on: POST /v1/counters/reset needs the admin token", "token_file", f.tokenFile)
		if !x.HTTPTLS {
			x.Logger.Warn("counter resets over plain HTTP: the admin token crosses the network in the clear on every reset; " +
				"serve HTTP over TLS (--tls-cert, --tls-http) or keep --http-addr on a private network")
		}
	}
	x.Counters = server.NewCounters(lateLimiter{x}, opts)
	for _, p := range x.Counters.Patterns() {
		x.HTTP.Handle(p, x.HTTPBounds.browser(x.Counters))
	}
	return nil
}

// lateLimiter is x's limiter, which serve builds after the extensions'
// setup and before it serves a request.
type lateLimiter struct{ x *serveContext }

func (l lateLimiter) Counters(ctx context.Context, req *limiter.Request) ([]limiter.Lookup, error) {
	return l.x.Limiter.Counters(ctx, req)
}

func (l lateLimiter) Reset(ctx context.Context, req *limiter.Request) ([]limiter.Lookup, error) {
	return l.x.Limiter.Reset(ctx, req)
}

func (l lateLimiter) Bounds() (descriptors, entries int) {
	return l.x.Limiter.Bounds()
}
