package redis

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/storetest"
)

// A Cluster refund that lands after part of the batch's takes refilled
// gives back only what is still owed, split from the key's last take back.
func TestOwedAtRefundTime(t *testing.T) {
	r, err := store.NewTokenBucket(1, time.Second, 10)
	if err != nil {
		t.Fatal(err)
	}
	t0 := storetest.T0
	s0, _ := store.Take(store.State{}, r, t0, 3)
	final, _ := store.Take(s0, r, t0, 2) // the key is 5 s in debt
	hits := []store.Hit{{Key: "k", Rule: r, Cost: 3, Veto: true}, {Key: "k", Rule: r, Cost: 2, Veto: true}}
	out := []store.Decision{{Allowed: true}, {Allowed: true}}
	k, _, _ := r.Quanta() // quanta per token
	for _, tc := range []struct {
		after time.Duration // from the batch to the refund
		want  [2]uint64     // owed quanta per take
	}{
		{0, [2]uint64{3 * k, 2 * k}},
		{4 * time.Second, [2]uint64{0, k}},
		{2 * time.Second, [2]uint64{k, 2 * k}},
		{6 * time.Second, [2]uint64{0, 0}},
	} {
		st := &Store{opt: Options{Clock: storetest.NewClock(t0 + int64(tc.after))}}
		got := st.owed(t0, reply{final: []store.State{final, final}}, hits, []string{"k", "k"}, out)
		if got[0] != tc.want[0] || got[1] != tc.want[1] {
			t.Errorf("refund %v after the batch: owed %v, want %v", tc.after, got, tc.want)
		}
	}
}
