package memory

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/puzpuzpuz/xsync/v4"

	"github.com/sluicehq/sluice/store"
)

// DefaultMaxKeys is the key bound when Options.MaxKeys is 0: about 75 MB
// of state (72 bytes a key, measured) plus the key strings.
const DefaultMaxKeys = 1 << 20

// sweepGrace keeps Sweep and eviction from removing a state that became
// fresh only in the last second, so that a Take holding a clock reading
// a little older than the sweeper's never finds its state gone early.
const sweepGrace = int64(time.Second)

// Options configure a Store. The zero value means defaults.
type Options struct {
	// MaxKeys bounds the number of keys held; 0 means DefaultMaxKeys.
	// Inserting a key at the bound first drops fresh states and, if
	// there are too few, evicts live ones: an evicted key starts fresh,
	// which can grant that key more than its limit once. Inserts that
	// arrive while room is being made overshoot the bound briefly.
	MaxKeys int
	// Clock, when set, is read when a denied batch rolls back what it
	// took, so that a token bucket gets back only what the take still
	// owes at that instant (its refilled part was there for others to
	// take). Pass the clock the callers read their now from. Nil rolls
	// back as of the batch's now, which is exact for callers that do not
	// share keys with other callers' later instants.
	Clock store.Clock
}

// Stats are cumulative counters and the current key count.
type Stats struct {
	Keys      int    // keys held now
	Inserts   uint64 // keys inserted
	Swept     uint64 // fresh states removed (Sweep, or room made at the bound)
	Evictions uint64 // live states dropped at the bound (lossy)
}

// Store is the in-memory store. Safe for concurrent use.
type Store struct {
	m          *xsync.Map[string, *cell]
	maxKeys    int64
	evictBatch int

	keys      atomic.Int64 // live map entries
	inserts   atomic.Uint64
	swept     atomic.Uint64
	evictions atomic.Uint64
	evicting  atomic.Bool
	clock     store.Clock // may be nil
}

// cell is one key's state. The rule lets Sweep judge a token bucket's
// freshness; a key's rule may be replaced by an equal one on reload, never
// by one with other quanta (the key names the algorithm and its numbers).
type cell struct {
	state atomic.Uint64
	rule  atomic.Pointer[store.Rule]
}

// New returns an empty Store.
func New(opts Options) *Store {
	maxKeys := opts.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Store{
		m:          xsync.NewMap[string, *cell](),
		maxKeys:    int64(maxKeys),
		evictBatch: max(1, maxKeys/16),
		clock:      opts.Clock,
	}
}

// taken records a consumption to roll back if the batch is denied.
type taken struct {
	c             *cell
	before, after uint64
}

// Take applies hits as one all-or-nothing batch at now, per store.Store.
//
// Vetoing hits are taken first, in order; once one is denied the rest are
// only evaluated, and after the non-vetoing hits have been evaluated the
// taken ones are rolled back. Non-vetoing (shadow) hits consume only when
// the batch commits. Saturate hits always consume: what fits, or what is
// left. Hits on the same key see each other in order. Hits beyond the
// eighth of a batch cost one allocation.
func (s *Store) Take(_ context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	if len(out) != len(hits) {
		return fmt.Errorf("memory: %d decisions for %d hits", len(out), len(hits))
	}
	if len(hits) == 1 {
		// A lone hit has nothing to roll back: denied, it took nothing.
		_, _, _, out[0] = s.apply(&hits[0], now)
		return nil
	}
	var buf [8]taken
	tk := buf[:]
	if len(hits) > len(buf) {
		tk = make([]taken, len(hits))
	}
	denied := false
	for i := range hits {
		h := &hits[i]
		switch {
		case !h.Veto:
			continue
		case denied && !h.Saturate:
			out[i] = s.peek(h, now)
			continue
		}
		c, before, after, d := s.apply(h, now)
		out[i] = d
		switch {
		case !d.Allowed:
			denied = true
		case !h.Saturate && after != before:
			tk[i] = taken{c, before, after}
		}
	}
	for i := range hits {
		h := &hits[i]
		switch {
		case h.Veto:
		case denied && !h.Saturate:
			out[i] = s.peek(h, now)
		default:
			_, _, _, out[i] = s.apply(h, now)
		}
	}
	if !denied {
		return nil
	}
	at := now
	if s.clock != nil {
		at = max(at, s.clock.Now())
	}
	for i := len(hits) - 1; i >= 0; i-- {
		if tk[i].c != nil {
			refund(tk[i], &hits[i], at)
		}
	}
	for i := range hits {
		if tk[i].c != nil {
			_, out[i] = store.Take(s.load(hits[i].Key), hits[i].Rule, now, 0)
			out[i].Allowed = true
		}
	}
	return nil
}

// apply runs the hit's algorithm on its key's cell with a CAS loop,
// returning the cell, the states before and after, and the decision.
// A hit that would leave a missing key fresh (a check, a denial) inserts
// nothing, so checks of hostile keys cost no memory.
func (s *Store) apply(h *store.Hit, now int64) (c *cell, before, after uint64, d store.Decision) {
	for {
		var ok bool
		if c, ok = s.m.Load(h.Key); !ok {
			if after, d = store.Take(0, h.Rule, now, h.Cost); after == 0 && !h.Saturate {
				return nil, 0, 0, d
			}
			c = s.insert(h.Key, h.Rule, now)
		} else if c.rule.Load() != h.Rule {
			c.rule.Store(h.Rule)
		}
		for {
			before = c.state.Load()
			if before == store.Tombstone {
				break
			}
			if h.Saturate {
				after, d = store.Saturate(before, h.Rule, now, h.Cost)
			} else {
				after, d = store.Take(before, h.Rule, now, h.Cost)
			}
			if after == before || c.state.CompareAndSwap(before, after) {
				return c, before, after, d
			}
		}
		// Swept or evicted: help remove the dead entry, then find or
		// insert the live one.
		s.remove(h.Key, c)
	}
}

// refund rolls back one take at now, the time of the rollback. If nothing
// touched the state since, it goes back exactly; otherwise store.Refund
// takes back what the take still owes. A tombstone
// means the state was swept (it had lapsed) or evicted: nothing to undo.
func refund(t taken, h *store.Hit, now int64) {
	for {
		cur := t.c.state.Load()
		if cur == store.Tombstone {
			return
		}
		n := t.before
		if cur != t.after {
			n = store.Refund(cur, t.after, h.Rule, now, h.Cost)
		}
		if t.c.state.CompareAndSwap(cur, n) {
			return
		}
	}
}

// peek decides a hit of a denied batch without consuming: a denial as
// Take reports it, or a fit reported as Allowed with what remains now.
func (s *Store) peek(h *store.Hit, now int64) store.Decision {
	st := s.load(h.Key)
	_, d := store.Take(st, h.Rule, now, h.Cost)
	if d.Allowed && h.Cost > 0 {
		_, d = store.Take(st, h.Rule, now, 0)
		d.Allowed = true
	}
	return d
}

// load returns key's state, fresh if it has none.
func (s *Store) load(key string) uint64 {
	c, ok := s.m.Load(key)
	if !ok {
		return 0
	}
	if st := c.state.Load(); st != store.Tombstone {
		return st
	}
	return 0
}

// insert adds a cell for key, making room first at the bound, and returns
// the key's cell (another caller's if it won the race).
func (s *Store) insert(key string, r *store.Rule, now int64) *cell {
	if s.keys.Load() >= s.maxKeys {
		s.makeRoom(now)
	}
	c := new(cell)
	c.rule.Store(r)
	// The key may alias the caller's reused buffer: keep a copy.
	actual, loaded := s.m.LoadOrStore(strings.Clone(key), c)
	if !loaded {
		s.keys.Add(1)
		s.inserts.Add(1)
	}
	return actual
}

// kill marks c dead if its state is fresh at now (or at any state when
// evict is set) and reports whether it did. A Take racing it either
// committed first (then the state is no longer fresh and kill re-judges)
// or finds the tombstone and moves to a new cell: no update is lost.
func kill(c *cell, now int64, evict bool) bool {
	for {
		st := c.state.Load()
		if st == store.Tombstone || !evict && !store.Fresh(st, c.rule.Load(), now) {
			return false
		}
		if c.state.CompareAndSwap(st, store.Tombstone) {
			return true
		}
	}
}

// remove deletes key's entry if it still maps to c.
func (s *Store) remove(key string, c *cell) {
	removed := false
	s.m.Compute(key, func(old *cell, loaded bool) (*cell, xsync.ComputeOp) {
		if loaded && old == c {
			removed = true
			return nil, xsync.DeleteOp
		}
		return old, xsync.CancelOp
	})
	if removed {
		s.keys.Add(-1)
	}
}

// Sweep removes every state that was fresh a second before now (so a
// concurrent Take with a slightly older clock reading is unaffected) and
// returns how many it removed. Removing a fresh state changes no decision.
// It is safe to run concurrently with Take; the caller owns the ticker.
func (s *Store) Sweep(now int64) (removed int) {
	now -= sweepGrace
	s.m.Range(func(key string, c *cell) bool {
		if kill(c, now, false) {
			s.remove(key, c)
			removed++
		}
		return true
	})
	s.swept.Add(uint64(removed))
	return removed
}

// makeRoom runs when an insert finds the store at its bound. One caller
// at a time passes over the map: it removes every fresh state (lossless),
// and if that freed fewer than MaxKeys/16 keys it evicts live ones, the
// first it met, until it has. So a pass costs O(MaxKeys) and frees at
// least MaxKeys/16 keys: amortised, an insert costs at most 16 visits,
// however many distinct keys arrive. Inserts that arrive during a pass
// (milliseconds at a million keys) do not wait and may overshoot the
// bound by that many.
func (s *Store) makeRoom(now int64) {
	if !s.evicting.CompareAndSwap(false, true) {
		return
	}
	defer s.evicting.Store(false)
	if s.keys.Load() < s.maxKeys {
		return
	}
	now -= sweepGrace
	type entry struct {
		key string
		c   *cell
	}
	live := make([]entry, 0, s.evictBatch)
	freed := 0
	s.m.Range(func(key string, c *cell) bool {
		if kill(c, now, false) {
			s.remove(key, c)
			freed++
		} else if len(live) < s.evictBatch {
			live = append(live, entry{key, c})
		}
		return true
	})
	s.swept.Add(uint64(freed))
	evicted := 0
	for _, e := range live {
		if freed+evicted >= s.evictBatch {
			break
		}
		if kill(e.c, now, true) {
			s.remove(e.key, e.c)
			evicted++
		}
	}
	s.evictions.Add(uint64(evicted))
}

// RangeKeys calls fn with each live key that starts with prefix and the
// decision a zero-cost check of it gets at now, in no particular order,
// until fn returns false. It is for debugging views: it reads a snapshot
// of each state and changes nothing.
func (s *Store) RangeKeys(prefix string, now int64, fn func(key string, d store.Decision) bool) {
	s.m.Range(func(key string, c *cell) bool {
		if !strings.HasPrefix(key, prefix) {
			return true
		}
		st := c.state.Load()
		if st == store.Tombstone {
			return true
		}
		_, d := store.Take(st, c.rule.Load(), now, 0)
		return fn(key, d)
	})
}

// Len returns the number of keys held.
func (s *Store) Len() int { return int(s.keys.Load()) }

// Stats returns the store's counters.
func (s *Store) Stats() Stats {
	return Stats{
		Keys:      s.Len(),
		Inserts:   s.inserts.Load(),
		Swept:     s.swept.Load(),
		Evictions: s.evictions.Load(),
	}
}
