package client

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/store"
)

// ErrRetryBudgetExhausted is returned (wrapped) when a retry was refused
// because the retry budget could not cover it. The error also wraps the
// failure that would have been retried.
var ErrRetryBudgetExhausted = errors.New("client: retry budget exhausted")

// Retry budget accounting: a successful first try deposits one unit, a
// retry withdraws ten, so retries stay near 10 % of first-try successes.
const (
	depositUnits  = 1
	withdrawUnits = 10
)

// Default retry budget sizes, in retries.
const (
	DefaultBudgetCap     = 100
	DefaultBudgetInitial = 10
)

// BudgetConfig sizes a RetryBudget. The zero value means the defaults.
type BudgetConfig struct {
	// Cap is the most retries the balance can hold, so a long healthy
	// period cannot bank a retry storm. Zero means DefaultBudgetCap.
	Cap int
	// Initial is the balance at start, in retries, clamped to Cap. Zero
	// means DefaultBudgetInitial; negative means start empty.
	Initial int
	// MinPerSecond is a time-based allowance of retries per second that
	// does not depend on successes, so a quiet client can still retry.
	// It is spent before the balance. Zero means none.
	MinPerSecond uint64
	// Clock times the allowance. Nil means the wall clock.
	Clock store.Clock
}

// RetryBudget limits retries to a fraction of successes. Each successful
// first try deposits 1 unit into a capped balance; each retry withdraws 10
// or is refused at once, never queued. First tries never consult the
// budget. Safe for concurrent use.
type RetryBudget struct {
	balance   atomic.Int64 // units
	cap       int64        // units
	allowance *Bucket      // nil when MinPerSecond is zero
}

// NewRetryBudget returns a budget sized by cfg. It is an error if
// MinPerSecond exceeds one retry per nanosecond.
func NewRetryBudget(cfg BudgetConfig) (*RetryBudget, error) {
	c := cfg.Cap
	if c <= 0 {
		c = DefaultBudgetCap
	}
	initial := cfg.Initial
	switch {
	case initial == 0:
		initial = DefaultBudgetInitial
	case initial < 0:
		initial = 0
	}
	var allowance *Bucket
	if cfg.MinPerSecond > 0 {
		a, err := NewBucket(cfg.MinPerSecond, time.Second, cfg.MinPerSecond, cfg.Clock)
		if err != nil {
			return nil, fmt.Errorf("client: retry budget: MinPerSecond %d: %w", cfg.MinPerSecond, errors.Unwrap(err))
		}
		allowance = a
	}
	return newRetryBudget(c, initial, allowance), nil
}

func newRetryBudget(capRetries, initial int, allowance *Bucket) *RetryBudget {
	b := &RetryBudget{cap: int64(capRetries) * withdrawUnits, allowance: allowance}
	b.balance.Store(min(int64(initial)*withdrawUnits, b.cap))
	return b
}

// Deposit records a successful first try.
func (b *RetryBudget) Deposit() {
	for {
		old := b.balance.Load()
		if old >= b.cap || b.balance.CompareAndSwap(old, min(old+depositUnits, b.cap)) {
			return
		}
	}
}

// Withdraw asks for one retry. It reports false, at once, when neither the
// allowance nor the balance can cover it.
func (b *RetryBudget) Withdraw() bool {
	if b.allowance != nil && b.allowance.Allow() {
		return true
	}
	for {
		old := b.balance.Load()
		if old < withdrawUnits {
			return false
		}
		if b.balance.CompareAndSwap(old, old-withdrawUnits) {
			return true
		}
	}
}

// Balance reports the banked retries, in tenths of a retry (one successful
// first try adds one tenth). The time-based allowance is not included.
func (b *RetryBudget) Balance() int64 { return b.balance.Load() }
