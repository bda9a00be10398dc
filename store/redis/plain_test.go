package redis

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestPlain_LocalCache: the local over-limit cache keys on the reference's
// key bytes (prefix, key, window start: its freecache's key) and reaches
// its conclusion from the shared counter: a counter the reference's pods
// took past the limit is denied from Redis, then locally, until the next
// window's key; charges and takes through either script write bare counts
// that INCRBY continues.
func TestPlain_LocalCache(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr, KeyPrefix: "rl:", PlainJitterMax: 5})
	r, err := store.NewFixedWindow(3, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	now := int64(1795930033) * int64(time.Second) // window start 1795930020
	key := "rl:dom_k_v_1795930020"
	srv.CLI("INCRBY", key, "4") // the reference counts past the limit
	hit := []store.Hit{{Key: "dom_k_v_", Rule: r, Cost: 1, Veto: true, Plain: true}}
	out := make([]store.Decision, 1)
	ctx := context.Background()
	for i, wantLocal := range []bool{false, true} {
		if err := s.Take(ctx, now, hit, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Allowed || out[0].Local != wantLocal {
			t.Errorf("take %d over the reference's count: %+v, want denied, local %v", i, out[0], wantLocal)
		}
	}
	if got := s.Stats().LocalAnswers; got != 1 {
		t.Errorf("local answers %d, want 1", got)
	}
	if got := srv.CLI("GET", key); got != "4" {
		t.Errorf("%s = %s after denials, want 4", key, got)
	}
	// The next window is another key: not in the cache.
	now += int64(time.Minute)
	next := "rl:dom_k_v_1795930080"
	charge := []store.Hit{{Key: "dom_k_v_", Rule: r, Cost: 5, Veto: true, Mode: store.ModeCharge, Plain: true}}
	for i, h := range [][]store.Hit{hit, charge} {
		if err := s.Take(ctx, now, h, out); err != nil {
			t.Fatal(err)
		}
		if out[0].Local {
			t.Errorf("step %d in the next window answered locally", i)
		}
	}
	srv.CLI("INCRBY", next, "1")
	if got := srv.CLI("GET", next); got != "7" {
		t.Errorf("%s = %s, want 7 (a take, a charge of 5, the reference's INCRBY)", next, got)
	}
	// (a lower bound far below a minute: the machine may be slow)
	if ms, err := strconv.Atoi(srv.CLI("PTTL", next)); err != nil || ms <= 0 || ms > 64000 {
		t.Errorf("%s PTTL %d ms (%v), want at most 64 s (a minute and up to 4 s of jitter)", next, ms, err)
	}
}
