package client

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTestBudget(t *testing.T, cfg BudgetConfig) *RetryBudget {
	t.Helper()
	b, err := NewRetryBudget(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRetryBudget_Steps(t *testing.T) {
	b := newTestBudget(t, BudgetConfig{Cap: 3, Initial: 2})
	type op int
	const (
		deposit op = iota
		withdraw
	)
	steps := []struct {
		op      op
		times   int
		granted int // withdrawals granted of times
		balance int64
	}{
		{withdraw, 1, 1, 10},
		{withdraw, 1, 1, 0},
		{withdraw, 1, 0, 0}, // refused at once
		{deposit, 9, 0, 9},
		{withdraw, 1, 0, 9}, // 9 successes do not pay for a retry
		{deposit, 1, 0, 10},
		{withdraw, 1, 1, 0},
		{deposit, 1000, 0, 30}, // capped at Cap retries
		{withdraw, 4, 3, 0},
	}
	for i, s := range steps {
		granted := 0
		for range s.times {
			switch s.op {
			case deposit:
				b.Deposit()
			case withdraw:
				if b.Withdraw() {
					granted++
				}
			}
		}
		if granted != s.granted || b.Balance() != s.balance {
			t.Fatalf("step %d: granted %d balance %d, want %d and %d", i, granted, b.Balance(), s.granted, s.balance)
		}
	}
}

func TestRetryBudget_Defaults(t *testing.T) {
	b := newTestBudget(t, BudgetConfig{})
	if got := b.Balance(); got != DefaultBudgetInitial*10 {
		t.Fatalf("initial balance %d, want %d", got, DefaultBudgetInitial*10)
	}
	for range 100000 {
		b.Deposit()
	}
	if got := b.Balance(); got != DefaultBudgetCap*10 {
		t.Fatalf("balance after a long healthy period %d, want the cap %d", got, DefaultBudgetCap*10)
	}
	if empty := newTestBudget(t, BudgetConfig{Initial: -1}); empty.Withdraw() {
		t.Fatal("a budget configured to start empty granted a retry")
	}
}

// A client sending 100 first tries a second into a 60 s outage, retrying
// each failure once: every first try goes out, retries are the banked
// balance plus the per-second allowance, and then stop.
func TestRetryBudget_Outage(t *testing.T) {
	clock := newFakeClock(t0)
	b := newTestBudget(t, BudgetConfig{MinPerSecond: 2, Clock: clock})
	// A healthy minute banks up to the cap and no further.
	for range 6000 {
		b.Deposit()
	}
	firstTries, retries := 0, 0
	for tick := range 60 * 100 {
		clock.Set(t0 + int64(tick)*int64(10*time.Millisecond))
		firstTries++ // first tries never consult the budget
		if b.Withdraw() {
			retries++
		}
	}
	// 100 banked + the allowance's burst of 2 at the start + one more
	// every 500 ms from t0+0.5s to t0+59.5s (119).
	if want := 100 + 2 + 119; retries != want {
		t.Fatalf("outage: %d retries for %d first tries, want %d", retries, firstTries, want)
	}
	if firstTries != 6000 {
		t.Fatalf("first tries %d, want 6000", firstTries)
	}
}

// In a partial outage retries settle near 10 % of first-try successes.
func TestRetryBudget_TenPercent(t *testing.T) {
	b := newTestBudget(t, BudgetConfig{Initial: -1})
	successes, retries := 0, 0
	for i := range 100000 {
		if i%2 == 0 {
			b.Deposit()
			successes++
			continue
		}
		if b.Withdraw() {
			retries++
		}
	}
	if retries != successes/10 {
		t.Fatalf("%d retries for %d successes, want %d", retries, successes, successes/10)
	}
}

func TestRetryBudget_Concurrent(t *testing.T) {
	b := newTestBudget(t, BudgetConfig{Cap: 1000, Initial: 50})
	var wg sync.WaitGroup
	var granted atomic.Int64
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				if b.Withdraw() {
					granted.Add(1)
				}
				b.Deposit()
			}
		})
	}
	wg.Wait()
	// Each withdrawal is paid for: granted*10 ≤ initial + deposits.
	if spent, paid := granted.Load()*10, int64(50*10+8000); spent+b.Balance() != paid {
		t.Fatalf("granted %d retries (%d units) leaving %d; want them to add up to %d", granted.Load(), spent, b.Balance(), paid)
	}
}

func TestNewRetryBudget_Invalid(t *testing.T) {
	_, err := NewRetryBudget(BudgetConfig{MinPerSecond: 2_000_000_000})
	if err == nil || errors.Is(err, ErrRetryBudgetExhausted) {
		t.Fatalf("NewRetryBudget(2e9 per second) = %v, want a configuration error", err)
	}
}
