package main

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// canaries sends requests on keys whose budgets are exact and checks that
// no window of any key was granted more than its limit: the Redis
// instances share one budget per key, the memory instance has its own.
type canaries struct {
	limit  int
	mu     sync.Mutex
	epoch  int
	paused bool
	// failures outside the Redis-down intervals, for the summary
	failures []string
	// grants per "group/key/window end (unix minutes)".
	grants map[string]int
}

func newCanaries(limit int) *canaries { return &canaries{limit: limit, grants: map[string]int{}} }

// pause stops new canary requests until nextEpoch.
func (c *canaries) pause() {
	c.mu.Lock()
	c.paused = true
	c.mu.Unlock()
}

// nextEpoch resumes canary requests on new keys.
func (c *canaries) nextEpoch() {
	c.mu.Lock()
	c.epoch++
	c.paused = false
	c.mu.Unlock()
}

func (c *canaries) run(ctx context.Context, insts []*instance, rate float64, down *harness.Outages) {
	const keys, workers = 4, 8
	var wg sync.WaitGroup
	interval := time.Duration(float64(time.Second) * workers / rate)
	for wk := range workers {
		wg.Go(func() {
			t := time.NewTicker(interval)
			defer t.Stop()
			for n := wk; ; n++ {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				in := insts[n%len(insts)]
				group := "redis"
				if in.store == "memory" {
					group = "memory"
				}
				c.mu.Lock()
				// (Each key goes to every instance in turn.)
				key, paused := fmt.Sprintf("%s-e%d-k%d", group, c.epoch, n/len(insts)%keys), c.paused
				c.mu.Unlock()
				if !paused {
					c.send(ctx, in, group, key, down)
				}
			}
		})
	}
	wg.Wait()
}

func (c *canaries) send(ctx context.Context, in *instance, group, key string, down *harness.Outages) {
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	t0 := time.Now()
	resp, err := rlspb.NewRateLimitServiceClient(in.conn).ShouldRateLimit(cctx, &rlspb.RateLimitRequest{Domain: "soak",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{{Entries: []*ratelimitpb.RateLimitDescriptor_Entry{{Key: "canary", Value: key}}}}})
	t1 := time.Now()
	if harness.Ended(ctx, t1) {
		return // the end of the soak, not a failure
	}
	var o outcomes
	switch {
	case err != nil:
		if group == "redis" && down.Overlaps(t0, t1) {
			o.canaryExcused = 1
		} else {
			o.canaryFailed = 1
			c.mu.Lock()
			c.failures = append(c.failures, fmt.Sprintf("%s %s after %v: %v", t0.Format(time.TimeOnly), in.name, t1.Sub(t0).Round(time.Millisecond), err))
			c.mu.Unlock()
		}
	case resp.OverallCode == rlspb.RateLimitResponse_OK:
		o.canaryOK = 1
		st := resp.Statuses[0]
		// The window's end, to the minute: the reply's time plus the
		// time until the reset, rounded.
		endMin := int64(math.Round(float64(t1.Add(st.DurationUntilReset.AsDuration()).Unix()) / 60))
		c.mu.Lock()
		c.grants[group+"/"+key+"/"+strconv.FormatInt(endMin, 10)]++
		c.mu.Unlock()
	}
	in.count(o)
}

// overGrants returns the key windows granted more than the limit (as
// "group/key/window: grants"), the key windows seen and the grants.
func (c *canaries) overGrants() (over []string, windows, grants int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, n := range c.grants {
		if n > c.limit {
			over = append(over, fmt.Sprintf("%s: %d", k, n))
		}
		grants += n
	}
	slices.Sort(over)
	return over, len(c.grants), grants
}
