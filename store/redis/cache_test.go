package redis

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestLocalCache: once a key is over its limit, a request on it is
// answered without Redis until the window ends, with the decision Redis
// would give; without the cache, every request asks Redis.
func TestLocalCache(t *testing.T) {
	srv := redistest.Start(t)
	r := must(store.NewFixedWindow(2, time.Minute))
	t0 := int64(1_800_000_000) * int64(time.Second) // a minute boundary
	for _, cached := range []bool{true, false} {
		s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: !cached})
		hits := []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true}}
		out := make([]store.Decision, 1)
		for range 2 {
			if err := s.Take(context.Background(), t0, hits, out); err != nil || !out[0].Allowed {
				t.Fatalf("cached %v: %+v %v", cached, out[0], err)
			}
		}
		before := commandCalls(t, srv).calls
		for i := range 3 {
			if err := s.Take(context.Background(), t0+int64(i)*int64(time.Second), hits, out); err != nil {
				t.Fatal(err)
			}
			want := store.Decision{Limit: 2, ResetAfter: time.Minute - time.Duration(i)*time.Second, Local: cached}
			want.RetryAfter = want.ResetAfter
			if out[0] != want {
				t.Fatalf("cached %v, denial %d: %+v, want %+v", cached, i, out[0], want)
			}
		}
		calls := commandCalls(t, srv).calls - before
		if cached && calls != 0 {
			t.Errorf("with the cache: %d Redis commands for 3 requests on a key over its limit, want 0", calls)
		}
		if st := s.Stats(); cached && (st.LocalAnswers != 3 || st.LocalKeys != 1) {
			t.Errorf("with the cache: %+v, want 3 local answers and 1 key", st)
		}
		if !cached && calls < 3 {
			t.Errorf("without the cache: %d Redis commands for 3 requests, want at least 3", calls)
		}
		// The next window is Redis's again.
		if err := s.Take(context.Background(), t0+int64(time.Minute), hits, out); err != nil || !out[0].Allowed {
			t.Fatalf("cached %v, next window: %+v %v", cached, out[0], err)
		}
	}
}

func TestLocalCache_Sweep(t *testing.T) {
	c := newOverCache(0, false)
	r := must(store.NewFixedWindow(1, time.Minute))
	c.m.Store("a", overEntry{rule: r, until: 100})
	c.m.Store("b", overEntry{rule: r, until: 200})
	c.sweep(150)
	if _, ok := c.m.Load("a"); ok {
		t.Error("a lapsed at 100 and is still cached at 150")
	}
	if _, ok := c.m.Load("b"); !ok {
		t.Error("b holds until 200 and was dropped at 150")
	}
}

// TestTake_KeysNotRetained: a caller may reuse the memory of a hit's Key
// once Take returns; the local cache must not see the change.
func TestTake_KeysNotRetained(t *testing.T) {
	srv := redistest.Start(t)
	// No prefix (open would set one): the keys are the hits' own. The
	// takes must succeed, and the first dials: a minute, as open gives
	// (a busy machine stalls this process past a second now and then).
	s, err := New(context.Background(), Options{URL: "redis://" + srv.Addr, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r := must(store.NewFixedWindow(1, time.Minute))
	buf := []byte("key-a")
	key := unsafe.String(&buf[0], len(buf))
	out := make([]store.Decision, 1)
	now := int64(1_800_000_000) * int64(time.Second)
	for range 2 { // the second take puts key-a over its limit in the cache
		if err := s.Take(context.Background(), now, []store.Hit{{Key: key, Rule: r, Cost: 1, Veto: true}}, out); err != nil {
			t.Fatal(err)
		}
	}
	copy(buf, "key-b")
	before := s.Stats().LocalAnswers
	if err := s.Take(context.Background(), now, []store.Hit{{Key: "key-a", Rule: r, Cost: 1, Veto: true}}, out); err != nil || out[0].Allowed {
		t.Fatalf("key-a over its limit: %+v %v", out[0], err)
	}
	if s.Stats().LocalAnswers != before+1 {
		t.Error("key-a, over its limit, was not answered by the local cache: its entry changed with the caller's buffer")
	}
}

// TestLocalCache_ClusterHold: on Cluster, replica A caches a key as over
// its limit from a state that holds replica B's take of a request that
// another slot then denies. B refunds the take and Redis has the limit
// again; A's entry lapses at the latest when such a hold can have ended
// (Timeout + RefundTimeout after it was cached), not when the window
// does (an hour here): then A asks Redis and is allowed.
func TestLocalCache_ClusterHold(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	opt := Options{ClusterAddrs: cl.Seeds(), KeyPrefix: "rh:", Timeout: time.Minute, RefundTimeout: time.Minute}
	a, b := open(t, opt), open(t, opt)
	fw := must(store.NewFixedWindow(5, time.Hour))
	one := must(store.NewFixedWindow(1, time.Hour))
	tags := ogTags(2) // k's and j's slots, on two nodes
	k, j := tags[0]+"k", tags[1]+"j"
	ctx := context.Background()
	take := func(s *Store, hits ...store.Hit) []store.Decision {
		t.Helper()
		out := make([]store.Decision, len(hits))
		if err := s.Take(ctx, ogNow, hits, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	owner := func(key string) *redistest.Server {
		for _, n := range cl.Nodes {
			if n.CLI("cluster", "countkeysinslot", strconv.Itoa(int(slot(key)))) == "1" {
				return n
			}
		}
		t.Fatalf("no node holds %s", key)
		return nil
	}
	// take.lua loaded on every node, as in a fleet that has run a while:
	// a slot's NOSCRIPT would wait for the paused node's answer below.
	for _, n := range cl.Nodes {
		n.CLI("script", "load", takeLua)
	}
	take(b, store.Hit{Key: j, Rule: one, Cost: 1, Veto: true}) // j full
	take(a, store.Hit{Key: k, Rule: fw, Cost: 1, Veto: true})  // k: 1 of 5
	jNode, kNode := owner("rh:"+j), owner("rh:"+k)
	if jNode == kNode {
		t.Fatal("k and j on one node")
	}
	jNode.Pause()
	resumed := false
	defer func() {
		if !resumed {
			jNode.Resume()
		}
	}()
	// B: k cost 4 (commits in k's slot), j cost 1 (denied once j's node answers).
	done := make(chan []store.Decision, 1)
	go func() {
		out := make([]store.Decision, 2)
		if err := b.Take(ctx, ogNow, []store.Hit{{Key: k, Rule: fw, Cost: 4, Veto: true}, {Key: j, Rule: one, Cost: 1, Veto: true}}, out); err != nil {
			t.Error(err)
		}
		done <- out
	}()
	for deadline := time.Now().Add(30 * time.Second); !strings.HasSuffix(kNode.CLI("get", "rh:"+k), ":5"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("B's take of k not applied: k holds %q", kNode.CLI("get", "rh:"+k))
		}
	}
	// A: k cost 1, denied by B's hold; A caches k as over.
	if d := take(a, store.Hit{Key: k, Rule: fw, Cost: 1, Veto: true}); d[0].Allowed {
		t.Fatalf("A during B's hold: %+v, want denied", d[0])
	}
	jNode.Resume()
	resumed = true
	if out := <-done; out[1].Allowed || out[0].Local {
		t.Fatalf("B: %+v, want j denied by Redis", out)
	}
	if d := take(b, store.Hit{Key: k, Rule: fw, Veto: true}); d[0].Remaining != 4 {
		t.Fatalf("peek k after B's refund: %+v, want 4 remaining", d[0])
	}
	hold := int64(opt.Timeout + opt.RefundTimeout)
	if d := take(a, store.Hit{Key: k, Rule: fw, Cost: 1, Veto: true}); d[0].Allowed || !d[0].Local {
		t.Errorf("A's take of k just after B's refund: %+v, want denied by its cache until the hold can have ended", d[0])
	}
	for i := range 3 {
		at := ogNow + hold + int64(i)
		out := make([]store.Decision, 1)
		if err := a.Take(ctx, at, []store.Hit{{Key: k, Rule: fw, Cost: 1, Veto: true}}, out); err != nil {
			t.Fatal(err)
		} else if !out[0].Allowed || out[0].Local {
			t.Errorf("A's take %d of k %v after it cached it, with 4 of 5 left in Redis: %+v", i, time.Duration(hold), out[0])
		}
	}
}
