// Package redis is a store.Store on Redis (single, Sentinel or Cluster),
// so that every Sluice replica shares every limit.
//
// A Take is one EVALSHA per request (per hash slot on Cluster): of
// window.lua for the usual batch (vetoing fixed-window hits on distinct
// keys), else of take.lua. Concurrent window.lua requests share one call
// (combiner; on Cluster one combiner per hash slot, for the requests whose
// keys are all in it): while one is in flight the next carries every request
// queued meanwhile (a second starts when a full batch is waiting), taken
// one after the other. Either runs the batch atomically, in the memory
// store's order, on the key states it reads, and writes the new states
// with an expiry at which they are fresh again. Lua numbers are doubles, so the
// script keeps token-bucket states as decimal strings and adds and
// compares them in base-10^7 limbs; everything that depends only on the
// clock and the rule (now in quanta, window ends, expiries) is computed in
// Go. The decisions come from the store package's own algorithms,
// replayed on the states the script read, and Take checks that the replay
// ends where the script did.
//
// A Take waits for Redis until its caller's deadline, less a margin to
// answer, and at most Options.Timeout. A circuit breaker fails Takes fast
// while Redis is down: it opens on connection failures and failed probes,
// never on Takes that only ran out of time (a starved process is not a
// dead Redis). Run probes Redis, closes the breaker when it is back and
// logs both transitions; Status is a snapshot for a status page. A local
// cache answers keys known to be over their limit without a call. Demand
// shares RLQS demand between replicas (quota.Fleet's exchange of
// store.Claims). See docs/REDIS.md.
package redis
