package redis

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

// The concurrency cases make a round trip per take: smaller than the
// memory store's, still far more takes than budget.
var suiteSizes = storetest.Options{Goroutines: 16, Takes: 250, Budget: 1000}

// suiteTimeout is for the conformance suite, which checks decisions, not
// latency: on a busy machine a call (or a Cluster refund) can take longer
// than the defaults, and a Take that fails or a refund that gives up
// (leaving its hits counted, by design: docs/REDIS.md) would fail the
// case for the machine's sake. The fault and chaos tests test the
// timeouts.
const suiteTimeout = time.Minute

func TestStoreSuite(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range []struct {
		name string
		opt  Options
	}{
		{"Single", Options{URL: "redis://" + srv.Addr, Timeout: suiteTimeout}},
		{"SingleNoLocalCache", Options{URL: "redis://" + srv.Addr, NoLocalCache: true, Timeout: suiteTimeout}},
	} {
		t.Run(c.name, func(t *testing.T) {
			storetest.RunOptions(t, func(t *testing.T) store.Store { return open(t, c.opt) }, suiteSizes)
		})
	}
}

func TestStoreSuite_Cluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	storetest.RunOptions(t, func(t *testing.T) store.Store {
		return open(t, Options{ClusterAddrs: cl.Seeds(), Timeout: suiteTimeout, RefundTimeout: suiteTimeout})
	}, suiteSizes)
}
