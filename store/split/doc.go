// Package split is a store.Store over two stores: each hit goes to one of
// them by a route the caller gives (cmd/sluice sends the limits of a
// period under a minute to a second Redis, as envoyproxy/ratelimit's
// REDIS_PERSECOND does), and a request that touches both is still
// all-or-nothing: when one store denies the batch or fails, the takes the
// other committed are given back with ModeRefund hits at the batch's now
// (the way store/redis refunds the slots of a Cluster batch). Until the
// refund lands a concurrent request may be denied capacity the batch held
// for a moment (an over-deny), never granted capacity it did not have.
package split
