package store

import (
	"context"
	"math"
	"strconv"
	"time"
)

// Never is the RetryAfter of a denial that no amount of waiting can turn
// into a grant: the cost exceeds the rule's capacity.
const Never time.Duration = math.MaxInt64

// Decision is the outcome of one hit. It is plain data.
type Decision struct {
	// Allowed reports whether the hit's cost fits. In a batch that was
	// denied as a whole, hits that fitted still report Allowed with the
	// Remaining they had before the batch (nothing was consumed).
	Allowed bool
	// Limit is the rule's size: requests per window for a fixed or a
	// sliding window, the capacity (burst) for a token bucket.
	Limit uint64
	// Remaining is what is left after this hit: requests in the window,
	// or whole tokens in the bucket.
	Remaining uint64
	// ResetAfter is the time until the window ends, until the bucket is
	// full again, or until a sliding window's oldest counted bucket
	// leaves it (when Remaining next grows). Zero only for a full bucket
	// or a sliding window that counts nothing.
	ResetAfter time.Duration
	// RetryAfter is zero when allowed. When denied it is the exact time
	// until the same cost could succeed, or Never.
	RetryAfter time.Duration
	// Local reports a denial answered from a store's local cache of keys
	// known to be over their limit, without asking the shared store.
	Local bool
}

// Mode says what a hit consumes.
type Mode uint8

const (
	// ModeTake consumes Cost if it fits and its batch commits, else
	// nothing: a request that is allowed or denied as a whole.
	ModeTake Mode = iota
	// ModeSaturate is ModeTake, except that a hit that does not fit, or
	// whose batch is denied, consumes what is left, up to its cost.
	ModeSaturate
	// ModeCharge records usage that already happened: the whole Cost,
	// whether it fits or not and whatever the batch's outcome. Past the
	// limit it goes into the state as overshoot (a fixed window's count
	// above its limit) or debt (a token bucket's or a sliding window's,
	// repaid by later refills before anything is granted), bounded so no
	// arithmetic overflows (see docs/STORE.md). Its decision reports
	// whether it fitted.
	ModeCharge
	// ModeRefund gives Cost back, whatever the batch's outcome: the state
	// loses that much usage, never going below empty and never holding
	// more than the rule's capacity. It is never denied.
	ModeRefund
)

// String returns "take", "saturate", "charge" or "refund".
func (m Mode) String() string {
	switch m {
	case ModeSaturate:
		return "saturate"
	case ModeCharge:
		return "charge"
	case ModeRefund:
		return "refund"
	}
	return "take"
}

// Hit asks a store to apply Cost to the state under Key by Rule.
type Hit struct {
	// Key names the state. It carries the domain, the matched path, the
	// unit and the algorithm (see config's key format), so two rules never
	// share state by accident; hits on one key agree on Rule.Wide. A
	// store must not retain Key after Take returns; it copies the string
	// when it keeps it (callers may pass a string that aliases a reused
	// buffer).
	Key string
	// Rule is the compiled limit. Never nil.
	Rule *Rule
	// Cost is the number of requests or tokens to take, charge or refund.
	// Zero checks the state without consuming (a peek): Peek says when it
	// is allowed.
	Cost uint64
	// Veto is true when a denial of this hit denies the whole batch.
	// Shadow-mode rules set it false: they are reported but never deny.
	// A refund never denies.
	Veto bool
	// Mode says what the hit consumes; the zero value is ModeTake.
	Mode Mode
	// Plain asks for envoyproxy/ratelimit's layout of a fixed window's
	// counter (see PlainKeys), so that its pods and this store count in
	// one place: Key is then the reference's cache key up to the window
	// start. Only for a narrow fixed window of one of the reference's units
	// (Rule.Plainable); stores without shared state ignore it.
	Plain bool
	// Peek says when a hit of Cost 0 that is not a refund is allowed;
	// the zero value is PeekWithin.
	Peek Peek
}

// HitError is a store's failure on one hit of a batch. It names the hit
// by its index in the batch, never by its key: a key carries descriptor
// values, and errors reach logs, spans and clients. Callers name the
// hit's rule instead.
type HitError struct {
	Index int
	Err   error
}

func (e *HitError) Error() string { return "hit " + strconv.Itoa(e.Index) + ": " + e.Err.Error() }
func (e *HitError) Unwrap() error { return e.Err }

// Always reports whether a store applies the hit whatever its batch's
// outcome: a saturating hit, a charge or a refund.
func (h *Hit) Always() bool { return h.Mode != ModeTake }

// Peek is the rule for a peek: a hit of cost 0 (a take, a saturating hit
// or a charge), which consumes nothing.
type Peek uint8

const (
	// PeekWithin allows a peek unless the state is past its limit: a
	// window counting more than its limit, a token bucket or a sliding
	// window in debt (strictly past empty). A state exactly at its limit,
	// and a fresh state of a limit of 0, allow it. It is
	// envoyproxy/ratelimit's rule (over only when used + hits > limit), so
	// a budget peeked before each request and charged after it admits
	// one request more once used up to the limit exactly.
	PeekWithin Peek = iota
	// PeekStrict allows a peek only when one more unit would fit: no
	// request is admitted once the limit is reached, at the price of
	// answering differently from the reference at the limit.
	PeekStrict
)

// Need is what the hit needs to find to be allowed: its Cost, except 1
// for a peek under PeekStrict.
func (h *Hit) Need() uint64 {
	if h.Cost == 0 && h.Peek == PeekStrict && h.Mode != ModeRefund {
		return 1
	}
	return h.Cost
}

// Apply applies the hit at now (Unix nanoseconds) to state s: Apply of
// its rule, cost and mode, or for a peek that needs more than it costs
// (PeekStrict) Check of what it needs, consuming nothing.
func (h *Hit) Apply(s State, now int64) (State, Decision) {
	if n := h.Need(); n != h.Cost {
		return s, Check(s, h.Rule, now, n)
	}
	return Apply(s, h.Rule, now, h.Cost, h.Mode)
}

// Check is what the hit gets at now from state s when it must consume
// nothing (its batch was denied): Check of what it needs.
func (h *Hit) Check(s State, now int64) Decision { return Check(s, h.Rule, now, h.Need()) }

// State is one key's state as the algorithms see it. The zero State is
// the fresh state of every algorithm (a lapsed or empty window, a full
// bucket), never an "uninitialised" marker. Word holds the whole state
// of every rule except a wide one (Rule.Wide: a fixed window above
// MaxFixedWindowLimit), whose count's bits above the low 32 are in High;
// High is 0 otherwise. So stores keep a narrow rule's state in one atomic
// word.
type State struct {
	Word uint64
	High uint64
}

// Store holds per-key state and applies hits to it.
//
// Take applies hits as one batch at now (nanoseconds since the Unix
// epoch) and writes one decision per hit into out, which must have
// len(hits) elements. The batch is all-or-nothing for ModeTake hits: if
// any hit with Veto is denied, no ModeTake hit consumes anything; a store
// that consumed before it found the denial rolls back. Hits of the other
// modes apply whatever the outcome (see Mode). A rollback may briefly
// deny a concurrent caller; a store never over-grants.
//
// An error means the store could not decide (I/O failure, timeout, a
// cancelled ctx); out is then unspecified and nothing was consumed that
// the store knows of. Implementations are safe for concurrent use.
type Store interface {
	Take(ctx context.Context, now int64, hits []Hit, out []Decision) error
}

// Clock tells the time in nanoseconds since the Unix epoch.
// Implementations are safe for concurrent use.
type Clock interface {
	Now() int64
}

// Resetter is implemented by stores that can forget a key's state.
//
// Reset sets the counters of hits' keys back to empty: a fresh window, a
// full bucket, as if the keys had never been hit. Only each hit's Key and
// Rule matter (Cost, Veto and Mode are ignored); now is the caller's clock
// reading, in nanoseconds since the Unix epoch. A Take running at the same
// time lands before or after the reset, never half of it. An error means
// some keys may not have been reset. Implementations are safe for
// concurrent use.
type Resetter interface {
	Reset(ctx context.Context, now int64, hits []Hit) error
}
