package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"sort"

	"github.com/sluicehq/sluice/store"
)

// backend is a store that `sluice serve --store NAME` can run on. Each
// backend registers itself by name from init in its own file, so serve
// knows nothing about any one of them; its settings live in the value
// that newConfig returns, one per serve invocation, so two servers in one
// process do not share them.
type backend struct {
	name string
	// newConfig registers the backend's flags on one serve invocation's
	// flag set (their SLUICE_* environment variables follow from the flag
	// names) and returns the values they are parsed into.
	newConfig func(fs *flag.FlagSet) storeConfig
	// refVars are envoyproxy/ratelimit's environment variables of this
	// store: rows of the table that maps the reference's environment onto
	// serve's flags (refTable), kept next to the backend's code.
	refVars []refVar
	// waits reports that a Take waits on the network: serve then keeps
	// blockingWorkers gRPC stream workers per CPU instead of one (see
	// server.GRPCOptions.StreamWorkers).
	waits bool
	// shared reports that the store's counters are shared with other
	// processes (Redis, memcached): --key-format reference applies to it.
	// The memory store shares nothing with the reference's pods, and its
	// keys stay Sluice's whatever --key-format says (a reference key leaves
	// the unit and the window's start to the store, which it would not add).
	shared bool
}

// storeConfig is one serve invocation's settings of a backend.
type storeConfig interface {
	// open builds the store after flags are parsed. clock is the one the
	// limiter reads each request's now from.
	open(ctx context.Context, logger *slog.Logger, clock store.Clock) (openStore, error)
}

// openStore is a store that serve runs on, with what serve does with it.
type openStore struct {
	store.Store
	// closer releases the store at shutdown.
	closer io.Closer
	// run, if not nil, is started by serve with the serving context
	// (health probes, sweepers) and returns when ctx ends.
	run func(ctx context.Context) error
	// setup, if not nil, runs once serve's context exists, before the
	// extensions': the store's metrics, and conditions of health.
	setup func(x *serveContext) error
	// stop, if not nil, runs once serve has drained and every task has
	// returned: the memory store writes its snapshot.
	stop func() error
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

func backendNames() []string {
	names := make([]string, 0, len(backends))
	for n := range backends {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
