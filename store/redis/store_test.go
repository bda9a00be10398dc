package redis

import (
	"testing"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

// The concurrency cases make a round trip per take: smaller than the
// memory store's, still far more takes than budget.
var suiteSizes = storetest.Options{Goroutines: 16, Takes: 250, Budget: 1000}

func TestStoreSuite(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range []struct {
		name string
		opt  Options
	}{
		{"Single", Options{URL: "redis://" + srv.Addr}},
		{"SingleNoLocalCache", Options{URL: "redis://" + srv.Addr, NoLocalCache: true}},
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
	storetest.RunOptions(t, func(t *testing.T) store.Store { return open(t, Options{ClusterAddrs: cl.Seeds()}) }, suiteSizes)
}
