package redis

import (
	"context"
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
	c := newOverCache()
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
