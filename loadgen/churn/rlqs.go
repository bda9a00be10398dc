package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/loadgen"
	"github.com/sluicehq/sluice/loadgen/harness"
)

// rlqsChurn opens a stream every `every`, in turn to each replica, that
// reports fresh buckets every second for `life` and then ends: Envoys
// that come and go, each with buckets no one used before. Safe for
// concurrent use.
type rlqsChurn struct {
	clients []rlqspb.RateLimitQuotaServiceClient
	down    *harness.Outages
	gen     func() int
	every   time.Duration
	life    time.Duration
	fresh   int // fresh tenant buckets per stream
	renamed int

	mu              sync.Mutex
	opened, actions int
	errUp, errDown  int
	errs            []string // the first errors, up or down
}

// run opens streams until ctx ends and waits for those open to end.
func (c *rlqsChurn) run(ctx context.Context) {
	var wg sync.WaitGroup
	t := time.NewTicker(c.every)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
		}
		wg.Go(func() { c.stream(ctx, n) })
	}
}

// buckets are stream n's bucket ids: fresh tenants, under the key-only
// rule (one counter, so one demand group, each), and one bucket of a
// renamed rule of the newest generation.
func (c *rlqsChurn) buckets(n int) []map[string]string {
	ids := make([]map[string]string, 0, c.fresh+1)
	for j := range c.fresh {
		ids = append(ids, map[string]string{tenantKey: fmt.Sprintf("s%d-b%d", n, j)})
	}
	r := renamedRoute(c.gen(), n%max(c.renamed, 1))
	return append(ids, map[string]string{r: r, leafKey: "s" + strconv.Itoa(n)})
}

// stream is one Envoy: it reports its buckets (5 requests allowed each)
// every second for c.life, reads the assignments, then leaves. Its
// context has no deadline, as Envoy's streams have none: a deadline would
// reach the server (grpc-timeout), which may end the stream first, an
// error that is the soak's own doing.
func (c *rlqsChurn) stream(ctx context.Context, n int) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leave := time.After(c.life)
	st, err := c.clients[n%len(c.clients)].StreamRateLimitQuotas(sctx)
	if err != nil {
		c.failed(sctx, err)
		return
	}
	c.mu.Lock()
	c.opened++
	c.mu.Unlock()
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		c.receive(sctx, st)
	}()
	defer func() { <-recvDone }()
	usages := make([]*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, 0, c.fresh+1)
	for _, id := range c.buckets(n) {
		usages = append(usages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: id}, TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5})
	}
	for first := true; ; first = false {
		m := &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: usages}
		if first {
			m.Domain = domain
		}
		if err := st.Send(m); err != nil {
			if !errors.Is(err, io.EOF) { // EOF: the server ended the stream; Recv has its status
				c.failed(sctx, err)
			}
			return
		}
		select {
		case <-sctx.Done():
			return
		case <-leave:
			_ = st.CloseSend()
			cancel()
			return
		case <-time.After(time.Second):
		}
	}
}

// receive counts the bucket actions until the stream ends.
func (c *rlqsChurn) receive(ctx context.Context, st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	for {
		r, err := st.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				c.failed(ctx, err)
			}
			return
		}
		c.mu.Lock()
		c.actions += len(r.GetBucketAction())
		c.mu.Unlock()
	}
}

// failed counts an error of a stream whose context is ctx, unless it is
// the stream's own end (its life or the soak's end).
func (c *rlqsChurn) failed(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	down := c.down.Overlaps(now.Add(-time.Second), now)
	c.mu.Lock()
	defer c.mu.Unlock()
	when := "Redis up"
	if down {
		c.errDown++
		when = "Redis down"
	} else {
		c.errUp++
	}
	if len(c.errs) < maxErrors {
		c.errs = append(c.errs, fmt.Sprintf("%s RLQS stream (%s): %v", now.Format(time.TimeOnly), when, err))
	}
}

// rlqsChurnResult is what the churning streams saw.
type rlqsChurnResult struct {
	Opened, Actions, ErrUp, ErrDown int
	Errs                            []string
}

func (c *rlqsChurn) result() rlqsChurnResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	return rlqsChurnResult{Opened: c.opened, Actions: c.actions, ErrUp: c.errUp, ErrDown: c.errDown, Errs: c.errs}
}

// rlqsFleet is the steady RLQS fleet: loadgen's simulated Envoys, every
// one reporting {tenant: shared} at twice its share of rlqsLimit and
// enforcing its assignments, spread over the replicas. Its seconds are
// kept as they end.
type rlqsFleet struct {
	mu      sync.Mutex
	seconds []loadgen.Second
}

// run simulates the fleet until d passes or ctx ends.
func (r *rlqsFleet) run(ctx context.Context, targets []string, proxies int, d time.Duration) error {
	_, err := loadgen.RunRLQS(ctx, loadgen.RLQSOptions{Targets: targets, Domain: domain, Key: tenantKey,
		Proxies: proxies, Limit: rlqsLimit, Step: 20 * time.Millisecond, Duration: d,
		Every: func(s loadgen.Second) {
			r.mu.Lock()
			r.seconds = append(r.seconds, s)
			r.mu.Unlock()
		}})
	if ctx.Err() != nil {
		return nil // the soak's end, not the fleet's failure
	}
	return err
}

func (r *rlqsFleet) result() []loadgen.Second {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seconds
}
