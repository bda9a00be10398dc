package split

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/store"
)

// Store routes each hit to one of two stores and merges their decisions.
// Safe for concurrent use, as its two stores are.
type Store struct {
	main, other store.Store
	route       func(h *store.Hit) bool
	opt         Options

	refundFailures atomic.Uint64
}

// Options configure a Store. The zero value means the defaults.
type Options struct {
	// RefundTimeout bounds the wait for a refund, after the caller's
	// deadline if need be (the caller is waiting for it; default 50 ms).
	// A refund that fails leaves the takes counted until their windows
	// end: fewer grants, never more (Stats.RefundFailures counts them).
	RefundTimeout time.Duration
}

// New returns a store that sends the hits for which route is true to
// other and the rest to main. route must be a pure function of the hit's
// Rule and Key, so that a key always lives in one store.
func New(main, other store.Store, route func(h *store.Hit) bool, opt Options) *Store {
	if opt.RefundTimeout <= 0 {
		opt.RefundTimeout = 50 * time.Millisecond
	}
	return &Store{main: main, other: other, route: route, opt: opt}
}

// Stores returns the two stores New was given.
func (s *Store) Stores() (main, other store.Store) { return s.main, s.other }

// Stats are the store's counters.
type Stats struct {
	// RefundFailures counts refunds that failed: takes one store committed
	// in a batch the other denied (or failed), left counted.
	RefundFailures uint64
}

// Stats returns the store's counters.
func (s *Store) Stats() Stats { return Stats{RefundFailures: s.refundFailures.Load()} }

// half is one store's share of a batch: the indexes of its hits in the
// caller's batch, its hits and its decisions.
type half struct {
	idx  []int
	hits []store.Hit
	out  []store.Decision
	err  error
}

type scratch struct{ a, b half }

var scratches = sync.Pool{New: func() any { return new(scratch) }}

// Take applies hits as one all-or-nothing batch (see store.Store): a batch
// whose hits all go to one store is that store's Take; otherwise both
// stores take their shares in parallel, and if either denies or fails,
// the takes the other committed are refunded.
func (s *Store) Take(ctx context.Context, now int64, hits []store.Hit, out []store.Decision) error {
	if len(out) != len(hits) {
		return errors.New("split: a decision per hit needed")
	}
	n := 0
	for i := range hits {
		if s.route(&hits[i]) {
			n++
		}
	}
	switch n {
	case 0:
		return s.main.Take(ctx, now, hits, out)
	case len(hits):
		return s.other.Take(ctx, now, hits, out)
	}
	sc := scratches.Get().(*scratch)
	defer scratches.Put(sc)
	a, b := &sc.a, &sc.b
	a.reset()
	b.reset()
	for i := range hits {
		if s.route(&hits[i]) {
			b.add(i, hits[i])
		} else {
			a.add(i, hits[i])
		}
	}
	a.out, b.out = grow(a.out, len(a.hits)), grow(b.out, len(b.hits))
	done := make(chan struct{})
	go func() {
		b.err = s.other.Take(ctx, now, b.hits, b.out)
		close(done)
	}()
	a.err = s.main.Take(ctx, now, a.hits, a.out)
	<-done

	// A failed store's share consumed nothing it knows of; a store that
	// denied its share consumed no take. The other store gives its takes
	// back when the batch as a whole is denied or failed.
	aOK, bOK := a.err == nil && !a.denied(), b.err == nil && !b.denied()
	switch {
	case aOK && !bOK:
		s.refund(ctx, now, s.main, a)
	case bOK && !aOK:
		s.refund(ctx, now, s.other, b)
	}
	if err := errors.Join(batchIndex(a.err, a.idx), batchIndex(b.err, b.idx)); err != nil {
		return err
	}
	for k, i := range a.idx {
		out[i] = a.out[k]
	}
	for k, i := range b.idx {
		out[i] = b.out[k]
	}
	return nil
}

func (h *half) reset() {
	h.idx, h.hits, h.err = h.idx[:0], h.hits[:0], nil
}

func (h *half) add(i int, hit store.Hit) {
	h.idx = append(h.idx, i)
	h.hits = append(h.hits, hit)
}

func grow(d []store.Decision, n int) []store.Decision {
	if cap(d) < n {
		return make([]store.Decision, n)
	}
	return d[:n]
}

// denied reports whether h's share of the batch was denied: a hit with
// Veto was.
func (h *half) denied() bool {
	for k := range h.hits {
		if h.hits[k].Veto && !h.out[k].Allowed {
			return true
		}
	}
	return false
}

// refund gives back the takes that st committed for h, a share whose
// batch the other store denied or failed, and reports each of them as
// the batch's contract says: allowed, with what is left after the refund.
// Saturating hits, charges and refunds stay applied, as in any denied
// batch.
func (s *Store) refund(ctx context.Context, now int64, st store.Store, h *half) {
	var idx []int
	var hits []store.Hit
	for k := range h.hits {
		hit := h.hits[k]
		if hit.Mode != store.ModeTake || hit.Cost == 0 || !h.out[k].Allowed {
			continue
		}
		hit.Mode, hit.Veto = store.ModeRefund, false
		idx, hits = append(idx, k), append(hits, hit)
	}
	if len(hits) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.opt.RefundTimeout)
	defer cancel()
	out := make([]store.Decision, len(hits))
	if err := st.Take(ctx, now, hits, out); err != nil {
		s.refundFailures.Add(1)
		return
	}
	for j, k := range idx {
		h.out[k] = out[j]
	}
}

// ErrNoReset is Reset's error when a hit's store cannot reset.
var ErrNoReset = errors.New("split: a store cannot reset counters")

// Reset resets each hit's counter in the store its hits go to (see
// store.Resetter); both stores must implement store.Resetter for the
// hits routed to them.
func (s *Store) Reset(ctx context.Context, now int64, hits []store.Hit) error {
	var a, b []store.Hit
	for i := range hits {
		if s.route(&hits[i]) {
			b = append(b, hits[i])
		} else {
			a = append(a, hits[i])
		}
	}
	for _, p := range []struct {
		st   store.Store
		hits []store.Hit
	}{{s.main, a}, {s.other, b}} {
		if len(p.hits) == 0 {
			continue
		}
		rs, ok := p.st.(store.Resetter)
		if !ok {
			return ErrNoReset
		}
		if err := rs.Reset(ctx, now, p.hits); err != nil {
			return err
		}
	}
	return nil
}

// batchIndex makes a store.HitError in err, which names a hit of one
// store's share by its index there, name it by its index in the whole
// batch: idx maps the one to the other. The error is the share's own, made
// by this call, so it is changed in place.
func batchIndex(err error, idx []int) error {
	var he *store.HitError
	if errors.As(err, &he) && he.Index >= 0 && he.Index < len(idx) {
		he.Index = idx[he.Index]
	}
	return err
}
