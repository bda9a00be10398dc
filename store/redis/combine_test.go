package redis

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// hold makes s's combiner queue every Take, as if maxSenders calls were in
// flight, until the returned release runs flush.
func hold(s *Store) (release func()) { return holdComb(&s.comb) }

// holdComb does what hold does for cb. It first waits for a flusher that
// took over the last call's place (see release) to end.
func holdComb(cb *combiner) (release func()) {
	for start := time.Now(); ; runtime.Gosched() {
		cb.mu.Lock()
		if cb.busy == 0 {
			break
		}
		cb.mu.Unlock()
		if time.Since(start) > 30*time.Second {
			panic("the combiner stays busy")
		}
	}
	cb.busy = maxSenders
	cb.mu.Unlock()
	return func() {
		cb.flush()
		cb.mu.Lock()
		cb.busy = 0
		cb.mu.Unlock()
	}
}

// queued waits until n Takes are queued in s's combiner.
func queued(t *testing.T, s *Store, n int) { t.Helper(); queuedComb(t, &s.comb, n) }

// queuedComb waits until n Takes are queued in cb.
func queuedComb(t *testing.T, cb *combiner, n int) {
	t.Helper()
	for start := time.Now(); ; runtime.Gosched() {
		cb.mu.Lock()
		q := len(cb.queue)
		cb.mu.Unlock()
		if q == n {
			return
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("%d Takes queued, want %d", q, n)
		}
	}
}

// TestTake_CombinedCluster: on Cluster, concurrent requests whose keys are
// all in one hash slot share that slot's window.lua calls: eight requests
// queued there go in one EVALSHA (to the node that owns the slot), all or
// nothing each, and no more than the limit is granted; a request across
// slots is not combined (take.lua, one call per slot).
func TestTake_CombinedCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	s := open(t, Options{ClusterAddrs: cl.Seeds(), NoLocalCache: true})
	r := must(store.NewFixedWindow(5, time.Hour))
	a, b := "{c}a", "{c}b"
	warm(t, s, r, a, b)
	if s.combinerFor([]string{a, "{d}b"}) != nil {
		t.Fatal("keys of two slots share a combiner")
	}
	cb := s.combinerFor([]string{a})
	if cb == nil || cb == &s.comb || s.combinerFor([]string{b}) != cb {
		t.Fatal("keys of one slot: not its own combiner")
	}
	calls := func() (n int) {
		for _, node := range cl.Nodes {
			n += scriptCalls(t, node)
		}
		return n
	}
	now := time.Now().UnixNano()
	release := holdComb(cb)
	const n = 8
	outs := make([][]store.Decision, n)
	errs := make(chan error, n)
	for i := range outs {
		outs[i] = make([]store.Decision, 2)
		go func() {
			errs <- s.Take(context.Background(), now, []store.Hit{{Key: a, Rule: r, Cost: 1, Veto: true}, {Key: b, Rule: r, Cost: 1, Veto: true}}, outs[i])
		}()
	}
	queuedComb(t, cb, n)
	before := calls()
	release()
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if c := calls() - before; c != 1 {
		t.Errorf("%d script calls for %d requests queued on one slot, want 1", c, n)
	}
	if allowed := allOrNothing(t, outs); allowed != 5 {
		t.Errorf("%d requests allowed on a limit of 5 (each takes 1 of both keys), want 5", allowed)
	}
}

// allOrNothing checks that each request's decisions, outs[i], are all
// allowed or all denied, and returns how many requests were allowed.
func allOrNothing(t *testing.T, outs [][]store.Decision) (allowed int) {
	t.Helper()
	for i, out := range outs {
		for _, d := range out[1:] {
			if d.Allowed != out[0].Allowed {
				t.Errorf("request %d: %+v, want every hit allowed or every one denied", i, out)
				break
			}
		}
		if out[0].Allowed {
			allowed++
		}
	}
	return allowed
}

// TestTake_Combined sends rounds of window requests on shared keys as one
// window.lua call each (forced by holding the combiner), at clocks that
// differ (some in the next window): every decision must be the memory
// store's for the same requests taken one after the other in queue order,
// and each request's final states the replay's (Take checks those). The
// clocks only go forward in queue order: a request behind a key's window
// leaves the call for take.lua (TestTake_CombinedLater).
func TestTake_Combined(t *testing.T) {
	srv := redistest.Start(t)
	for seed := range uint64(6) {
		rng := rand.New(rand.NewPCG(seed, 7))
		// (The local cache would answer some requests before they queue.)
		s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: true})
		mem := memory.New(memory.Options{})
		var rules []*store.Rule
		for len(rules) < 6 {
			if r := randomRules(rng, 1)[0]; r.Algorithm() == store.FixedWindow && !r.Wide() {
				rules = append(rules, r)
			}
		}
		names := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
		now := int64(1_800_000_000_000_000_000) + rng.Int64N(int64(time.Hour))
		for round := range 60 {
			m := 2 + rng.IntN(10)
			nows := make([]int64, m)
			reqs := make([][]store.Hit, m)
			for j := range reqs {
				if rng.IntN(4) == 0 {
					now += rng.Int64N(int64(time.Second))
				}
				nows[j] = now
				for _, k := range rng.Perm(len(names))[:1+rng.IntN(4)] {
					reqs[j] = append(reqs[j], store.Hit{Key: names[k], Rule: rules[k], Cost: randomCost(rng, rules[k]), Veto: true})
				}
			}
			release := hold(s)
			got := make([][]store.Decision, m)
			errs := make([]error, m)
			var wg sync.WaitGroup
			for j := range reqs {
				got[j] = make([]store.Decision, len(reqs[j]))
				wg.Go(func() { errs[j] = s.Take(context.Background(), nows[j], reqs[j], got[j]) })
				queued(t, s, j+1)
			}
			release()
			wg.Wait()
			for j := range reqs {
				if errs[j] != nil {
					t.Fatalf("seed %d round %d request %d: %v", seed, round, j, errs[j])
				}
				want := make([]store.Decision, len(reqs[j]))
				if err := mem.Take(context.Background(), nows[j], reqs[j], want); err != nil {
					t.Fatal(err)
				}
				for i := range want {
					got[j][i].Local = false // a local answer is still the same decision
					if got[j][i] != want[i] {
						t.Fatalf("seed %d round %d request %d of %d hit %d (%s %v cost %d): got %+v, memory store %+v",
							seed, round, j, m, i, reqs[j][i].Key, reqs[j][i].Rule, reqs[j][i].Cost, got[j][i], want[i])
					}
				}
			}
		}
	}
}

// TestTake_CombinedAbandoned: a Take whose context ends while it is queued
// returns at once, its request is never sent, and the store goes on
// answering.
func TestTake_CombinedAbandoned(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: true})
	r := must(store.NewFixedWindow(10, time.Minute))
	now := time.Now().UnixNano()
	hits := []store.Hit{{Key: "a", Rule: r, Cost: 1, Veto: true}}
	release := hold(s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Take(ctx, now, hits, make([]store.Decision, 1)) }()
	queued(t, s, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned Take: %v, want context.Canceled", err)
	}
	release()
	out := make([]store.Decision, 1)
	if err := s.Take(context.Background(), now, hits, out); err != nil || !out[0].Allowed || out[0].Remaining != 9 {
		t.Fatalf("next Take: %+v %v, want allowed with 9 remaining (the abandoned one not counted)", out[0], err)
	}
}

// TestTake_CombinedDeadlines: each queued Take fails at its own deadline,
// and a call carrying one that queued long runs to the others' deadline:
// with Redis answering nothing past the old Take's deadline but not the
// new one's, the old fails and the new succeeds. Redis is stopped until
// the old Take has failed, so the outcome does not depend on how fast
// this machine is; the old Take's 2 s only has to outlast the few steps
// between its start and the combined call's (were it to fail while still
// queued, the test would pass without having sent it in that call).
func TestTake_CombinedDeadlines(t *testing.T) {
	srv := redistest.Start(t)
	// The Take's ceiling is the callers' deadlines here, not Timeout.
	s := open(t, Options{URL: "redis://" + srv.Addr, Timeout: time.Minute, NoLocalCache: true, BreakerFailures: 1 << 30})
	r := must(store.NewFixedWindow(10, time.Hour))
	now := time.Now().UnixNano()
	take := func(ctx context.Context, key string, res chan<- error) {
		res <- s.Take(ctx, now, []store.Hit{{Key: key, Rule: r, Cost: 1, Veto: true}}, make([]store.Decision, 1))
	}
	warm(t, s, r, "old", "new")
	oldCtx, cancelOld := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancelOld()
	newCtx, cancelNew := context.WithTimeout(context.Background(), time.Minute)
	defer cancelNew()
	release := hold(s)
	oldRes, newRes := make(chan error, 1), make(chan error, 1)
	go take(oldCtx, "old", oldRes)
	queued(t, s, 1)
	go take(newCtx, "new", newRes)
	queued(t, s, 2)
	srv.Pause()
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	released := make(chan struct{})
	go func() { defer close(released); release() }()
	if err := <-oldRes; !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("old Take: %v, want its deadline exceeded", err)
	}
	srv.Resume()
	resumed = true
	if err := <-newRes; err != nil {
		t.Errorf("new Take: %v, want success once Redis answers before its deadline", err)
	}
	<-released
}

// TestTake_CombinedLater: in one call, a request whose key holds a later
// window (written by an earlier request of the same call, from a clock
// ahead) writes nothing there and is taken by take.lua after the call; the
// others commit in the call. The decisions are the memory store's for the
// order that makes: A, C, then B.
func TestTake_CombinedLater(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: true})
	mem := memory.New(memory.Options{})
	fw := must(store.NewFixedWindow(3, time.Second))
	now := int64(1_800_000_000)*int64(time.Second) + int64(200*time.Millisecond)
	reqs := []struct {
		name string
		now  int64
		hits []store.Hit
	}{
		{"A", now + int64(time.Second), []store.Hit{{Key: "x", Rule: fw, Cost: 2, Veto: true}}},
		{"B", now, []store.Hit{{Key: "y", Rule: fw, Cost: 1, Veto: true}, {Key: "x", Rule: fw, Cost: 1, Veto: true}}},
		{"C", now, []store.Hit{{Key: "y", Rule: fw, Cost: 2, Veto: true}}},
	}
	release := hold(s)
	got := make([][]store.Decision, len(reqs))
	errs := make([]error, len(reqs))
	var wg sync.WaitGroup
	for j, r := range reqs {
		got[j] = make([]store.Decision, len(r.hits))
		wg.Go(func() { errs[j] = s.Take(context.Background(), r.now, r.hits, got[j]) })
		queued(t, s, j+1)
	}
	before := scriptCalls(t, srv)
	release()
	wg.Wait()
	if calls := scriptCalls(t, srv) - before; calls != 2 {
		t.Errorf("%d script calls, want 2: window.lua for all three, take.lua for B", calls)
	}
	for _, j := range []int{0, 2, 1} {
		if errs[j] != nil {
			t.Fatalf("%s: %v", reqs[j].name, errs[j])
		}
		want := make([]store.Decision, len(reqs[j].hits))
		if err := mem.Take(context.Background(), reqs[j].now, reqs[j].hits, want); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if got[j][i] != want[i] {
				t.Errorf("%s hit %d: got %+v, memory store %+v", reqs[j].name, i, got[j][i], want[i])
			}
		}
	}
}

// scriptCalls returns how many scripts Redis has run.
func scriptCalls(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	return callsOf(t, srv, "evalsha")
}

// callsOf is the number of calls of command (lower case) srv ran.
func callsOf(t *testing.T, srv *redistest.Server, command string) int {
	t.Helper()
	n := 0
	for _, line := range strings.Split(srv.CLI("info", "commandstats"), "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+command+":calls="); ok {
			v, _, _ := strings.Cut(rest, ",")
			var err error
			if n, err = strconv.Atoi(v); err != nil {
				t.Fatal(err)
			}
		}
	}
	return n
}

// TestTake_CombinedBadValue: a key holding a value no script wrote fails
// only the requests on it, not the others of its call (whose writes Redis
// would keep while they answer an error).
func TestTake_CombinedBadValue(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: true})
	fw := must(store.NewFixedWindow(10, time.Hour))
	now := time.Now().UnixNano()
	// "big" counts this window past any fixed window's count (2^32).
	big := strconv.FormatUint(windowEnd(fw, now), 10) + ":4294967296"
	for key, v := range map[string]string{"count": "100:x", "end": "x:1", "big": big} {
		if out := srv.CLI("set", s.opt.KeyPrefix+key, v); out != "OK" {
			t.Fatalf("SET %s: %q", key, out)
		}
	}
	keys := []string{"a", "count", "end", "big", "d"}
	release := hold(s)
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for j, k := range keys {
		wg.Go(func() {
			errs[j] = s.Take(context.Background(), now, []store.Hit{{Key: k, Rule: fw, Cost: 1, Veto: true}}, make([]store.Decision, 1))
		})
		queued(t, s, j+1)
	}
	release()
	wg.Wait()
	for j, k := range keys {
		if bad := k == "count" || k == "end" || k == "big"; (errs[j] != nil) != bad {
			t.Errorf("%s: %v, want an error only for a bad value", k, errs[j])
		}
		// (naming the count, never the key, which holds descriptor values)
		if k == "big" && (errs[j] == nil || !strings.Contains(errs[j].Error(), "holds 4294967296") || strings.Contains(errs[j].Error(), "big")) {
			t.Errorf("big: %v, want an error naming the count and not the key", errs[j])
		}
	}
	for _, k := range []string{"a", "d"} {
		if v := srv.CLI("get", s.opt.KeyPrefix+k); !strings.HasSuffix(v, ":1") {
			t.Errorf("%s holds %q, want one hit counted", k, v)
		}
	}
}

// TestTake_CombinedFullBatch: while a call is in flight, Takes queue for
// the next one, until a full batch (maxBatchKeys) is waiting: that batch
// goes at once in a second call. With the first call never returning,
// one Take short of a full batch stays queued; the one that fills it sends
// them all, in one call.
func TestTake_CombinedFullBatch(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: true, Timeout: time.Minute})
	r := must(store.NewFixedWindow(10, time.Hour))
	now := time.Now().UnixNano()
	s.comb.mu.Lock()
	s.comb.busy = 1 // a call in flight that never returns
	s.comb.mu.Unlock()
	before := scriptCalls(t, srv)
	errs := make([]error, maxBatchKeys)
	var wg sync.WaitGroup
	for j := range errs {
		if j == len(errs)-1 {
			queued(t, s, j) // (a second call would have taken some)
			if n := scriptCalls(t, srv) - before; n != 0 {
				t.Fatalf("%d script calls before a full batch, want 0", n)
			}
		}
		wg.Go(func() {
			errs[j] = s.Take(context.Background(), now, []store.Hit{{Key: "k" + strconv.Itoa(j), Rule: r, Cost: 1, Veto: true}}, make([]store.Decision, 1))
		})
	}
	wg.Wait() // (would hang without the second call)
	for j, err := range errs {
		if err != nil {
			t.Fatalf("Take %d: %v", j, err)
		}
	}
	if n := scriptCalls(t, srv) - before; n != 1 {
		t.Errorf("%d script calls for a full batch, want 1", n)
	}
	s.comb.mu.Lock()
	defer s.comb.mu.Unlock()
	if s.comb.busy != 1 || len(s.comb.queue) != 0 || s.comb.queued != 0 {
		t.Errorf("after the batch: %d busy, %d queued (%d keys), want the one call and nothing queued", s.comb.busy, len(s.comb.queue), s.comb.queued)
	}
}
