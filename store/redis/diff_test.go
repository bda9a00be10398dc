package redis

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// randomRules returns n rules with sizes from tiny to the limits the
// store package accepts, so states reach ~2^62 quanta, and counts of wide
// rules 2^53.
func randomRules(rng *rand.Rand, n int) []*store.Rule {
	windows := []time.Duration{time.Second, time.Minute, time.Hour, 365 * 24 * time.Hour, math.MaxUint32 * time.Second}
	limits := []uint64{0, 1, 2, 5, 1000, store.MaxFixedWindowLimit, store.MaxFixedWindowLimit + 1, 1 << 32, 1e10, store.MaxLimit}
	periods := []time.Duration{time.Nanosecond, 3 * time.Nanosecond, time.Microsecond, time.Second, time.Minute, 7 * time.Hour, 1000 * time.Hour}
	rates := []uint64{1, 3, 7, 1000, 1e9}
	bursts := []uint64{1, 2, 10, 1 << 20, 1 << 40, store.MaxLimit}
	slidingLimits := []uint64{0, 1, 5, 31, 60, 1000, store.MaxSlidingWindowLimit} // every bucket layout
	var rules []*store.Rule
	for len(rules) < n {
		var r *store.Rule
		var err error
		switch rng.IntN(3) {
		case 0:
			r, err = store.NewFixedWindow(limits[rng.IntN(len(limits))], windows[rng.IntN(len(windows))])
		case 1:
			r, err = store.NewTokenBucket(rates[rng.IntN(len(rates))], periods[rng.IntN(len(periods))], bursts[rng.IntN(len(bursts))])
		default:
			r, err = store.NewSlidingWindow(slidingLimits[rng.IntN(len(slidingLimits))], windows[rng.IntN(len(windows))])
		}
		if err == nil {
			rules = append(rules, r)
		}
	}
	return rules
}

func randomCost(rng *rand.Rand, r *store.Rule) uint64 {
	c := r.Capacity()
	switch rng.IntN(8) {
	case 0:
		return 0
	case 1:
		return c
	case 2:
		return c + 1
	case 3:
		return math.MaxUint64
	case 4:
		return max(c, 1) - 1
	case 5:
		return rng.Uint64N(max(c, 1)) + 1
	}
	return uint64(rng.IntN(3)) + 1
}

// TestTake_MatchesAlgorithms drives random batches through the script,
// through the memory store and through the store package's algorithms on
// states kept in Go: the decisions must be identical to the nanosecond.
// (Take itself also checks each final state the script wrote against the
// algorithms.) Hits take, saturate, charge and refund; a quarter of them
// peek by store.PeekStrict. Seeds from 8 on
// send what window.lua runs: fixed windows only, every hit a vetoing
// take, keys mostly distinct.
func TestTake_MatchesAlgorithms(t *testing.T) {
	srv := redistest.Start(t)
	for seed := range uint64(12) {
		rng := rand.New(rand.NewPCG(seed, 99))
		s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: seed%2 == 0})
		windows := seed >= 8
		var rules []*store.Rule
		for len(rules) < 6 {
			if r := randomRules(rng, 1)[0]; !windows || r.Algorithm() == store.FixedWindow {
				rules = append(rules, r)
			}
		}
		names := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
		model := map[string]store.State{} // Redis key -> state
		mem := memory.New(memory.Options{})
		now := int64(1_800_000_000_000_000_000) + rng.Int64N(int64(time.Hour))
		var retry time.Duration // of the last denial, to probe the boundary
		for step := range 800 {
			switch rng.IntN(10) {
			case 0: // clock steps back
				now -= rng.Int64N(int64(time.Second))
			case 1:
			case 2, 3: // exactly when the last denied hit fits, or 1ns before
				if retry > 0 && retry < time.Hour {
					now += int64(retry) - rng.Int64N(2)
				}
			default:
				now += rng.Int64N(int64(2 * time.Second))
			}
			n := 1 + rng.IntN(4)
			hits := make([]store.Hit, n)
			for i := range hits {
				k := rng.IntN(len(names))
				hits[i] = store.Hit{Key: names[k], Rule: rules[k], Cost: randomCost(rng, rules[k]),
					Veto: windows || rng.IntN(4) != 0}
				if !windows && rng.IntN(3) == 0 {
					hits[i].Mode = store.Mode(1 + rng.IntN(3))
				}
				if rng.IntN(4) == 0 {
					hits[i].Peek = store.PeekStrict
				}
			}
			got := make([]store.Decision, n)
			if err := s.Take(context.Background(), now, hits, got); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			keys := make([]string, n)
			orig := make([]store.State, n)
			for i := range hits {
				keys[i] = s.opt.KeyPrefix + hits[i].Key
				orig[i] = model[keys[i]]
			}
			want := make([]store.Decision, n)
			_, final := s.decide(new(scratch), now, nil, hits, keys, orig, want)
			fromMem := make([]store.Decision, n)
			if err := mem.Take(context.Background(), now, hits, fromMem); err != nil {
				t.Fatal(err)
			}
			for i := range hits {
				got[i].Local = false // a local answer is still the same decision
				model[keys[i]] = final[i]
				if !got[i].Allowed && got[i].RetryAfter != store.Never {
					retry = got[i].RetryAfter
				}
				if got[i] != fromMem[i] {
					for j := range hits {
						t.Logf("hit %d: %s %v cost %d veto %v %v: got %+v mem %+v want %+v", j, hits[j].Key, hits[j].Rule, hits[j].Cost, hits[j].Veto, hits[j].Mode, got[j], fromMem[j], want[j])
					}
					t.Fatalf("seed %d step %d hit %d (%v cost %d): got %+v, memory store %+v",
						seed, step, i, hits[i].Rule, hits[i].Cost, got[i], fromMem[i])
				}
				if got[i] != want[i] {
					t.Fatalf("seed %d step %d hit %d (%v cost %d): got %+v, want %+v",
						seed, step, i, hits[i].Rule, hits[i].Cost, got[i], want[i])
				}
			}
		}
	}
}

// TestTake_ServerClock runs token buckets on Redis TIME: the script's
// 128-bit quanta conversion must agree with the Go one, which Take checks
// on every call.
func TestTake_ServerClock(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, ServerClock: true})
	rng := rand.New(rand.NewPCG(7, 7))
	var rules []*store.Rule
	for len(rules) < 6 {
		if r := randomRules(rng, 1)[0]; r.Algorithm() == store.TokenBucket {
			rules = append(rules, r)
		}
	}
	allowed := 0
	for step := range 300 {
		k := rng.IntN(len(rules))
		hits := []store.Hit{{Key: "s" + string(rune('0'+k)), Rule: rules[k], Cost: randomCost(rng, rules[k]), Veto: true}}
		out := make([]store.Decision, 1)
		// The caller's clock is ignored for token buckets: a wrong one
		// must not matter.
		if err := s.Take(context.Background(), 42, hits, out); err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if out[0].Allowed {
			allowed++
		}
	}
	if allowed == 0 {
		t.Fatal("no hit was allowed")
	}
}

// TestTake_ClockStepsBack checks, against the memory store, the cases a
// backwards clock step reaches: a window later than now's keeps counting,
// and a refund in it is lost (a lost refund only denies more).
func TestTake_ClockStepsBack(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: true})
	mem := memory.New(memory.Options{})
	w := must(store.NewFixedWindow(5, time.Second))
	zero := must(store.NewFixedWindow(0, time.Second))
	tb := must(store.NewTokenBucket(1, time.Second, 3))
	sw := must(store.NewSlidingWindow(3, time.Second))
	t0 := int64(1_800_000_000) * int64(time.Second)
	steps := []struct {
		at   time.Duration
		hits []store.Hit
	}{
		{1500 * time.Millisecond, []store.Hit{{Key: "a", Rule: w, Cost: 2, Veto: true}, {Key: "t", Rule: tb, Cost: 2, Veto: true}}},
		{500 * time.Millisecond, []store.Hit{{Key: "a", Rule: w, Cost: 1, Veto: true}}}, // window.lua hands it to take.lua
		{500 * time.Millisecond, []store.Hit{{Key: "a", Rule: w, Cost: 1, Veto: true}, {Key: "t", Rule: tb, Cost: 1, Veto: true}, {Key: "z", Rule: zero, Cost: 1, Veto: true}}},
		{500 * time.Millisecond, []store.Hit{{Key: "a", Rule: w, Cost: 1, Veto: true}, {Key: "t", Rule: tb, Cost: 1, Veto: true}}},
		{1500 * time.Millisecond, []store.Hit{{Key: "a", Rule: w}, {Key: "t", Rule: tb}}},
		{2500 * time.Millisecond, []store.Hit{{Key: "a", Rule: w, Cost: 5, Veto: true}, {Key: "t", Rule: tb, Cost: 3, Veto: true}}},
		// A sliding window counts in the later bucket it holds, and its
		// key keeps the expiry that bucket set.
		{2500 * time.Millisecond, []store.Hit{{Key: "s", Rule: sw, Cost: 1, Veto: true}}},
		{1 * time.Second, []store.Hit{{Key: "s", Rule: sw, Cost: 1, Veto: true}}},
		{1 * time.Second, []store.Hit{{Key: "s", Rule: sw, Cost: 1, Veto: true}, {Key: "a", Rule: w, Cost: 9, Veto: true}}},
		{1 * time.Second, []store.Hit{{Key: "s", Rule: sw, Cost: 2, Veto: true}}},
		{3625 * time.Millisecond, []store.Hit{{Key: "s", Rule: sw, Cost: 3, Veto: true}}},
	}
	for i, st := range steps {
		got := make([]store.Decision, len(st.hits))
		want := make([]store.Decision, len(st.hits))
		if err := s.Take(context.Background(), t0+int64(st.at), st.hits, got); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if err := mem.Take(context.Background(), t0+int64(st.at), st.hits, want); err != nil {
			t.Fatal(err)
		}
		for j := range got {
			if got[j] != want[j] {
				t.Errorf("step %d hit %d: got %+v, memory store %+v", i, j, got[j], want[j])
			}
		}
	}
}

// TestTake_SlidingWindowOneCall: a request with a sliding window, alone or
// beside fixed windows and token buckets, is one script call to Redis.
func TestTake_SlidingWindowOneCall(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, NoLocalCache: true})
	sw := must(store.NewSlidingWindow(100, time.Minute))
	fw := must(store.NewFixedWindow(100, time.Minute))
	tb := must(store.NewTokenBucket(10, time.Second, 100))
	now := int64(1_800_000_000) * int64(time.Second)
	for i, batch := range [][]store.Hit{
		{{Key: "s", Rule: sw, Cost: 1, Veto: true}},
		{{Key: "s", Rule: sw, Cost: 1, Veto: true}, {Key: "f", Rule: fw, Cost: 1, Veto: true}, {Key: "t", Rule: tb, Cost: 1, Veto: true}},
		{{Key: "s", Rule: sw, Cost: 200, Veto: true}, {Key: "f", Rule: fw, Cost: 1, Veto: true}},
	} {
		before := scriptCalls(t, srv)
		out := make([]store.Decision, len(batch))
		if err := s.Take(context.Background(), now, batch, out); err != nil {
			t.Fatal(err)
		}
		if got := scriptCalls(t, srv) - before; got != 1 {
			t.Errorf("batch %d: %d script calls, want 1", i, got)
		}
	}
}
