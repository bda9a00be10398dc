package redis

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/redis/redistest"
	"github.com/sluicehq/sluice/store/storetest"
)

// TestTake_CalendarExpiry: calendar keys expire a second after their real
// end, not after a nominal period: a Berlin day that is 23 hours long, a
// month an hour short; alone (window.lua, take.lua's fast path) or in a
// batch.
func TestTake_CalendarExpiry(t *testing.T) {
	srv := redistest.Start(t)
	s := open(t, Options{URL: "redis://" + srv.Addr})
	month := storetest.CalendarWindow(t, 5, storetest.Calendar(t, store.CalendarMonth, 1, "Europe/Berlin"))
	day := storetest.CalendarSliding(t, 4, storetest.Calendar(t, store.CalendarDay, 1, "Europe/Berlin"))
	tb := must(store.NewTokenBucket(1, time.Hour, 3))
	// Mar 31, 14:00 +02: March ends in 10 h (Apr 1, 00:00 +02). The day
	// (23 h, 8 buckets of 2 h 52.5 min) is in its bucket 4, which leaves
	// the window when Apr 1's bucket 5 starts (15:00 +02): in 25 h.
	ts, _ := time.Parse(time.RFC3339, "2024-03-31T12:00:00Z")
	now := ts.UnixNano()
	before := time.Now()
	for _, batch := range [][]store.Hit{
		{{Key: "m1", Rule: month, Cost: 1, Veto: true}},
		{{Key: "m2", Rule: month, Cost: 1, Veto: true, Mode: store.ModeSaturate}},
		{{Key: "m3", Rule: month, Cost: 1, Veto: true}, {Key: "tb", Rule: tb, Cost: 1, Veto: true}},
		{{Key: "d1", Rule: day, Cost: 1, Veto: true}},
		{{Key: "d2", Rule: day, Cost: 1, Veto: true}, {Key: "m4", Rule: month, Cost: 1, Veto: true}},
	} {
		if err := s.Take(context.Background(), now, batch, make([]store.Decision, len(batch))); err != nil {
			t.Fatal(err)
		}
	}
	after := time.Now()
	check := func(key string, want time.Duration) {
		t.Helper()
		checkExpiry(t, srv, s.opt.KeyPrefix+key, want, before, after)
	}
	for _, k := range []string{"m1", "m2", "m3", "m4"} {
		check(k, 10*time.Hour+time.Second)
	}
	for _, k := range []string{"d1", "d2"} {
		check(k, 25*time.Hour+time.Second)
	}
}
