package memcache

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/storetest"
)

// The concurrency cases make round trips per take: smaller than the
// memory store's, still far more takes than budget.
// FixedWindowClockBack is skipped: a fixed window is one key per window,
// so a clock stepped back into an earlier window counts there
// (docs/MEMCACHED.md).
var suiteSizes = storetest.Options{Goroutines: 16, Takes: 250, Budget: 1000,
	Skip: map[string]string{"FixedWindowClockBack": "one key per window: a clock stepped back counts in the earlier window (docs/MEMCACHED.md)"}}

// suiteTimeout is for the conformance suite, which checks decisions, not
// latency: on a busy machine a round trip can take longer than the
// default.
const suiteTimeout = 10 * time.Second

func open(t testing.TB, opt Options) *Store {
	t.Helper()
	st, err := New(context.Background(), opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func TestStoreSuite(t *testing.T) {
	srv := memcachetest.Start(t)
	storetest.RunOptions(t, func(t *testing.T) store.Store {
		return open(t, Options{Servers: []string{srv.Addr}, Timeout: suiteTimeout, CASAttempts: 1000})
	}, suiteSizes)
}
