package main

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	ratelimitpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// rlsTimeout is every RLS request's deadline (grpc-timeout).
const rlsTimeout = time.Second

// maxErrors is how many error messages a driver keeps for the report.
const maxErrors = 20

// rlsClass is one kind of RLS request and its rate.
type rlsClass struct {
	rate float64 // requests per second
	// limited is the index in limited of the class's rule, or -1 for a
	// class whose grants are not held against a limit.
	limited int
	request func(n int) *rlspb.RateLimitRequest
}

// rlsSecond is one wall-clock second of RLS traffic, by the second its
// requests were sent in.
type rlsSecond struct {
	// Offered, Granted and Ambiguous are per limited rule. A grant is in
	// Granted when its request was sent and answered within the second
	// (so the server decided in that second's window), in Ambiguous when
	// the answer came in the next second (either window).
	Offered, Granted, Ambiguous []int
	// Others are the requests of the other classes.
	Others int
	// ErrUp and ErrDown are failed requests (any gRPC error, or an
	// answer with overall code UNKNOWN) outside and inside the outages.
	ErrUp, ErrDown int
}

// rlsTraffic is the soak's steady RLS load, sent in turn to every
// replica. Safe for concurrent use.
type rlsTraffic struct {
	clients []rlspb.RateLimitServiceClient
	down    *harness.Outages
	classes []rlsClass

	mu      sync.Mutex
	seconds map[int64]*rlsSecond // by Unix second
	errs    []string             // the first errors outside outages
}

// newRLSTraffic drives the limited rules at overdrive × their limits,
// the detailed rule at detailedRate over detailedValues values, and the
// newest renamed rules (gen gives the generation last pushed) at
// churnRate.
func newRLSTraffic(clients []rlspb.RateLimitServiceClient, down *harness.Outages, s settings, gen func() int) *rlsTraffic {
	t := &rlsTraffic{clients: clients, down: down, seconds: map[int64]*rlsSecond{}}
	for i, r := range limited {
		t.classes = append(t.classes, rlsClass{rate: s.overdrive * float64(r.perSecond), limited: i,
			request: func(int) *rlspb.RateLimitRequest { return rlsRequest(entry(routeKey, r.name)) }})
	}
	t.classes = append(t.classes, rlsClass{rate: s.detailedRate, limited: -1, request: func(n int) *rlspb.RateLimitRequest {
		return rlsRequest(entry(detailedKey, "c"+strconv.Itoa(n%s.detailedValues)))
	}})
	if s.renamed > 0 {
		t.classes = append(t.classes, rlsClass{rate: s.churnRate, limited: -1, request: func(n int) *rlspb.RateLimitRequest {
			r := renamedRoute(gen(), n%s.renamed)
			return rlsRequest(entry(r, r), entry(leafKey, "c"+strconv.Itoa(n%7)))
		}})
	}
	return t
}

func entry(k, v string) *ratelimitpb.RateLimitDescriptor_Entry {
	return &ratelimitpb.RateLimitDescriptor_Entry{Key: k, Value: v}
}

func rlsRequest(es ...*ratelimitpb.RateLimitDescriptor_Entry) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitpb.RateLimitDescriptor{{Entries: es}}}
}

// run sends every class until ctx ends: a class of rate r has a worker
// per 25 requests a second, each sending on its own ticker and waiting
// for each answer (a slow answer delays that worker's next request).
func (t *rlsTraffic) run(ctx context.Context) {
	var wg sync.WaitGroup
	for _, c := range t.classes {
		if c.rate <= 0 {
			continue
		}
		workers := int(math.Ceil(c.rate / 25))
		every := time.Duration(float64(time.Second) * float64(workers) / c.rate)
		for w := range workers {
			wg.Go(func() { t.worker(ctx, c, w, workers, every) })
		}
	}
	wg.Wait()
}

func (t *rlsTraffic) worker(ctx context.Context, c rlsClass, w, workers int, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for n := w; ; n += workers {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, rlsTimeout)
		t0 := time.Now()
		resp, err := t.clients[n%len(t.clients)].ShouldRateLimit(rctx, c.request(n))
		t1 := time.Now()
		cancel()
		if harness.Ended(ctx, t1) {
			return // the end of the soak, not a failure
		}
		t.record(c, t0, t1, resp, err)
	}
}

func (t *rlsTraffic) record(c rlsClass, t0, t1 time.Time, resp *rlspb.RateLimitResponse, err error) {
	if err == nil && resp.GetOverallCode() == rlspb.RateLimitResponse_UNKNOWN {
		err = fmt.Errorf("overall code UNKNOWN: %v", resp)
	}
	down := err != nil && t.down.Overlaps(t0, t1)
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.seconds[t0.Unix()]
	if s == nil {
		n := len(limited)
		s = &rlsSecond{Offered: make([]int, n), Granted: make([]int, n), Ambiguous: make([]int, n)}
		t.seconds[t0.Unix()] = s
	}
	switch {
	case err != nil && down:
		s.ErrDown++
	case err != nil:
		s.ErrUp++
		if len(t.errs) < maxErrors {
			t.errs = append(t.errs, fmt.Sprintf("%s RLS after %v: %v", t0.Format(time.TimeOnly), t1.Sub(t0).Round(time.Millisecond), err))
		}
	}
	if c.limited < 0 {
		s.Others++
		return
	}
	s.Offered[c.limited]++
	if err != nil || resp.GetOverallCode() != rlspb.RateLimitResponse_OK {
		return
	}
	if t0.Unix() == t1.Unix() {
		s.Granted[c.limited]++
	} else {
		s.Ambiguous[c.limited]++
	}
}

// result returns the seconds recorded and the errors kept.
func (t *rlsTraffic) result() (map[int64]*rlsSecond, []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seconds, t.errs
}
