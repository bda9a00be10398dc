// Package store holds the rate-limit algorithms and the Store contract.
//
// The algorithms are pure functions of (state, rule, now, cost) returning
// (new state, Decision): no clock, no I/O, no allocation. A key's whole
// state is a State whose zero value is the fresh state; it fits one
// uint64 (State.Word) for every rule but a wide one (a fixed window above
// MaxFixedWindowLimit, up to MaxLimit = 2^53):
//
//   - TakeWindow: Envoy-compatible fixed windows aligned to the Unix
//     epoch; a denied hit consumes nothing.
//   - TakeTokens: a token bucket as GCRA in exact time quanta; rounding
//     never favours the caller.
//   - TakeSliding: at most N in any window of length T ending now,
//     counted in epoch-aligned buckets of T/G: never more than N in any
//     window, a hit counted for at most T/G longer than T.
//
// A Calendar aligns fixed and sliding windows to the days, ISO weeks,
// months or years of a time zone instead (NewCalendarWindow,
// NewCalendarSliding): periods of unequal length that start at local
// midnight.
//
// A hit has a Mode: Take (all or nothing), Saturate, Charge (usage that
// already happened, recorded whole past the limit: a fixed window's
// overshoot, a token bucket's or sliding window's debt) or Refund (usage
// given back). A check (cost 0) asks whether one more unit fits. Apply
// dispatches on the mode and Take on the rule; Rollback and Fresh support
// stores' batch rollback and lossless sweeping. WallClock is the
// production Clock.
//
// Stores (the in-memory store in store/memory, Redis in store/redis) own
// the state and apply the algorithms atomically per key; store/storetest
// is the conformance suite every Store passes. Claim and Grants are the
// data RLQS replicas exchange through a shared store (quota.Fleet,
// store/redis's Demand), here so that no store imports the policy above
// it: store/ imports no other package of Sluice but internal/ ones. docs/STORE.md explains the
// encodings, the rounding and the memory store's bound and sweep.
package store
