package limiter_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/redis/rueidis"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/store"
	smemcache "github.com/sluicehq/sluice/store/memcache"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// refBackend is a shared store as the reference's pods see it (raw
// commands: INCRBY and EXPIRE, or memcached's ADD and INCR) and a way to
// open a Sluice store on it.
type refBackend struct {
	open func(t *testing.T) (store.Store, func())
	incr func(t *testing.T, key string, n uint64, ttl int64) // the reference's write
	get  func(t *testing.T, key string) (count string, ttl int64)
}

func redisBackend(t *testing.T, seeds []string, prefix string, cluster bool) refBackend {
	raw, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: seeds, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(raw.Close)
	ctx := context.Background()
	return refBackend{
		open: func(t *testing.T) (store.Store, func()) {
			opt := redis.Options{KeyPrefix: prefix, Timeout: time.Minute, RefundTimeout: time.Minute}
			if cluster {
				opt.ClusterAddrs = seeds
			} else {
				opt.URL = "redis://" + seeds[0]
			}
			octx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			st, err := redis.New(octx, opt)
			if err != nil {
				t.Fatal(err)
			}
			return st, func() { st.Close() }
		},
		incr: func(t *testing.T, key string, n uint64, ttl int64) {
			// src/redis/fixed_cache_impl.go, pipelineAppend: INCRBY then EXPIRE.
			if err := raw.Do(ctx, raw.B().Incrby().Key(key).Increment(int64(n)).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if err := raw.Do(ctx, raw.B().Expire().Key(key).Seconds(ttl).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		},
		get: func(t *testing.T, key string) (string, int64) {
			v, err := raw.Do(ctx, raw.B().Get().Key(key).Build()).ToString()
			if rueidis.IsRedisNil(err) {
				return "", 0
			} else if err != nil {
				t.Fatal(err)
			}
			ttl, err := raw.Do(ctx, raw.B().Ttl().Key(key).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			return v, ttl
		},
	}
}

func memcacheBackend(t *testing.T, addr, prefix string) refBackend {
	raw := memcache.New(addr)
	raw.Timeout = time.Minute
	return refBackend{
		open: func(t *testing.T) (store.Store, func()) {
			st, err := smemcache.New(context.Background(), smemcache.Options{Servers: []string{addr}, KeyPrefix: prefix, Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			return st, func() { st.Close() }
		},
		incr: func(t *testing.T, key string, n uint64, ttl int64) {
			// src/memcached/cache_impl.go, increaseAsync: INCR, ADD on a
			// miss.
			if _, err := raw.Increment(key, n); errors.Is(err, memcache.ErrCacheMiss) {
				err = raw.Add(&memcache.Item{Key: key, Value: []byte(strconv.FormatUint(n, 10)), Expiration: int32(ttl)})
				if err != nil {
					t.Fatal(err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
		},
		get: func(t *testing.T, key string) (string, int64) {
			it, err := raw.Get(key)
			if errors.Is(err, memcache.ErrCacheMiss) {
				return "", 0
			} else if err != nil {
				t.Fatal(err)
			}
			return string(it.Value), -1
		},
	}
}

const mixedLimits = `
domain: api
descriptors:
  - {key: m, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: mo, rate_limit: {unit: month, requests_per_unit: 5}}
`

// TestPlainKey_MixedFleet: Sluice with ReferenceKeys continues from the
// counts the reference wrote, writes where the reference reads, and two
// Sluice instances, the reference's raw writes and a restart in the
// middle count every hit once, on Redis (single, and Cluster with a
// prefix) and memcached.
func TestPlainKey_MixedFleet(t *testing.T) {
	backends := map[string]func(t *testing.T) (refBackend, string){
		"redis": func(t *testing.T) (refBackend, string) {
			srv := redistest.Start(t)
			return redisBackend(t, []string{srv.Addr}, "", false), ""
		},
		"redis cluster with a prefix": func(t *testing.T) (refBackend, string) {
			if testing.Short() {
				t.Skip("starts a Redis Cluster")
			}
			cl := redistest.StartCluster(t, 3)
			return redisBackend(t, cl.Seeds(), "rl:", true), "rl:"
		},
		"memcached with a prefix": func(t *testing.T) (refBackend, string) {
			srv := memcachetest.Start(t)
			return memcacheBackend(t, srv.Addr, "rl:"), "rl:"
		},
	}
	for name, start := range backends {
		t.Run(name, func(t *testing.T) {
			b, prefix := start(t)
			clock := &fakeClock{}
			clock.now.Store(plainNow * 1e9)
			tab := tables{loadTable(t, mixedLimits)}
			newLim := func(st store.Store) *limiter.Limiter {
				return limiter.New(tab, st, limiter.Options{Clock: clock, ReferenceKeys: true})
			}
			check := func(t *testing.T, step string, lim *limiter.Limiter, key string, wantOK bool, wantRemaining uint32) {
				t.Helper()
				var resp limiter.Response
				err := lim.Check(context.Background(), &limiter.Request{Domain: "api", Descriptors: []limiter.Descriptor{desc(key, "x")}}, &resp)
				if err != nil {
					t.Fatalf("%s: Check: %v", step, err)
				}
				st := resp.Statuses[0]
				if (st.Code == limiter.OK) != wantOK || st.Remaining() != wantRemaining {
					t.Errorf("%s: code %v remaining %d, want OK %v remaining %d", step, st.Code, st.Remaining(), wantOK, wantRemaining)
				}
			}
			minute := prefix + "api_m_x_1795930020"
			month := prefix + "api_mo_x_1793664000"
			// The reference's pods counted 3 this minute and 4 this month.
			b.incr(t, minute, 3, 60+17)
			b.incr(t, month, 4, 2592000)

			stA, closeA := b.open(t)
			a := newLim(stA)
			stB, closeB := b.open(t)
			defer closeB()
			bl := newLim(stB)
			check(t, "A continues the minute", a, "m", true, 1)
			if v, ttl := b.get(t, minute); v != "4" || ttl > 60 || ttl == 0 {
				t.Errorf("after A: %s = %q TTL %d, want 4 with the unit's TTL (60 s, no jitter)", minute, v, ttl)
			}
			check(t, "A continues the month", a, "mo", true, 0)
			if v, _ := b.get(t, month); v != "5" {
				t.Errorf("after A: %s = %q, want 5", month, v)
			}
			check(t, "B sees the month spent", bl, "mo", false, 0)
			if v, _ := b.get(t, month); v != "5" {
				t.Errorf("a denied take changed %s: %q, want 5", month, v)
			}
			// All or nothing: the spent month denies the request, the
			// minute is given back (take.lua's batch; on Cluster, a
			// refund of the minute's slot).
			var resp limiter.Response
			req := &limiter.Request{Domain: "api", Descriptors: []limiter.Descriptor{desc("m", "x"), desc("mo", "x")}}
			if err := bl.Check(context.Background(), req, &resp); err != nil || resp.Overall == limiter.OK {
				t.Errorf("B's request of both: %v, overall %v, want over limit", err, resp.Overall)
			}
			if v, _ := b.get(t, minute); v != "4" {
				t.Errorf("a denied request changed %s: %q, want 4", minute, v)
			}
			b.incr(t, minute, 1, 60) // a reference pod's hit
			check(t, "B after the reference's hit", bl, "m", false, 0)

			// A restarts.
			closeA()
			stA, closeA = b.open(t)
			defer closeA()
			a = newLim(stA)
			check(t, "A after its restart", a, "m", false, 0)
			if v, _ := b.get(t, minute); v != "5" {
				t.Errorf("%s = %q, want 5: every hit counted once", minute, v)
			}
			// A peek (hits_addend 0) at the limit passes, as the
			// reference's count + 0 > limit says; past it, it does not.
			// Neither writes.
			peek := func(step string, wantOK bool) {
				t.Helper()
				d := desc("m", "x")
				d.HasCost = true
				var resp limiter.Response
				if err := a.Check(context.Background(), &limiter.Request{Domain: "api", Descriptors: []limiter.Descriptor{d}}, &resp); err != nil {
					t.Fatalf("%s: Check: %v", step, err)
				}
				if st := resp.Statuses[0]; (st.Code == limiter.OK) != wantOK || st.Remaining() != 0 {
					t.Errorf("%s: code %v remaining %d, want OK %v remaining 0", step, st.Code, st.Remaining(), wantOK)
				}
			}
			peek("a peek at the limit", true)
			b.incr(t, minute, 1, 60) // a reference pod's denied hit, counted
			peek("a peek past the limit", false)
			if v, _ := b.get(t, minute); v != "6" {
				t.Errorf("peeks changed %s: %q, want 6", minute, v)
			}

			// The next minute is a new key, counted by all.
			clock.advance(time.Minute)
			next := prefix + "api_m_x_1795930080"
			check(t, "A in the next minute", a, "m", true, 4)
			b.incr(t, next, 1, 60)
			check(t, "B in the next minute", bl, "m", true, 2)
			if v, _ := b.get(t, next); v != "3" {
				t.Errorf("%s = %q, want 3", next, v)
			}
		})
	}
}
