package quota

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/sluicehq/sluice/internal/sparse"
)

// Run calls Tick every interval until ctx is done. With a Fleet, it first
// calls Tick at once, so that the replica is known to the others before
// its first interval ends.
//
// A failed exchange is logged at most once per logInterval, with the
// count of those not logged (all are in sluice_rlqs_fleet_errors_total): a
// Redis outage must not log a line every interval. A panic in Tick is
// recovered, counted (Stats.Panics) and logged with its stack, at most
// once per logInterval too: the interval is lost, the next one recomputes
// every share.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.o.Interval)
	defer t.Stop()
	fleetLog, panicLog := sparse.Log{Every: logInterval}, sparse.Log{Every: logInterval}
	tick := func(now time.Time) {
		p, err := s.tickSafely(ctx, now)
		switch {
		case p != nil:
			if quiet, ok := panicLog.Due(now); ok {
				s.o.Logger.Error("rlqs: panic while recomputing the shares (recovered)", "panic", fmt.Sprint(p.value),
					"stack", string(p.stack), "panics_not_logged", quiet)
			}
		case err != nil:
			if quiet, ok := fleetLog.Due(now); ok {
				s.o.Logger.Warn("rlqs: sharing demand with the fleet failed; dividing with the last known demand", "err", err, "failures_not_logged", quiet)
			}
		}
	}
	if s.o.Fleet != nil {
		tick(time.Now())
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-t.C:
			tick(now)
		}
	}
}

// recovered is a panic and where it happened.
type recovered struct {
	value any
	stack []byte
}

// tickSafely runs Tick, recovering a panic.
func (s *Service) tickSafely(ctx context.Context, now time.Time) (p *recovered, err error) {
	defer func() {
		if v := recover(); v != nil {
			s.panics.Add(1)
			p = &recovered{v, debug.Stack()}
		}
	}()
	return nil, s.Tick(ctx, now)
}

// logInterval is the least time between two log lines of the same kind
// from Run.
const logInterval = time.Minute
