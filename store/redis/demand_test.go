package redis

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

func TestDemand_Exchange(t *testing.T) {
	srv := redistest.Start(t)
	runDemand(t, func(t *testing.T) *Store { return open(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "d:"}) }, srv.CLI)
}

func TestDemand_Cluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.StartCluster(t, 3)
	runDemand(t, func(t *testing.T) *Store { return open(t, Options{ClusterAddrs: cl.Seeds(), KeyPrefix: "d:"}) }, nil)
}

func runDemand(t *testing.T, newStore func(*testing.T) *Store, cli func(...string) string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := newStore(t).Demand("a", 3*time.Second)
	b := newStore(t).Demand("b", 3*time.Second)
	now := time.UnixMilli(1_800_000_000_000)

	exchange := func(step string, d *Demand, at time.Time, local map[string]store.Claim, release ...string) store.Grants {
		t.Helper()
		r, err := d.Exchange(ctx, at, local, release)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		return r
	}
	near := func(x, y float64) bool { return math.Abs(x-y) < 1e-6 }
	// a alone: it is granted its fair part, all of the capacity.
	r := exchange("a first", a, now, map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(100, 2000)}, "g2": {Capacity: 10, Max: 10, Demands: one(5)}})
	if !near(r.Granted["g1"], 900) || !near(r.Granted["g2"], 10) || r.Live != 1 {
		t.Errorf("a alone: %+v, want g1 900, g2 10, 1 live", r)
	}
	// b's fair part of g1 is 400 (100, then 400 each), but a holds 900.
	r = exchange("b", b, now, map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(2000)}})
	if !near(r.Granted["g1"], 0) || r.Live != 2 {
		t.Errorf("b while a holds all 900: %+v, want 0 granted, 2 live", r)
	}
	// a claims again: its fair part, 500, leaving 400 for b.
	r = exchange("a again", a, now.Add(time.Second), map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(100, 2000)}})
	if !near(r.Granted["g1"], 500) {
		t.Errorf("a again: %+v, want 500", r)
	}
	r = exchange("b again", b, now.Add(time.Second), map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(2000)}})
	if !near(r.Granted["g1"], 400) {
		t.Errorf("b again: %+v, want 400", r)
	}
	// Equal demands travel once, with their count: four proxies of 5 on a
	// and one of 50 on b share 100 as 5 proxies would.
	g3 := func(ds ...float64) map[string]store.Claim {
		return map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(100, 2000)}, "g3": {Capacity: 100, Max: 100, Demands: one(ds...)}}
	}
	exchange("a g3", a, now.Add(2*time.Second), g3(5, 5, 5, 5), "g2")
	exchange("b g3", b, now.Add(2*time.Second), map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(2000)}, "g3": {Capacity: 100, Max: 100, Demands: one(50)}})
	if r := exchange("a g3 again", a, now.Add(2*time.Second), g3(5, 5, 5, 5)); !near(r.Granted["g3"], 44) {
		t.Errorf("a's four proxies of 5 beside b's one of 50 on 100: %+v, want 44 (4 × (5 + 30/5))", r)
	}
	exchange("b g3 again", b, now.Add(2*time.Second), map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(2000)}})
	if cli != nil {
		// a gave g2 back: its field is deleted (and the hash with it); the
		// hashes expire.
		if got := cli("EXISTS", "d:rlqs:g2"); got != "0" {
			t.Errorf("EXISTS d:rlqs:g2 = %s after a dropped it", got)
		}
		if got := cli("PTTL", "d:rlqs:g1"); got == "-1" || got == "-2" {
			t.Errorf("PTTL d:rlqs:g1 = %s, want an expiry", got)
		}
	}
	// b stops writing: its entry goes stale after 3 s, and it is no
	// longer live.
	r = exchange("a late", a, now.Add(6*time.Second), map[string]store.Claim{"g1": {Capacity: 900, Max: 900, Demands: one(100, 2000)}})
	if !near(r.Granted["g1"], 900) || r.Live != 1 {
		t.Errorf("a after b went stale: %+v, want 900, 1 live", r)
	}
	// Demands that move: a's two proxies burst to 160 one report in four
	// and want 10 otherwise (mean 47.5), b's one wants 60 steadily. On 100
	// the level s has the bursting ones use 0.25 s + 0.75 × 10 each and b's
	// min(60, s): s = 56.67, a's part 43.33, b's 56.67 (max-min fairness
	// over the peaks would give a 66.67: its proxies would leave most of
	// it unused).
	burst := store.Demand{Low: 10, Mean: 47.5, Peak: 160}
	g4a := store.Claim{Capacity: 100, Max: 100, Demands: []store.Demand{burst, burst}}
	g4b := store.Claim{Capacity: 100, Max: 100, Demands: one(60)}
	exchange("b g4", b, now.Add(7*time.Second), map[string]store.Claim{"g4": {Capacity: 100, Max: 50, Demands: g4b.Demands}})
	if r := exchange("a g4", a, now.Add(7*time.Second), map[string]store.Claim{"g4": g4a}); !near(r.Granted["g4"], 130.0/3) {
		t.Errorf("a's two bursting proxies beside b's steady one: %+v, want 43.33", r)
	}
	if r := exchange("b g4 again", b, now.Add(7*time.Second), map[string]store.Claim{"g4": g4b}); !near(r.Granted["g4"], 170.0/3) {
		t.Errorf("b's steady proxy beside a's two bursting ones: %+v, want 56.67", r)
	}
	if cli != nil {
		if got := cli("HGET", "d:rlqs:g4", "a"); !strings.HasSuffix(got, " 10/47.5/160*2") {
			t.Errorf("HGET d:rlqs:g4 a = %q, want its two proxies' demand once, with their count", got)
		}
	}
}

// TestDemand_ClaimsNeverExceed: replicas claim the same limit at once
// with changing demands; the parts recorded never sum above the capacity,
// and with steady demands each replica ends up with its fair part.
func TestDemand_ClaimsNeverExceed(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const replicas, capacity = 4, 1000.0
	st := open(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "c:"})
	ds := make([]*Demand, replicas)
	for i := range ds {
		ds[i] = st.Demand(strconv.Itoa(i), time.Hour)
	}
	now := time.UnixMilli(1_800_000_000_000)
	for round := range 30 {
		var wg sync.WaitGroup
		for i, d := range ds {
			wg.Go(func() {
				// Demands move every round until round 20, then hold.
				v := float64((i*7+min(round, 20)*13)%50) * 40
				_, err := d.Exchange(ctx, now, map[string]store.Claim{"g": {Capacity: capacity, Max: capacity, Demands: one(v, v/2)}}, nil)
				if err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		var held float64
		vals, err := st.client().Do(ctx, st.client().B().Hvals().Key("c:rlqs:g").Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vals {
			f := strings.Fields(v)
			x, _ := strconv.ParseFloat(f[1], 64)
			held += x
		}
		if held > capacity+1e-6 {
			t.Fatalf("round %d: the replicas hold %v > %v", round, held, capacity)
		}
		if round == 29 && held < capacity-1e-6 {
			t.Errorf("with steady demands the replicas hold %v, want %v", held, capacity)
		}
	}
}

// TestDemand_ClaimFailsAlone: one group's hash of 250 is not a hash (a key
// of the wrong type, as a shard down would do): its claim fails, the 249
// others are granted, and the error names it.
func TestDemand_ClaimFailsAlone(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := open(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "w:"}).Demand("a", 3*time.Second)
	srv.CLI("SET", "w:rlqs:bad", "a string")
	now := time.UnixMilli(1_800_000_000_000)
	claim := store.Claim{Capacity: 100, Max: 100, Demands: one(10)}
	local := map[string]store.Claim{"bad": claim}
	for i := range 249 {
		local["g"+strconv.Itoa(i)] = claim
	}
	r, err := d.Exchange(ctx, now, local, nil)
	if err == nil || !strings.Contains(err.Error(), `"bad"`) || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Errorf("error %v, want one naming the claim of \"bad\"", err)
	}
	if _, ok := r.Granted["bad"]; ok || len(r.Granted) != 249 || r.Live != 1 {
		t.Errorf("%d granted (bad: %v), %d live; want the 249 others, 1 live", len(r.Granted), ok, r.Live)
	}
	// After a restart, Redis has forgotten the script: the claims load it,
	// sending its source once, not once a claim.
	srv.CLI("SCRIPT", "FLUSH")
	srv.CLI("CONFIG", "RESETSTAT")
	delete(local, "bad")
	r, err = d.Exchange(ctx, now.Add(time.Second), local, nil)
	if err != nil || len(r.Granted) != 249 {
		t.Errorf("after SCRIPT FLUSH: %d granted, %v; want all 249", len(r.Granted), err)
	}
	if stats := srv.CLI("INFO", "commandstats"); !strings.Contains(stats, "cmdstat_eval:calls=1,") {
		t.Errorf("after SCRIPT FLUSH, want one EVAL:\n%s", stats)
	}
}

// one is demands of one value each.
func one(ds ...float64) []store.Demand {
	h := make([]store.Demand, len(ds))
	for i, d := range ds {
		h[i] = store.Demand{Low: d, Mean: d, Peak: d}
	}
	return h
}
