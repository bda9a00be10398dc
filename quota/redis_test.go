package quota

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// The Redis store's Demand is a Fleet.
var _ Fleet = (*redis.Demand)(nil)

// openRedis opens a store on the redis-server at addr, closed when the test
// ends.
func openRedis(t *testing.T, addr string) *redis.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := redis.New(ctx, redis.Options{URL: "redis://" + addr, KeyPrefix: "s:", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestRedisFleet_StalesOnlyTheFailedGroup: two replicas (services sharing
// demand through one Redis, store/redis's Demand) divide two limits
// between their proxies; then one limit's hash gets the wrong type. The
// other limit stays divided over the fleet, and only the broken one falls
// back to the cautious part (its share of the reserve) once its last
// claim is stale.
func TestRedisFleet_StalesOnlyTheFailedGroup(t *testing.T) {
	srv := redistest.Start(t)
	tb := &tables{}
	tb.p.Store(loadTable(t, "domain: d\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 1000}\n"))
	type replica struct {
		q         *Service
		good, bad *Stream
	}
	var rs []replica
	for _, name := range []string{"a", "b"} {
		q := New(tb, Options{Fleet: openRedis(t, srv.Addr).Demand(name, 3*time.Second)})
		r := replica{q: q}
		r.good, _ = q.Open()
		r.bad, _ = q.Open()
		rs = append(rs, r)
	}
	held := map[*Stream]uint64{}
	var tickErr error
	second := func(sec int) {
		t.Helper()
		now := t0.Add(time.Duration(sec) * time.Second)
		for _, r := range rs {
			for st, v := range map[*Stream]string{r.good: "good", r.bad: "bad"} {
				u := Usage{Bucket: map[string]string{"tenant": v}, Elapsed: time.Second, Allowed: 5000}
				if err := st.Report(now, "d", []Usage{u}); err != nil {
					t.Fatal(err)
				}
			}
		}
		for i, r := range rs {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			tickErr = r.q.Tick(ctx, now.Add(time.Duration(300*(i+1))*time.Millisecond))
			cancel()
			for _, st := range []*Stream{r.good, r.bad} {
				for _, a := range st.Pending() {
					held[st] = a.Requests
				}
			}
		}
	}
	for sec := range 3 {
		second(sec)
	}
	for i, r := range rs {
		if held[r.good] != 490 || held[r.bad] != 490 {
			t.Fatalf("replica %d: good %d, bad %d, want 490 each", i, held[r.good], held[r.bad])
		}
	}
	var bad string
	for _, k := range strings.Fields(srv.CLI("KEYS", "s:rlqs:*tenant=bad*")) {
		bad = k
	}
	if bad == "" {
		t.Fatal("no hash for tenant=bad")
	}
	srv.CLI("DEL", bad)
	srv.CLI("SET", bad, "a string")
	for sec := 3; sec < 8; sec++ {
		second(sec)
	}
	if tickErr == nil || !strings.Contains(tickErr.Error(), "WRONGTYPE") {
		t.Errorf("Tick: %v, want the failed claim", tickErr)
	}
	for i, r := range rs {
		if held[r.good] != 490 || held[r.bad] != 10 {
			t.Errorf("replica %d with tenant=bad's hash broken for 5 s: good %d, want 490; bad %d, want 10 (the reserve of 20 over 2 replicas)",
				i, held[r.good], held[r.bad])
		}
	}
}
