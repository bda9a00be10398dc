package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// incrNow is in the window of an hour starting at 1795928400.
const incrNow = int64(1795930033) * int64(time.Second)

// plainHits are vetoing hits of cost costs[i] on keys in the reference's
// layout, by r.
func plainHits(r *store.Rule, keys []string, costs ...uint64) []store.Hit {
	hits := make([]store.Hit, len(keys))
	for i, k := range keys {
		hits[i] = store.Hit{Key: k, Rule: r, Cost: costs[i], Veto: true, Plain: true}
	}
	return hits
}

// TestIncr_Combined: requests on keys in the reference's layout queued
// together go out in one pipeline of INCRBYs and PEXPIREs, no script: of
// eight requests of one on two keys of limit 5, five are allowed, the
// three denied are given back in one script call, and the keys end
// holding 5, with the reference's expiry.
func TestIncr_Combined(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "rl:", NoLocalCache: true})
	r := must(store.NewFixedWindow(5, time.Hour))
	keys := []string{"d_a_", "d_b_"}
	ogWarm(t, s) // (loads take.lua: no NOSCRIPT below)
	incrs, scripts := callsOf(t, srv, "incrby"), scriptCalls(t, srv)
	release := holdComb(&s.incr)
	const n = 8
	outs := make([][]store.Decision, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range outs {
		outs[i] = make([]store.Decision, 2)
		wg.Go(func() { errs[i] = s.Take(context.Background(), incrNow, plainHits(r, keys, 1, 1), outs[i]) })
		queuedComb(t, &s.incr, i+1)
	}
	release()
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if allowed := allOrNothing(t, outs); allowed != 5 {
		t.Errorf("%d requests allowed on a limit of 5, want 5", allowed)
	}
	if got := callsOf(t, srv, "incrby") - incrs; got != 2*n {
		t.Errorf("%d INCRBYs for %d requests of 2 keys, want %d", got, n, 2*n)
	}
	if got := scriptCalls(t, srv) - scripts; got != 1 {
		t.Errorf("%d script calls, want 1: the refund of the 3 denied requests", got)
	}
	for _, k := range keys {
		key := "rl:" + k + "1795928400"
		if got := srv.CLI("GET", key); got != "5" {
			t.Errorf("%s = %q, want 5", key, got)
		}
		if ttl, err := strconv.Atoi(srv.CLI("PTTL", key)); err != nil || ttl <= 0 || ttl > 3600_000 {
			t.Errorf("%s: PTTL %d (%v), want the reference's expiry, an hour at most", key, ttl, err)
		}
	}
}

// TestIncr_GivesBack: a request that does not fit leaves its keys as they
// were, whichever hit denies it; a cost past the limit and a check write
// nothing; a key holding no count fails the request and the increments
// before it are given back.
func TestIncr_GivesBack(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "rl:", NoLocalCache: true})
	r := must(store.NewFixedWindow(5, time.Hour))
	key := func(k string) string { return "rl:" + k + "1795928400" }
	srv.CLI("SET", key("a"), "2")
	srv.CLI("SET", key("full"), "5")
	srv.CLI("SET", key("bad"), "x")
	ctx := context.Background()
	take := func(keys []string, costs ...uint64) ([]store.Decision, error) {
		out := make([]store.Decision, len(keys))
		return out, s.Take(ctx, incrNow, plainHits(r, keys, costs...), out)
	}
	for _, c := range []struct {
		keys  []string
		costs []uint64
	}{
		{[]string{"a", "full"}, []uint64{1, 1}},
		{[]string{"full", "a"}, []uint64{1, 3}},
		{[]string{"a", "b"}, []uint64{1, 6}}, // (a cost past the limit: GETs only)
		{[]string{"a"}, []uint64{4}},
	} {
		incrs := callsOf(t, srv, "incrby")
		out, err := take(c.keys, c.costs...)
		if err != nil || out[0].Allowed && out[len(out)-1].Allowed {
			t.Errorf("%v costs %v: %+v %v, want denied", c.keys, c.costs, out, err)
		}
		if out[0].Remaining != 5-min(5, map[string]uint64{"a": 2, "full": 5, "b": 0}[c.keys[0]]) {
			t.Errorf("%v costs %v: %+v, want the first key's remaining as it was", c.keys, c.costs, out)
		}
		if c.costs[len(c.costs)-1] > 5 && callsOf(t, srv, "incrby") != incrs {
			t.Errorf("%v costs %v: INCRBY sent for a request that cannot fit", c.keys, c.costs)
		}
		if got := srv.CLI("GET", key("a")); got != "2" {
			t.Fatalf("%v costs %v: a = %q after the denial, want 2", c.keys, c.costs, got)
		}
	}
	if got := srv.CLI("EXISTS", key("b")); got != "0" {
		t.Errorf("b exists (%s) after a request that could not fit", got)
	}
	// A check writes nothing.
	if out, err := take([]string{"c"}, 0); err != nil || !out[0].Allowed || out[0].Remaining != 5 {
		t.Errorf("check on c: %+v %v, want allowed, 5 remaining", out, err)
	}
	if got := srv.CLI("EXISTS", key("c")); got != "0" {
		t.Errorf("c exists (%s) after a check", got)
	}
	// A key that holds no count fails the request; a's take is given
	// back, whichever comes first.
	for bad, keys := range [][]string{{"bad", "a"}, {"a", "bad"}} {
		_, err := take(keys, 1, 1)
		var he *store.HitError
		if !errors.As(err, &he) || keys[he.Index] != "bad" {
			t.Errorf("take on %v, bad holding x: %v, want a HitError on hit %d", keys, err, bad)
		}
		if got := srv.CLI("GET", key("a")); got != "2" {
			t.Errorf("a = %q after a failed request on %v, want 2", got, keys)
		}
	}
	if out, err := take([]string{"a"}, 3); err != nil || !out[0].Allowed || out[0].Remaining != 0 {
		t.Errorf("take of 3 on a at 2: %+v %v, want allowed, 0 remaining", out, err)
	}
	if st := s.Stats(); st.RefundFailures != 0 {
		t.Errorf("%d refunds failed", st.RefundFailures)
	}
}

// TestIncr_Late: a request whose deadline passes while Redis holds its
// INCRBYs fails, and once Redis answers, what it took is still given back
// (it does not fit): nothing stays counted for a request no one was told
// was allowed, unlike the reference's pods.
func TestIncr_Late(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "rl:", NoLocalCache: true})
	r := must(store.NewFixedWindow(5, time.Hour))
	a, full := "rl:a1795928400", "rl:full1795928400"
	srv.CLI("SET", a, "2")
	srv.CLI("SET", full, "5")
	ogWarm(t, s)
	incrs := callsOf(t, srv, "incrby")
	srv.CLI("CLIENT", "PAUSE", "20000", "WRITE")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := s.Take(ctx, incrNow, plainHits(r, []string{"a", "full"}, 1, 1), make([]store.Decision, 2))
	srv.CLI("CLIENT", "UNPAUSE")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Take while Redis is paused: %v, want the deadline's error", err)
	}
	// The INCRBYs ran once Redis answered (the request was sent, not cut
	// short before), and were given back.
	for start := time.Now(); callsOf(t, srv, "incrby") < incrs+2 || srv.CLI("GET", a) != "2"; {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("%d INCRBYs, a = %s 30 s after Redis answered, want 2 INCRBYs, a given back to 2",
				callsOf(t, srv, "incrby")-incrs, srv.CLI("GET", a))
		}
	}
	if got := srv.CLI("GET", full); got != "5" {
		t.Errorf("full = %q, want 5", got)
	}
	if st := s.Stats(); st.RefundFailures != 0 {
		t.Errorf("%d refunds failed", st.RefundFailures)
	}
}

// TestLocalCache_IncrHold: an entry of a key in the reference's layout
// lapses within hold (another instance's increments of a request that
// does not fit may be in the count it was cached from, until given back),
// one in Sluice's layout at its reset.
func TestLocalCache_IncrHold(t *testing.T) {
	c := newOverCache(time.Second, false)
	r := must(store.NewFixedWindow(1, time.Hour))
	full := store.State{Word: r.WindowEnd(incrNow)<<32 | 1}
	for _, plain := range []bool{true, false} {
		hits := []store.Hit{{Key: "k", Rule: r, Cost: 1, Veto: true, Plain: plain}}
		c.update(incrNow, nil, hits, []string{"k"}, []store.State{full})
		e, ok := c.m.Load("k")
		want := incrNow + int64(time.Second)
		if !plain {
			want = int64(r.WindowEnd(incrNow)) * int64(time.Second)
		}
		if !ok || e.until != want {
			t.Errorf("plain %v: cached %v until %d, want until %d", plain, ok, e.until, want)
		}
	}
}
