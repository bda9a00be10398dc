package harness

import (
	"context"
	"time"
)

// Ended reports whether ctx, a run's context, had ended at t. A request's
// own context, whose deadline is the run's at its end, can be done (and
// the request fail) a moment before ctx is: such a failure is the run's
// end, not the server's.
func Ended(ctx context.Context, t time.Time) bool {
	d, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !t.Before(d)
}
