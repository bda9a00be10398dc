package client

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"google.golang.org/grpc"
)

func BenchmarkBucket_Allow(b *testing.B) {
	bucket, err := NewBucket(1_000_000_000, time.Second, 1<<20, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bucket.Allow()
		}
	})
}

func BenchmarkRetryBudget(b *testing.B) {
	budget, err := NewRetryBudget(BudgetConfig{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for i := 0; pb.Next(); i++ {
			if i%11 == 0 {
				budget.Withdraw()
			} else {
				budget.Deposit()
			}
		}
	})
}

func BenchmarkBackoff_Next(b *testing.B) {
	bo := Backoff{Rand: rand.New(rand.NewPCG(1, 2)).Int64N}
	b.ReportAllocs()
	for b.Loop() {
		bo.Next(0)
	}
}

// The interceptor's cost on a call that succeeds at once.
func BenchmarkRetrier_UnarySuccess(b *testing.B) {
	ic := NewRetrier(RetryConfig{}).UnaryClientInterceptor()
	ok := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ic(ctx, "/m", nil, nil, nil, ok)
		}
	})
}

// A Check against a real in-process Sluice over loopback.
func BenchmarkClient_Check(b *testing.B) {
	addr := startSluice(b, limitsYAML, nil)
	c, err := Dial(addr, WithTimeout(time.Second))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	d := []Descriptor{{{"free", "x"}}} // unlimited: every call is answered in full
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Check(context.Background(), "api", d, 1); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func TestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts differ under -race")
	}
	// A bucket that never runs dry, so no call waits.
	bucket, err := NewBucket(1_000_000_000, time.Second, 1<<20, nil)
	if err != nil {
		t.Fatal(err)
	}
	budget := newBudget(t, 0)
	ic := NewRetrier(RetryConfig{Budget: budget, Bucket: bucket}).UnaryClientInterceptor()
	ok := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	ctx := context.Background()
	for name, f := range map[string]func(){
		"Bucket.Allow":    func() { bucket.Allow() },
		"RetryBudget":     func() { budget.Deposit(); budget.Withdraw() },
		"interceptor, OK": func() { ic(ctx, "/m", nil, nil, nil, ok) },
		"Backoff.Next":    func() { var bo Backoff; bo.Next(0) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}
