// Package store holds the rate-limit algorithms and the Store contract.
//
// The algorithms are pure functions of (state, rule, now, cost) returning
// (new state, Decision): no clock, no I/O, no allocation. Stores (the
// in-memory store in store/memory, Redis in store/redis) own the state and
// apply the algorithms atomically per key; store/storetest is the
// conformance suite every Store passes.
package store
