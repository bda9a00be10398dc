package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memory"
)

func Example() {
	perMinute, _ := store.NewFixedWindow(2, time.Minute)
	bucket, _ := store.NewTokenBucket(8, time.Second, 40)
	s := memory.New(memory.Options{})
	now := time.Date(2026, 11, 22, 15, 0, 30, 0, time.UTC).UnixNano()

	hits := []store.Hit{
		{Key: "api|user=alice|minute|fw", Rule: perMinute, Cost: 1, Veto: true},
		{Key: "api|global|8/1s/40|tb", Rule: bucket, Cost: 1, Veto: true},
	}
	out := make([]store.Decision, len(hits))
	for range 3 {
		if err := s.Take(context.Background(), now, hits, out); err != nil {
			panic(err)
		}
		fmt.Printf("alice %v (%d left, retry in %v); bucket %v (%d left)\n",
			out[0].Allowed, out[0].Remaining, out[0].RetryAfter, out[1].Allowed, out[1].Remaining)
	}
	// Output:
	// alice true (1 left, retry in 0s); bucket true (39 left)
	// alice true (0 left, retry in 0s); bucket true (38 left)
	// alice false (0 left, retry in 30s); bucket true (38 left)
}
