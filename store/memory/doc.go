// Package memory is the in-process Store: per-key state in a concurrent
// map, one atomic word per key, updated lock-free.
//
// A take on an existing key is one map lookup and a compare-and-swap loop
// around the pure algorithm of package store, without allocation. A new
// key copies its string and inserts a cell. States that equal the fresh
// state are removed losslessly by Sweep; Options.MaxKeys bounds memory
// under hostile key cardinality by evicting (counted, lossy) when full.
// Nothing here starts a goroutine: the caller runs Sweep on a ticker.
package memory
