package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// simProxy is one simulated Envoy. The fleet reads its counters; the
// rest belongs to its own goroutine.
type simProxy struct {
	o        *RLQSOptions
	i        int
	offered  []atomic.Uint64 // per second of the run
	admitted []atomic.Uint64

	shared  map[string]string   // the measured bucket's id
	extra   []map[string]string // the other buckets' ids
	actions chan *rlqspb.RateLimitQuotaResponse_BucketAction

	stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient // nil while out of the fleet
	cancel context.CancelFunc                                       // the stream's
	bucket localBucket                                              // the shared bucket's assignment
	// subscribed: a report of the shared bucket was sent since it was
	// created.
	subscribed      bool
	lastReport      time.Time
	allowed, denied uint64 // since lastReport
	acc             float64
	lastStep        time.Time
	// past is when (Unix ns) the latest step done began, MaxInt64 once
	// the proxy stopped: the fleet reads a second once every proxy is
	// past it.
	past atomic.Int64
}

func newSimProxy(o *RLQSOptions, i, secs int) *simProxy {
	p := &simProxy{o: o, i: i, offered: make([]atomic.Uint64, secs+2), admitted: make([]atomic.Uint64, secs+2),
		shared: map[string]string{o.Key: "shared"}, extra: make([]map[string]string, o.Buckets-1),
		actions: make(chan *rlqspb.RateLimitQuotaResponse_BucketAction, 1024)}
	prefix := ""
	if o.DistinctBuckets {
		prefix = "p" + strconv.Itoa(i)
	}
	for j := range p.extra {
		p.extra[j] = map[string]string{o.Key: prefix + "b" + strconv.Itoa(j)}
	}
	return p
}

// errRunOver is a step's report cut short by the end of the run.
var errRunOver = errors.New("loadgen: the run is over")

// run is one proxy: it joins the fleet when its demand starts, leaves
// when it stops (closing its stream), and in between steps.
func (p *simProxy) run(ctx context.Context, cc *grpc.ClientConn, start time.Time) error {
	tick := time.NewTicker(p.o.Step)
	defer tick.Stop()
	defer p.past.Store(math.MaxInt64)
	defer p.leave()
	p.lastStep = start // (requests arrive from the start, however late the first step)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		now := time.Now()
		if err := p.step(ctx, cc, start, now); err != nil {
			if errors.Is(err, errRunOver) {
				return nil
			}
			return err
		}
		p.past.Store(now.UnixNano())
	}
}

// step is one time step at now: leave or join as the demand curve says,
// take the assignments received, let the step's arrivals through the
// shared bucket, and report when a report is due.
func (p *simProxy) step(ctx context.Context, cc *grpc.ClientConn, start, now time.Time) error {
	t := now.Sub(start).Seconds()
	rate := p.o.rate(p.i, t, p.o.Duration.Seconds())
	if rate == 0 {
		p.leave()
		p.lastStep = now // (none arrive while the demand is 0)
		return nil
	}
	if p.stream == nil {
		if err := p.join(ctx, cc); err != nil {
			return fmt.Errorf("proxy %d: %w", p.i, err)
		}
	}
	p.takeActions(now)
	if int(t) >= len(p.offered) {
		return nil
	}
	n, from, el := p.arrivals(now, rate)
	p.admit(start, n, from, el)
	// A new bucket is reported at once; then every interval.
	if !p.subscribed && n > 0 || p.subscribed && now.Sub(p.lastReport) >= p.o.ReportInterval {
		if err := p.report(now); err != nil {
			if ctx.Err() != nil {
				return errRunOver
			}
			return fmt.Errorf("proxy %d: report: %w", p.i, err)
		}
	}
	return nil
}

// join opens a stream, as a new Envoy does: no assignments yet, nothing
// reported. The stream's bucket actions go to p.actions until it ends.
func (p *simProxy) join(ctx context.Context, cc *grpc.ClientConn) error {
	sctx, cancel := context.WithCancel(ctx)
	s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(sctx)
	if err != nil {
		cancel()
		return err
	}
	p.stream, p.cancel = s, cancel
	p.bucket = p.newBucket()
	p.subscribed, p.lastReport = false, time.Time{}
	go p.receive(sctx, s)
	return nil
}

func (p *simProxy) receive(ctx context.Context, s rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient) {
	for {
		r, err := s.Recv()
		if err != nil {
			return
		}
		for _, a := range r.BucketAction {
			select {
			case p.actions <- a:
			case <-ctx.Done():
				return
			}
		}
	}
}

// leave ends the stream, as an Envoy that stops does.
func (p *simProxy) leave() {
	if p.stream != nil {
		p.cancel()
		p.stream, p.cancel = nil, nil
	}
}

func (p *simProxy) newBucket() localBucket {
	return localBucket{noAssign: p.o.NoAssignment, onExpired: p.o.Expired}
}

// takeActions applies the shared bucket's actions received so far: an
// assignment, or an abandon that drops it (the next report subscribes
// again).
func (p *simProxy) takeActions(now time.Time) {
	for {
		select {
		case a := <-p.actions:
			if a.GetBucketId().GetBucket()[p.o.Key] != "shared" {
				continue
			}
			if a.GetAbandonAction() != nil {
				p.bucket = p.newBucket()
				p.subscribed = false
			} else {
				p.bucket.apply(now, a.GetQuotaAssignmentAction())
			}
		default:
			return
		}
	}
}

// arrivals are the requests that arrived at rate since the last step,
// over [from, from+el]: a late step (a busy machine) brings more at once,
// not fewer overall, up to a second's worth. With no step before (and
// lastStep unset), none arrive.
func (p *simProxy) arrivals(now time.Time, rate float64) (n uint64, from time.Time, el time.Duration) {
	from, el = p.lastStep, min(now.Sub(p.lastStep), time.Second)
	if !p.lastStep.IsZero() && el > 0 {
		p.acc += rate * el.Seconds()
	} else {
		from, el = now, 0
	}
	p.lastStep = now
	n = uint64(max(p.acc, 0))
	p.acc -= float64(n)
	return n, from, el
}

// admit puts n arrivals through the shared bucket. They are spread
// evenly over [from, from+el], as real traffic is, even when the step ran
// late, and each counts in the second of the run (from start) it arrived
// in.
func (p *simProxy) admit(start time.Time, n uint64, from time.Time, el time.Duration) {
	for k := range n {
		at := from.Add(el * time.Duration(k+1) / time.Duration(n))
		ok := p.bucket.allow(at)
		if ok {
			p.allowed++
		} else {
			p.denied++
		}
		if sec := int(at.Sub(start) / time.Second); sec >= 0 && sec < len(p.offered) {
			p.offered[sec].Add(1)
			if ok {
				p.admitted[sec].Add(1)
			}
		}
	}
}

// report sends the usage since the last report: the shared bucket's
// requests allowed and denied, and ExtraRequests allowed on each other
// bucket. A stream's first report names the domain.
func (p *simProxy) report(now time.Time) error {
	o := p.o
	el := now.Sub(p.lastReport)
	if p.lastReport.IsZero() || el <= 0 {
		el = o.ReportInterval
	}
	m := &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: make([]*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, 0, o.Buckets)}
	if p.lastReport.IsZero() {
		m.Domain = o.Domain
	}
	m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: &rlqspb.BucketId{Bucket: p.shared}, TimeElapsed: durationpb.New(el),
		NumRequestsAllowed: p.allowed, NumRequestsDenied: p.denied})
	for _, id := range p.extra {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: id}, TimeElapsed: durationpb.New(el), NumRequestsAllowed: o.ExtraRequests})
	}
	p.allowed, p.denied, p.lastReport, p.subscribed = 0, 0, now, true
	return p.stream.Send(m)
}
