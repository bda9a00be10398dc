// Package memcache is a store.Store in memcached, for deployments of
// envoyproxy/ratelimit that run on memcached (its BACKEND_TYPE=memcache).
//
// Fixed windows count as the reference does: one key per window, named
// by the window's end, counted with INCR (ADD with an expiry on the
// window's first hit), so a hot key costs one round trip and no retries.
// Unlike the reference, a denied take is given back (DECR): the count
// holds what was granted. Token buckets and sliding windows (calendar
// ones included) keep the algorithms' one-word state under one key,
// changed in a gets/cas loop around the pure functions of package store,
// with bounded attempts. Every algorithm, mode and limit of store.Store is
// served; a batch's all-or-nothing is made by giving back what its hits
// took when one is denied, not atomically. docs/MEMCACHED.md states
// where memcached is weaker than Redis.
//
// Keys are spread over several servers by rendezvous hashing; the servers
// come from a list or a DNS SRV name resolved again periodically (Run).
// Memcached is reached through github.com/bradfitz/gomemcache.
package memcache
