package main

import (
	"context"
	"flag"
	"io"
	"log/slog"

	"github.com/sluicehq/sluice/store"
)

// backend is a store that `sluice serve --store NAME` can run on. Each
// backend registers itself from init in its own file, so serve knows
// nothing about any one of them.
type backend struct {
	name string
	// flags registers the backend's own flags on serve's flag set. Their
	// SLUICE_* environment variables follow from the flag names.
	flags func(fs *flag.FlagSet)
	// refEnv maps envoyproxy/ratelimit's environment variables onto the
	// backend's flags: it reads with getenv and calls set(flag, value)
	// for each variable it honours. An error refuses a setting the
	// backend cannot honour. serve applies it only to flags not set by a
	// flag or a SLUICE_* variable.
	refEnv func(getenv func(string) string, set func(flag, value string)) error
	// open builds the store after flags are parsed. clock is the one the
	// limiter reads each request's now from. The closer releases the
	// store at shutdown; run, if not nil, is started by serve with the
	// serving context (health probes, sweepers) and returns when ctx ends.
	open func(ctx context.Context, logger *slog.Logger, clock store.Clock) (st store.Store, closer io.Closer, run func(ctx context.Context) error, err error)
	// waits reports that a Take waits on the network: serve then keeps
	// blockingWorkers gRPC stream workers per CPU instead of one (see
	// server.GRPCOptions.StreamWorkers).
	waits bool
}

// blockingWorkers is the gRPC stream workers per CPU for a store that
// waits on the network: about the requests in flight per CPU of a busy
// server. On the load benchmark (Redis store, two cores) 64 workers took
// Sluice's CPU per request down by 4–20 % against 2.
const blockingWorkers = 32

var backends = map[string]backend{}

func registerBackend(b backend) {
	if _, dup := backends[b.name]; dup {
		panic("sluice: backend registered twice: " + b.name)
	}
	backends[b.name] = b
}
