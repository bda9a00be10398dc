package store

import (
	"context"
	"math"
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

// Hit asks a store to apply Cost to the state under Key by Rule.
type Hit struct {
	// Key names the state. It carries the domain, the matched path, the
	// unit and the algorithm (see config's key format), so two rules never
	// share state by accident. A store must not retain Key after Take
	// returns; it copies the string when it keeps it (callers may pass a
	// string that aliases a reused buffer).
	Key string
	// Rule is the compiled limit. Never nil.
	Rule *Rule
	// Cost is the number of requests or tokens to take. Zero checks the
	// state without consuming.
	Cost uint64
	// Veto is true when a denial of this hit denies the whole batch.
	// Shadow-mode rules set it false: they are reported but never deny.
	Veto bool
	// Saturate makes the hit consume what is left, up to its limit, when
	// the batch is denied, instead of nothing. It is for usage charged
	// after the fact (Envoy's apply_on_stream_done), where denying no
	// longer prevents the spend.
	Saturate bool
}

// Store holds per-key state and applies hits to it.
//
// Take applies hits as one batch at now (nanoseconds since the Unix
// epoch) and writes one decision per hit into out, which must have
// len(hits) elements. The batch is all-or-nothing: if any hit with Veto is
// denied, no hit consumes anything (hits with Saturate excepted); a store
// that consumed before it found the denial rolls back. A rollback may
// briefly deny a concurrent caller; a store never over-grants.
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
