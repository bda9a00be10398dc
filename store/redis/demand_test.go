package redis

import (
	"context"
	"slices"
	"testing"
	"time"

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

	exchange := func(step string, d *Demand, at time.Time, local map[string][]float64) map[string][]float64 {
		t.Helper()
		r, err := d.Exchange(ctx, at, local)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		for _, ds := range r {
			slices.Sort(ds)
		}
		return r
	}
	if r := exchange("a first", a, now, map[string][]float64{"g1": {10, 20}, "g2": {5}}); len(r) != 0 {
		t.Errorf("a alone sees %v", r)
	}
	r := exchange("b", b, now, map[string][]float64{"g1": {0.5}, "g3": {1}})
	if !slices.Equal(r["g1"], []float64{10, 20}) || len(r) != 1 {
		t.Errorf("b sees %v, want g1: [10 20]", r)
	}
	r = exchange("a again", a, now.Add(time.Second), map[string][]float64{"g1": {30}})
	if !slices.Equal(r["g1"], []float64{0.5}) || len(r) != 1 {
		t.Errorf("a sees %v, want g1: [0.5]", r)
	}
	if cli != nil {
		// a no longer has g2: its field is deleted (and the hash with it);
		// the hashes expire.
		if got := cli("EXISTS", "d:rlqs:g2"); got != "0" {
			t.Errorf("EXISTS d:rlqs:g2 = %s after a dropped it", got)
		}
		if got := cli("PTTL", "d:rlqs:g1"); got == "-1" || got == "-2" {
			t.Errorf("PTTL d:rlqs:g1 = %s, want an expiry", got)
		}
	}
	// b stops writing: its entry goes stale after 3 s.
	r = exchange("a late", a, now.Add(4*time.Second), map[string][]float64{"g1": {30}})
	if len(r) != 0 {
		t.Errorf("a sees stale entries %v", r)
	}
}

func TestDecodeDemand(t *testing.T) {
	at := time.UnixMilli(1234)
	got, ds, ok := decodeDemand(encodeDemand(at, []float64{1.5, 0, 1e9}))
	if !ok || !got.Equal(at) || !slices.Equal(ds, []float64{1.5, 0, 1e9}) {
		t.Errorf("round trip: %v %v %v", got, ds, ok)
	}
	for _, bad := range []string{"", "x 1", "12 y", "12 -1", "12 NaN"} {
		if _, _, ok := decodeDemand(bad); ok {
			t.Errorf("decodeDemand(%q) accepted", bad)
		}
	}
}
