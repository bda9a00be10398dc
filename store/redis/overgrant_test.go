package redis

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// The over-grant tests run several Stores (Sluice replicas) on one Redis,
// or one Redis Cluster, each with many goroutines sending concurrent
// requests of 1–4 vetoing takes (costs 1–3) on a small pool of keys with
// small limits, all at one instant (ogNow): no time passes for the
// algorithms, so the bounds below are exact. Each round starts every
// goroutine at once on fresh keys (the pool's names with the round's
// number), so that every round begins with requests racing for the same
// capacity.
const (
	ogReplicas   = 3  // Stores on the same Redis
	ogGoroutines = 8  // per Store
	ogRounds     = 12 // fresh keys each
	ogRequests   = 10 // per goroutine and round
)

// ogNow is the one instant of every request: the start of an hour (and of
// a day), so windows of an hour or a day end far from it, and keys expire
// (by Redis's own clock) long after the test.
const ogNow = int64(1_800_000_000-1_800_000_000%86400) * int64(time.Second)

// ogKey is a key of the pool: its name without the round, its rule, and
// whether it is in envoyproxy/ratelimit's layout (store.Hit.Plain).
type ogKey struct {
	name  string
	rule  *store.Rule
	plain bool
	tag   int // its hash tag's index on Cluster (keys of a tag share a slot)
}

// ogRequest is one request a replica sent and what it answered.
type ogRequest struct {
	keys  []int // into the pool
	costs []uint64
	out   []store.Decision
	err   error // its deadline passed (ogCase.deadlines)
}

// ogCase is one run: the replicas, a reader (a Store without local cache
// that peeks at the keys after each round), the pool, and on Cluster the
// number of hash tags (half of the requests then take keys of one tag
// only, half any keys, mostly in several slots).
type ogCase struct {
	replicas []*Store
	reader   *Store
	pool     []ogKey
	tags     int
	// serial: every request is applied atomically in one place (a single
	// Redis runs each request in one script, one after the other), so each
	// key's committed takes tile its count from 0.
	serial bool
	// deadlines gives half of the requests a deadline of 20 µs to 2 ms.
	// One whose deadline passes fails, and may have taken all the same
	// (its call committed after it gave up: an over-deny, never an
	// over-grant): a key then counts at least what was granted, and on a
	// single Redis its committed takes are disjoint instead of tiling.
	deadlines bool
}

// ogTally counts what the requests of a run got.
type ogTally struct {
	committed, denied, local int
	failed                   int // out of time (ogCase.deadlines)
	// refunded counts denied requests in which every hit of some slot
	// fitted: that slot's script committed and was refunded (Cluster).
	refunded int
}

// ogReplicasOn opens n Stores sharing one key prefix (so they count in
// the same keys), every other one without local cache, and a reader
// without.
func ogReplicasOn(t *testing.T, opt Options, n int) (replicas []*Store, reader *Store) {
	t.Helper()
	opt.KeyPrefix = "og" + strconv.FormatInt(prefixes.Add(1), 10) + ":"
	// (a busy machine may stall a call or a refund past the defaults: a
	// failed Take, or a refund given up, would fail the accounting for
	// the machine's sake; the fault tests test the timeouts)
	opt.Timeout, opt.RefundTimeout = time.Minute, time.Minute
	for i := range n {
		o := opt
		o.NoLocalCache = i%2 == 1
		replicas = append(replicas, open(t, o))
	}
	opt.NoLocalCache = true
	return replicas, open(t, opt)
}

// run sends the rounds and checks each one; it returns the tally.
func (c *ogCase) run(t *testing.T, seed uint64) ogTally {
	t.Helper()
	var tally ogTally
	for round := range ogRounds {
		names := make([]string, len(c.pool))
		for i, k := range c.pool {
			names[i] = k.name + "/r" + strconv.Itoa(round)
		}
		reqs := c.round(t, seed+uint64(round), names)
		if t.Failed() {
			return tally
		}
		c.check(t, round, names, reqs, &tally)
		if t.Failed() {
			return tally
		}
	}
	return tally
}

// round starts every replica's goroutines at once and returns their
// requests.
func (c *ogCase) round(t *testing.T, seed uint64, names []string) []ogRequest {
	var wg sync.WaitGroup
	start := make(chan struct{})
	got := make([][]ogRequest, len(c.replicas)*ogGoroutines)
	for si, s := range c.replicas {
		for g := range ogGoroutines {
			idx := si*ogGoroutines + g
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(seed, uint64(idx)))
				mine := make([]ogRequest, 0, ogRequests)
				<-start
				for range ogRequests {
					r := c.request(rng)
					hits := make([]store.Hit, len(r.keys))
					for i, k := range r.keys {
						hits[i] = store.Hit{Key: names[k], Rule: c.pool[k].rule, Cost: r.costs[i], Veto: true, Plain: c.pool[k].plain}
					}
					ctx, cancel := context.WithCancel(context.Background())
					if c.deadlines && rng.IntN(2) == 0 {
						ctx, cancel = context.WithTimeout(ctx, 20*time.Microsecond+time.Duration(rng.Int64N(int64(2*time.Millisecond))))
					}
					r.err = s.Take(ctx, ogNow, hits, r.out)
					cancel()
					if r.err != nil && !(c.deadlines && outOfTime(r.err)) {
						t.Errorf("replica %d: Take: %v", si, r.err)
						return
					}
					mine = append(mine, r)
				}
				got[idx] = mine
			})
		}
	}
	close(start)
	wg.Wait()
	return slices.Concat(got...)
}

// outOfTime reports whether err says a call ran out of time: the caller's
// deadline, or a dial that it cut short (a network timeout).
func outOfTime(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// request draws a request: 1–4 keys (on Cluster, half of the time 1–3 of
// one tag), each of cost 1–3; one request in eight names its first key
// once more at its end (two descriptors whose rules share a key), which
// take.lua runs.
func (c *ogCase) request(rng *rand.Rand) ogRequest {
	var cand []int
	if c.tags > 0 && rng.IntN(2) == 0 {
		tag := rng.IntN(c.tags)
		for i, k := range c.pool {
			if k.tag == tag {
				cand = append(cand, i)
			}
		}
	} else {
		cand = rng.Perm(len(c.pool))
	}
	rng.Shuffle(len(cand), func(i, j int) { cand[i], cand[j] = cand[j], cand[i] })
	keys := cand[:min(1+rng.IntN(4), len(cand))]
	if len(keys) < 4 && rng.IntN(8) == 0 {
		keys = append(keys, keys[0])
	}
	n := len(keys)
	r := ogRequest{keys: keys, costs: make([]uint64, n), out: make([]store.Decision, n)}
	for i := range r.costs {
		r.costs[i] = 1 + rng.Uint64N(3)
	}
	return r
}

// check asserts, for one round: (1) each request is all-or-nothing in its
// decisions; (2) no key granted more than its limit; (3) what Redis holds
// for each key, read by a peek through the reader, is exactly what the
// committed requests took; on a single Redis, each key's committed takes
// tile its count (no two of them were given the same capacity).
func (c *ogCase) check(t *testing.T, round int, names []string, reqs []ogRequest, tally *ogTally) {
	t.Helper()
	granted := make([]uint64, len(c.pool))
	type span struct{ from, to uint64 } // a take's count before and after, on its key
	spans := make([][]span, len(c.pool))
	for ri, r := range reqs {
		if r.err != nil {
			tally.failed++
			continue
		}
		committed := true
		for _, d := range r.out {
			committed = committed && d.Allowed
		}
		if r.out[0].Local {
			tally.local++
		}
		fitted := map[uint16]bool{} // slot -> every hit of it fitted
		for i, k := range r.keys {
			d, rule, cost := r.out[i], c.pool[k].rule, r.costs[i]
			where := func() string {
				return fmt.Sprintf("round %d request %d (costs %v) hit %d (%s, %v, cost %d): %+v", round, ri, r.costs, i, names[k], rule, cost, d)
			}
			switch {
			case d.Limit != rule.Capacity():
				t.Errorf("%s: limit %d, want %d", where(), d.Limit, rule.Capacity())
			case d.Local != r.out[0].Local:
				t.Errorf("%s: answered locally for some hits only", where())
			case d.Allowed && d.RetryAfter != 0:
				t.Errorf("%s: allowed with a retry", where())
			case !d.Allowed && (d.RetryAfter <= 0 || d.Remaining >= cost):
				t.Errorf("%s: denied, yet the cost fits what remains, or no retry", where())
			case committed && (d.Local || d.Remaining > rule.Capacity()-cost):
				// (its Remaining is what is left after it)
				t.Errorf("%s: committed, with more remaining than its take leaves", where())
			case !committed && d.Allowed && d.Remaining < cost:
				// (a hit that fitted in a denied request reports what it
				// found: nothing was taken)
				t.Errorf("%s: in a denied request, allowed with less remaining than its cost", where())
			}
			sl := slot(c.replicas[0].opt.KeyPrefix + names[k])
			if f, seen := fitted[sl]; !seen || f {
				fitted[sl] = d.Allowed
			}
			if committed {
				granted[k] += cost
				to := rule.Capacity() - d.Remaining
				spans[k] = append(spans[k], span{to - cost, to})
			}
		}
		switch {
		case committed:
			tally.committed++
		default:
			tally.denied++
			for _, f := range fitted {
				if f && c.tags > 0 && len(fitted) > 1 && !r.out[0].Local {
					tally.refunded++
					break
				}
			}
		}
	}
	for k, key := range c.pool {
		if limit := key.rule.Capacity(); granted[k] > limit {
			t.Errorf("round %d key %s (%v): granted %d, over its limit %d", round, names[k], key.rule, granted[k], limit)
		}
		out := make([]store.Decision, 1)
		peek := []store.Hit{{Key: names[k], Rule: key.rule, Veto: true, Plain: key.plain}}
		if err := c.reader.Take(context.Background(), ogNow, peek, out); err != nil {
			t.Fatalf("round %d key %s: peek: %v", round, names[k], err)
		}
		// (a request that gave up waiting may still hold increments of a
		// key in the reference's layout, past its limit, until its refund
		// lands: see runIncr)
		for start := time.Now(); c.deadlines && key.plain && !out[0].Allowed && time.Since(start) < 30*time.Second; {
			if err := c.reader.Take(context.Background(), ogNow, peek, out); err != nil {
				t.Fatalf("round %d key %s: peek: %v", round, names[k], err)
			}
		}
		// (a peek is denied only past the limit, which no take reaches)
		want := key.rule.Capacity() - min(granted[k], key.rule.Capacity())
		switch {
		case !out[0].Allowed || out[0].Remaining > want:
			t.Errorf("round %d key %s (%v): peek %+v after %d granted, want allowed with %d remaining: Redis lost what a committed request took",
				round, names[k], key.rule, out[0], granted[k], want)
		case out[0].Remaining < want && !c.deadlines:
			t.Errorf("round %d key %s (%v): peek %+v after %d granted, want %d remaining: Redis holds what no committed request took",
				round, names[k], key.rule, out[0], granted[k], want)
		}
		if !c.serial {
			continue
		}
		s := spans[k]
		slices.SortFunc(s, func(a, b span) int { return cmp.Compare(a.from, b.from) })
		at := uint64(0)
		for _, sp := range s {
			if sp.from < at || sp.from > at && !c.deadlines {
				t.Errorf("round %d key %s (%v): committed takes span %v: the one from %d overlaps or leaves a gap after %d",
					round, names[k], key.rule, s, sp.from, at)
				break
			}
			at = sp.to
		}
	}
}

// ogFixed is a pool of fixed windows of an hour, limits 5 to 50, Plain
// (the reference's layout) if plain. Keys of one limit share their rule,
// so that a request's hits on them at one cost send window.lua one field.
func ogFixed(plain bool) []ogKey {
	var pool []ogKey
	rules := map[uint64]*store.Rule{}
	for i, limit := range []uint64{5, 5, 13, 21, 21, 50} {
		if rules[limit] == nil {
			rules[limit] = must(store.NewFixedWindow(limit, time.Hour))
		}
		pool = append(pool, ogKey{name: "f" + strconv.Itoa(i), rule: rules[limit], plain: plain})
	}
	return pool
}

// ogMixed is a pool of fixed windows (one in the reference's layout),
// token buckets (1 token an hour: none refills while the test runs, were
// the clock to move) and sliding windows of a day, limits 5 to 50: a
// request on distinct fixed windows only goes through the combiner, any
// other through take.lua.
func ogMixed() []ogKey {
	return []ogKey{
		{name: "f0", rule: must(store.NewFixedWindow(5, time.Hour))},
		{name: "f1", rule: must(store.NewFixedWindow(30, time.Hour))},
		{name: "f2", rule: must(store.NewFixedWindow(12, time.Hour))},
		{name: "p0", rule: must(store.NewFixedWindow(9, time.Hour)), plain: true},
		{name: "t0", rule: must(store.NewTokenBucket(1, time.Hour, 7))},
		{name: "t1", rule: must(store.NewTokenBucket(1, time.Hour, 40))},
		{name: "s0", rule: must(store.NewSlidingWindow(6, 24*time.Hour))},
		{name: "s1", rule: must(store.NewSlidingWindow(50, 24*time.Hour))},
	}
}

// ogWarm runs each script once through s on keys outside the pool, so that
// no EVALSHA of the run is answered NOSCRIPT (which Redis counts as a
// call).
func ogWarm(t *testing.T, s *Store) {
	t.Helper()
	fw := must(store.NewFixedWindow(5, time.Hour))
	tb := must(store.NewTokenBucket(1, time.Hour, 5))
	for _, hits := range [][]store.Hit{
		{{Key: "warm/f", Rule: fw, Cost: 1, Veto: true}},
		{{Key: "warm/f", Rule: fw, Cost: 1, Veto: true}, {Key: "warm/t", Rule: tb, Cost: 1, Veto: true}},
	} {
		if err := s.Take(context.Background(), ogNow, hits, make([]store.Decision, len(hits))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestTake_NoOverGrant: replicas on one Redis, their concurrent requests
// combined into shared window.lua calls (fixed windows in Sluice's
// layout), into pipelines of INCRBYs (in the reference's layout: runIncr)
// or run by take.lua (with token buckets and sliding windows), never grant
// a key more than its limit, keep each request all-or-nothing and leave in
// Redis exactly what the committed requests took, each key's takes one
// after the other (but runIncr's, whose refunds land after others took).
// Requests did share calls: Redis ran fewer scripts than requests reached
// it; in the reference's layout it ran INCRBYs, and scripts only to give
// back what denied requests took. With the server clock
// (Options.ServerClock) token buckets read Redis's time, which moves: by
// far less than the hour a token takes to refill. Deadlines abandons
// requests while queued or in flight (ogCase.deadlines).
func TestTake_NoOverGrant(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range []struct {
		name        string
		pool        []ogKey
		serverClock bool
		deadlines   bool
		combine     bool // fixed windows only: requests share window.lua calls (but those naming a key twice)
		incr        bool // the reference's layout: INCRBY, and refunds
	}{
		{"FixedWindow", ogFixed(false), false, false, true, false},
		{"Plain", ogFixed(true), false, false, false, true},
		{"Mixed", ogMixed(), false, false, false, false},
		{"MixedServerClock", ogMixed(), true, false, false, false},
		{"Deadlines", ogFixed(false), false, true, false, false},
		{"PlainDeadlines", ogFixed(true), false, true, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			replicas, reader := ogReplicasOn(t, Options{URL: "redis://" + srv.Addr, ServerClock: c.serverClock}, ogReplicas)
			ogWarm(t, replicas[0])
			before, incrs := scriptCalls(t, srv), callsOf(t, srv, "incrby")
			oc := ogCase{replicas: replicas, reader: reader, pool: c.pool, serial: !c.incr, deadlines: c.deadlines}
			tally := oc.run(t, 1)
			if t.Failed() {
				return
			}
			// (the reader's peeks are calls too: count them out)
			calls := scriptCalls(t, srv) - before - ogRounds*len(c.pool)
			sent := tally.committed + tally.denied - tally.local
			t.Logf("%d requests: %d committed, %d denied (%d locally), %d out of time; %d answered by Redis in %d script calls",
				ogRounds*len(replicas)*ogGoroutines*ogRequests, tally.committed, tally.denied, tally.local, tally.failed, sent, calls)
			if tally.committed == 0 || tally.denied == 0 {
				t.Errorf("%d committed, %d denied: want both, or the bound was not tested", tally.committed, tally.denied)
			}
			// (a request out of time may have sent its call, or not)
			if !c.deadlines && !c.incr && (calls > sent || (c.combine && calls == sent)) {
				t.Errorf("%d script calls for %d requests that reached Redis: want fewer (requests combined)", calls, sent)
			}
			if c.incr {
				incrs = callsOf(t, srv, "incrby") - incrs
				failed := uint64(0)
				for _, s := range replicas {
					failed += s.Stats().RefundFailures
				}
				// (script calls: refunds, each of one or more denied
				// requests, and take.lua for a request naming a key twice;
				// that Redis holds what was granted shows the refunds)
				if incrs == 0 || !c.deadlines && calls > sent || failed > 0 {
					t.Errorf("%d INCRBYs, %d script calls for %d requests that reached Redis, %d refunds failed: want INCRBYs, at most a script call a request, no refund failed",
						incrs, calls, sent, failed)
				}
			}
		})
	}
}

// ogTags returns n hash tags whose slots lie in the thirds of the slot
// range in turn, where redis-cli --cluster create puts its 3 masters'
// slots: keys on every node.
func ogTags(n int) []string {
	var tags []string
	for i := 0; len(tags) < n; i++ {
		tag := "{n" + strconv.Itoa(i) + "}"
		if int(slot(tag))*3/16384 == len(tags)%3 {
			tags = append(tags, tag)
		}
	}
	return tags
}

// TestTake_NoOverGrantCluster: the same on a Redis Cluster of 3 masters,
// where a request runs one script per hash slot and a slot that committed
// in a request another slot denied is refunded. Requests on keys of one
// slot and across slots; some were refunded, and the refunds left nothing
// counted. Takes on Cluster are not serial (a refund lands after others
// took), so their counts do not tile. Deadlines cuts requests short: a
// slot that took for a request out of time keeps its take (an over-deny).
func TestTake_NoOverGrantCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	const tagsN, perTag = 4, 3
	tags := ogTags(tagsN)
	for _, c := range []struct {
		name        string
		pool        []ogKey
		serverClock bool
		deadlines   bool
	}{
		{"FixedWindow", ogFixed(false), false, false},
		{"Plain", ogFixed(true), false, false},
		{"Mixed", ogMixed(), false, false},
		{"MixedServerClock", ogMixed(), true, false},
		{"Deadlines", ogMixed(), false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			// tagsN×perTag keys, the case's rules in turn.
			var pool []ogKey
			for i := range tagsN * perTag {
				k := c.pool[i%len(c.pool)]
				k.name, k.tag = tags[i/perTag]+k.name+"."+strconv.Itoa(i), i/perTag
				pool = append(pool, k)
			}
			replicas, reader := ogReplicasOn(t, Options{ClusterAddrs: cl.Seeds(), ServerClock: c.serverClock}, ogReplicas)
			oc := ogCase{replicas: replicas, reader: reader, pool: pool, tags: tagsN, deadlines: c.deadlines}
			tally := oc.run(t, 2)
			if t.Failed() {
				return
			}
			t.Logf("%d requests: %d committed, %d denied (%d locally, %d refunded), %d out of time",
				ogRounds*len(replicas)*ogGoroutines*ogRequests, tally.committed, tally.denied, tally.local, tally.refunded, tally.failed)
			if tally.committed == 0 || tally.denied == 0 || tally.refunded == 0 {
				t.Errorf("%d committed, %d denied, %d refunded: want each, or the bound was not tested", tally.committed, tally.denied, tally.refunded)
			}
			for i, s := range replicas {
				if st := s.Stats(); !c.deadlines && (st.RefundFailures != 0 || st.Failed != 0) {
					t.Errorf("replica %d: %d refunds failed, %d Takes failed", i, st.RefundFailures, st.Failed)
				}
			}
		})
	}
	for i, n := range cl.Nodes {
		if keys := n.CLI("dbsize"); keys == "0" {
			t.Errorf("node %d holds no key: the keys were not spread over the nodes", i)
		}
	}
}
