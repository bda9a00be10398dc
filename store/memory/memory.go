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
	m          *xsync.Map[string, *cell]     // narrow rules: one word a key
	wm         *xsync.Map[string, *wideCell] // wide rules (store.Rule.Wide)
	maxKeys    int64
	evictBatch int

	keys      atomic.Int64 // live map entries, both maps
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
	state atomic.Uint64 // store.State.Word; store.Tombstone once removed
	rule  atomic.Pointer[store.Rule]
}

// wideCell is the key of a wide rule, whose state takes two words: an
// immutable pair behind a pointer, replaced by compare-and-swap (each
// change allocates one). dead marks it removed.
type wideCell struct {
	state atomic.Pointer[store.State]
	rule  atomic.Pointer[store.Rule]
}

var (
	// dead is the state pointer of a removed wideCell.
	dead = new(store.State)
	// fresh is a new wideCell's state; it is never modified.
	fresh = new(store.State)
)

// New returns an empty Store.
func New(opts Options) *Store {
	maxKeys := opts.MaxKeys
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	return &Store{
		m:          xsync.NewMap[string, *cell](),
		wm:         xsync.NewMap[string, *wideCell](),
		maxKeys:    int64(maxKeys),
		evictBatch: max(1, maxKeys/16),
		clock:      opts.Clock,
	}
}

// slot is the cell a hit changed: c for a narrow rule, w for a wide one,
// neither when it inserted nothing.
type slot struct {
	c *cell
	w *wideCell
}

// taken records a consumption to roll back if the batch is denied.
type taken struct {
	slot
	before, after store.State
}

// Take applies hits as one batch at now, per store.Store.
//
// Vetoing hits are taken first, in order; once one is denied the rest are
// only evaluated, and after the non-vetoing hits have been evaluated the
// taken ones are rolled back. Non-vetoing (shadow) hits consume only when
// the batch commits. Hits that apply whatever the outcome (saturating,
// charges, refunds) always do, in their turn. Hits on the same key see
// each other in order. Hits beyond the eighth of a batch cost one
// allocation.
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
		case denied && !h.Always():
			out[i] = s.peek(h, now)
			continue
		}
		sl, before, after, d := s.apply(h, now)
		out[i] = d
		switch {
		case !d.Allowed:
			denied = true
		case !h.Always() && after != before:
			tk[i] = taken{sl, before, after}
		}
	}
	for i := range hits {
		h := &hits[i]
		switch {
		case h.Veto:
		case denied && !h.Always():
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
		if tk[i].slot != (slot{}) {
			rollback(tk[i], &hits[i], at)
		}
	}
	for i := range hits {
		if tk[i].slot != (slot{}) {
			out[i] = store.View(s.load(&hits[i]), hits[i].Rule, now)
		}
	}
	return nil
}

// apply runs the hit's algorithm on its key's cell with a CAS loop,
// returning the cell, the states before and after, and the decision.
// A hit that would leave a missing key fresh (a check, a denial, a
// refund) inserts nothing, so checks of hostile keys cost no memory.
func (s *Store) apply(h *store.Hit, now int64) (sl slot, before, after store.State, d store.Decision) {
	if h.Rule.Wide() {
		return s.applyWide(h, now)
	}
	for {
		c, ok := s.m.Load(h.Key)
		if !ok {
			if after, d = h.Apply(store.State{}, now); after == (store.State{}) {
				return slot{}, before, after, d
			}
			c = insert(s, s.m, h.Key, now, func() *cell {
				c := new(cell)
				c.rule.Store(h.Rule)
				return c
			})
		} else if c.rule.Load() != h.Rule {
			c.rule.Store(h.Rule)
		}
		for {
			w := c.state.Load()
			if w == store.Tombstone {
				break
			}
			before = store.State{Word: w}
			if h.Mode == store.ModeTake && h.Cost > 0 {
				after, d = store.Take(before, h.Rule, now, h.Cost) // (one call less: the hot path)
			} else {
				after, d = h.Apply(before, now)
			}
			if after.Word == w || c.state.CompareAndSwap(w, after.Word) {
				return slot{c: c}, before, after, d
			}
		}
		// Swept or evicted: help remove the dead entry, then find or
		// insert the live one.
		remove(s, s.m, h.Key, c)
	}
}

// applyWide is apply for a wide rule: the same loop on a pointer.
func (s *Store) applyWide(h *store.Hit, now int64) (sl slot, before, after store.State, d store.Decision) {
	for {
		w, ok := s.wm.Load(h.Key)
		if !ok {
			if after, d = h.Apply(store.State{}, now); after == (store.State{}) {
				return slot{}, before, after, d
			}
			w = insert(s, s.wm, h.Key, now, func() *wideCell {
				w := new(wideCell)
				w.state.Store(fresh)
				w.rule.Store(h.Rule)
				return w
			})
		} else if w.rule.Load() != h.Rule {
			w.rule.Store(h.Rule)
		}
		for {
			p := w.state.Load()
			if p == dead {
				break
			}
			before = *p
			after, d = h.Apply(before, now)
			if after == before {
				return slot{w: w}, before, after, d
			}
			n := new(store.State)
			*n = after
			if w.state.CompareAndSwap(p, n) {
				return slot{w: w}, before, after, d
			}
		}
		remove(s, s.wm, h.Key, w)
	}
}

// rollback rolls back one take at now, the time of the rollback. If
// nothing touched the state since, it goes back exactly; otherwise
// store.Rollback takes back what the take still owes. A removed state
// (swept: it had lapsed; or evicted) has nothing to undo.
func rollback(t taken, h *store.Hit, now int64) {
	next := func(cur store.State) store.State {
		if cur != t.after {
			return store.Rollback(cur, t.after, h.Rule, now, h.Cost)
		}
		return t.before
	}
	if c := t.c; c != nil {
		for {
			cur := c.state.Load()
			if cur == store.Tombstone || c.state.CompareAndSwap(cur, next(store.State{Word: cur}).Word) {
				return
			}
		}
	}
	for {
		p := t.w.state.Load()
		if p == dead {
			return
		}
		n := new(store.State)
		if *n = next(*p); *n == *p || t.w.state.CompareAndSwap(p, n) {
			return
		}
	}
}

// peek decides a hit of a denied batch without consuming: a denial as
// Take reports it, or a fit reported as Allowed with what remains now.
func (s *Store) peek(h *store.Hit, now int64) store.Decision {
	return h.Check(s.load(h), now)
}

// load returns the state of the hit's key, fresh if it has none.
func (s *Store) load(h *store.Hit) store.State {
	if h.Rule.Wide() {
		if w, ok := s.wm.Load(h.Key); ok {
			if p := w.state.Load(); p != dead {
				return *p
			}
		}
		return store.State{}
	}
	if c, ok := s.m.Load(h.Key); ok {
		if w := c.state.Load(); w != store.Tombstone {
			return store.State{Word: w}
		}
	}
	return store.State{}
}

// insert adds the cell newCell makes for key to m, making room first at
// the bound, and returns the key's cell (another caller's if it won the
// race).
func insert[C any](s *Store, m *xsync.Map[string, *C], key string, now int64, newCell func() *C) *C {
	if s.keys.Load() >= s.maxKeys {
		s.makeRoom(now)
	}
	// The key may alias the caller's reused buffer: keep a copy.
	actual, loaded := m.LoadOrStore(strings.Clone(key), newCell())
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
func (c *cell) kill(now int64, evict bool) bool {
	for {
		st := c.state.Load()
		if st == store.Tombstone || !evict && !store.Fresh(store.State{Word: st}, c.rule.Load(), now) {
			return false
		}
		if c.state.CompareAndSwap(st, store.Tombstone) {
			return true
		}
	}
}

// kill is cell.kill for a wide rule's cell.
func (w *wideCell) kill(now int64, evict bool) bool {
	for {
		p := w.state.Load()
		if p == dead || !evict && !store.Fresh(*p, w.rule.Load(), now) {
			return false
		}
		if w.state.CompareAndSwap(p, dead) {
			return true
		}
	}
}

// remove deletes key's entry from m if it still maps to c.
func remove[C comparable](s *Store, m *xsync.Map[string, C], key string, c C) {
	removed := false
	m.Compute(key, func(old C, loaded bool) (C, xsync.ComputeOp) {
		if loaded && old == c {
			removed = true
			return old, xsync.DeleteOp
		}
		return old, xsync.CancelOp
	})
	if removed {
		s.keys.Add(-1)
	}
}

// killable is a cell of either map.
type killable interface {
	comparable
	kill(now int64, evict bool) bool
}

// sweep removes m's states that are fresh at now and returns how many.
func sweep[C killable](s *Store, m *xsync.Map[string, C], now int64) (removed int) {
	m.Range(func(key string, c C) bool {
		if c.kill(now, false) {
			remove(s, m, key, c)
			removed++
		}
		return true
	})
	return removed
}

// Sweep removes every state that was fresh a second before now (so a
// concurrent Take with a slightly older clock reading is unaffected) and
// returns how many it removed. Removing a fresh state changes no decision.
// It is safe to run concurrently with Take; the caller owns the ticker.
func (s *Store) Sweep(now int64) (removed int) {
	now -= sweepGrace
	removed = sweep(s, s.m, now) + sweep(s, s.wm, now)
	s.swept.Add(uint64(removed))
	return removed
}

// makeRoom runs when an insert finds the store at its bound. One caller
// at a time passes over the maps: it removes every fresh state (lossless),
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
	freed := sweep(s, s.m, now) + sweep(s, s.wm, now)
	s.swept.Add(uint64(freed))
	evicted := evict(s, s.m, now, s.evictBatch-freed)
	evicted += evict(s, s.wm, now, s.evictBatch-freed-evicted)
	s.evictions.Add(uint64(evicted))
}

// evict drops up to n live states of m, the first it meets, and returns
// how many it dropped.
func evict[C killable](s *Store, m *xsync.Map[string, C], now int64, n int) (evicted int) {
	if n <= 0 {
		return 0
	}
	m.Range(func(key string, c C) bool {
		if c.kill(now, true) {
			remove(s, m, key, c)
			evicted++
		}
		return evicted < n
	})
	return evicted
}

// RangeKeys calls fn with each live key that starts with prefix and what
// a check of it reports at now (store.View), in no particular order, until
// fn returns false. It is for debugging views: it reads a snapshot of each
// state and changes nothing.
func (s *Store) RangeKeys(prefix string, now int64, fn func(key string, d store.Decision) bool) {
	more := true
	s.m.Range(func(key string, c *cell) bool {
		if st := c.state.Load(); st != store.Tombstone && strings.HasPrefix(key, prefix) {
			more = fn(key, store.View(store.State{Word: st}, c.rule.Load(), now))
		}
		return more
	})
	if !more {
		return
	}
	s.wm.Range(func(key string, w *wideCell) bool {
		if p := w.state.Load(); p != dead && strings.HasPrefix(key, prefix) {
			return fn(key, store.View(*p, w.rule.Load(), now))
		}
		return true
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

var _ store.Resetter = (*Store)(nil)

// Reset removes the states of hits' keys, per store.Resetter: the next
// hit of each finds it fresh. A Take racing it finds its cell dead and
// inserts a new one (see kill), so it counts either before the reset (and
// is forgotten) or after it. It never fails.
func (s *Store) Reset(_ context.Context, now int64, hits []store.Hit) error {
	for i := range hits {
		h := &hits[i]
		if h.Rule.Wide() {
			if w, ok := s.wm.Load(h.Key); ok && w.kill(now, true) {
				remove(s, s.wm, h.Key, w)
			}
			continue
		}
		if c, ok := s.m.Load(h.Key); ok && c.kill(now, true) {
			remove(s, s.m, h.Key, c)
		}
	}
	return nil
}
