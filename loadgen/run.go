package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/cputime"
)

const method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// Options describe a run. The zero value of each field means its default.
type Options struct {
	// Target is the server's address, in gRPC's target syntax
	// (host:port, unix:///path, dns:///name:port).
	Target string
	// Requests are sent in turn by every worker. At least one.
	Requests []*rlspb.RateLimitRequest
	// Concurrency is the number of workers, each with one request
	// outstanding at a time (default 1).
	Concurrency int
	// Connections is the number of HTTP/2 connections, shared by the
	// workers in turn (default 1).
	Connections int
	// Duration is how long to measure (default 10s), after Warmup.
	Duration time.Duration
	// Warmup is how long to send before measuring (default none).
	Warmup time.Duration
	// Rate, when positive, sends Rate requests per second on a fixed
	// schedule shared by the workers (open loop); latency is measured
	// from each request's scheduled time. Every request scheduled before
	// the end is sent, late if the workers fell behind, and waited for up
	// to Duration past the end. Zero sends as fast as replies come back
	// (closed loop).
	Rate float64
	// DialOptions are added to the connections' options, for transport
	// credentials. Without credentials the connections are plaintext.
	DialOptions []grpc.DialOption
	// Timeout, when positive, is each call's deadline, sent as
	// grpc-timeout (Envoy's filter sends its timeout so); a call past it
	// counts as DeadlineExceeded. Zero sends no deadline.
	Timeout time.Duration
}

// Result is what a run measured. Requests counts the calls that started
// (closed loop) or were scheduled (open loop) after the warmup and before
// the end, and finished. A closed loop cancels the calls outstanding at
// the end and does not count them.
type Result struct {
	Target      string  `json:"target"`
	Concurrency int     `json:"concurrency"`
	Connections int     `json:"connections"`
	Rate        float64 `json:"rate,omitempty"`
	Seconds     float64 `json:"duration_s"`
	Requests    uint64  `json:"requests"`
	// RPS is Requests per second of Duration (closed loop), or per
	// second from the end of the warmup to the last reply (open loop):
	// less than Rate when the server could not keep up.
	RPS float64 `json:"rps"`
	// Unfinished counts the requests an open loop scheduled in the
	// measured time that had no reply Duration after the end.
	Unfinished uint64 `json:"unfinished,omitempty"`
	// Codes counts calls by gRPC status code name ("OK", "Unavailable").
	Codes map[string]uint64 `json:"grpc_codes"`
	// Overall counts successful calls by the reply's overall_code.
	Overall map[string]uint64 `json:"overall_codes"`
	// StatusMismatches counts replies whose number of statuses differed
	// from the request's number of descriptors.
	StatusMismatches uint64 `json:"status_mismatches"`
	// Latency runs from each call's start (closed loop) or scheduled
	// time (open loop).
	Latency Latency `json:"latency_us"`
	// Service, in an open loop only, runs from each call's actual start,
	// as most load generators measure; Latency - Service is how late the
	// generator sent (Go timers wake up to a millisecond late on an idle
	// machine).
	Service *Latency `json:"service_latency_us,omitempty"`
	// CPUPerRequest is the CPU time this process spent per finished
	// call (warmup included), in microseconds: the generator's own cost
	// when the server runs elsewhere. Zero where the platform cannot tell.
	CPUPerRequest float64 `json:"cpu_us_per_request"`
}

// Latency summarises a run's latencies in microseconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
}

// worker is one concurrency slot and its private tallies.
type worker struct {
	conn     *grpc.ClientConn
	frames   []*frame
	next     int
	reply    reply
	hist     Histogram
	service  *Histogram // open loop only: from the actual send
	codes    [maxCode + 1]uint64
	overall  [3]uint64
	mismatch uint64
	calls    uint64    // every call that finished, warmup included
	last     time.Time // when the last recorded call finished
	timeout  time.Duration
}

const maxCode = codes.Unauthenticated

// Run connects to o.Target, sends load for o.Warmup + o.Duration and
// returns what it measured. It returns early, with an error, if ctx ends.
func Run(ctx context.Context, o Options) (*Result, error) {
	p, err := newPlan(o)
	if err != nil {
		return nil, err
	}
	conns, err := dial(ctx, o.Target, p.nconn, o.DialOptions)
	if err != nil {
		return nil, err
	}
	defer closeConns(conns)
	workers := p.workers(conns)
	cpu0 := cputime.Process()
	s := p.schedule(time.Now())
	p.drive(ctx, s, workers)
	cpu := cputime.Process() - cpu0
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("loadgen: run interrupted: %w", err)
	}
	r := p.summarise(workers, cpu)
	if o.Rate > 0 {
		s.openLoop(r, o.Rate, workers)
	}
	return r, nil
}

// plan is a run's options checked, defaults applied and requests
// marshalled.
type plan struct {
	o           Options
	conc, nconn int
	dur         time.Duration
	frames      []*frame
}

func newPlan(o Options) (*plan, error) {
	if len(o.Requests) == 0 {
		return nil, errors.New("loadgen: no requests to send")
	}
	if o.Rate < 0 {
		return nil, fmt.Errorf("loadgen: rate %v is negative", o.Rate)
	}
	p := &plan{o: o, conc: max(o.Concurrency, 1), nconn: max(o.Connections, 1), dur: o.Duration}
	if p.dur <= 0 {
		p.dur = 10 * time.Second
	}
	p.frames = make([]*frame, len(o.Requests))
	for i, r := range o.Requests {
		f, err := newFrame(r)
		if err != nil {
			return nil, err
		}
		p.frames[i] = f
	}
	return p, nil
}

// workers are the run's concurrency slots, spread over conns in turn,
// each starting at its own offset in the requests.
func (p *plan) workers(conns []*grpc.ClientConn) []*worker {
	workers := make([]*worker, p.conc)
	for i := range workers {
		workers[i] = &worker{conn: conns[i%p.nconn], frames: p.frames, next: i * len(p.frames) / p.conc, timeout: p.o.Timeout}
		if p.o.Rate > 0 {
			workers[i].service = new(Histogram)
		}
	}
	return workers
}

// schedule is when a run sends and measures: calls start (closed loop)
// or are due (open loop) from start to end and are measured from from;
// the run stops at stopAt, which gives an open loop's late calls
// Duration more to finish.
type schedule struct {
	start, from, end, stopAt time.Time
}

func (p *plan) schedule(start time.Time) schedule {
	warm := max(p.o.Warmup, 0)
	s := schedule{start: start, from: start.Add(warm), end: start.Add(warm + p.dur)}
	s.stopAt = s.end
	if p.o.Rate > 0 {
		s.stopAt = s.end.Add(p.dur)
	}
	return s
}

// drive runs the workers on schedule s until they are done, at s.stopAt
// or when ctx ends.
func (p *plan) drive(ctx context.Context, s schedule, workers []*worker) {
	// Cancelled at stopAt by a timer rather than a deadline: a deadline
	// would travel to the server as grpc-timeout (only o.Timeout should),
	// and a call the server times out a moment early would be counted.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	timer := time.AfterFunc(time.Until(s.stopAt), cancel)
	defer timer.Stop()
	var ticket atomic.Int64
	var wg sync.WaitGroup
	for _, w := range workers {
		wg.Go(func() {
			if p.o.Rate > 0 {
				w.open(runCtx, &ticket, p.o.Rate, s.start, s.from, s.end)
			} else {
				w.closed(runCtx, s.from, s.end)
			}
		})
	}
	wg.Wait()
}

// openLoop corrects an open loop's result: the requests scheduled in the
// measured time but never answered, and the throughput up to the last
// answer.
func (s schedule) openLoop(r *Result, rate float64, workers []*worker) {
	// Tickets n with from <= start + n/rate < end.
	due := func(t time.Time) uint64 { return uint64(math.Ceil(t.Sub(s.start).Seconds() * rate)) }
	if scheduled := due(s.end) - due(s.from); scheduled > r.Requests {
		r.Unfinished = scheduled - r.Requests
	}
	last := s.end
	for _, w := range workers {
		if w.last.After(last) {
			last = w.last
		}
	}
	r.RPS = float64(r.Requests) / last.Sub(s.from).Seconds()
}

// dial opens n connections and waits until each is ready, so that
// connection setup is not measured.
func dial(ctx context.Context, target string, n int, extra []grpc.DialOption) ([]*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})),
	}, extra...)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conns := make([]*grpc.ClientConn, 0, n)
	fail := func(err error) ([]*grpc.ClientConn, error) {
		closeConns(conns)
		return nil, fmt.Errorf("loadgen: connect to %s: %w", target, err)
	}
	for range n {
		c, err := grpc.NewClient(target, opts...)
		if err != nil {
			return fail(err)
		}
		conns = append(conns, c)
		if err := connect(ctx, c); err != nil {
			return fail(err)
		}
	}
	return conns, nil
}

// connect connects c and waits until it is ready.
func connect(ctx context.Context, c *grpc.ClientConn) error {
	c.Connect()
	for s := c.GetState(); s != connectivity.Ready; s = c.GetState() {
		if s == connectivity.TransientFailure {
			return errors.New("connection failed")
		}
		if !c.WaitForStateChange(ctx, s) {
			return ctx.Err()
		}
	}
	return nil
}

func closeConns(conns []*grpc.ClientConn) {
	for _, c := range conns {
		c.Close()
	}
}

// closed sends back to back until end, recording calls started at or
// after from.
func (w *worker) closed(ctx context.Context, from, end time.Time) {
	for {
		t0 := time.Now()
		if !t0.Before(end) {
			return
		}
		f := w.frame()
		err := w.invoke(ctx, f)
		t1 := time.Now()
		if ctx.Err() != nil {
			return
		}
		w.calls++
		if !t0.Before(from) {
			w.record(t1.Sub(t0), f, err)
		}
	}
}

// open takes tickets from the shared schedule: ticket n is due at
// start + n/rate. A worker that is late sends at once, and the wait is
// charged to the request's latency.
func (w *worker) open(ctx context.Context, ticket *atomic.Int64, rate float64, start, from, end time.Time) {
	for {
		n := ticket.Add(1) - 1
		due := start.Add(time.Duration(float64(n) / rate * float64(time.Second)))
		if !due.Before(end) {
			return
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		f := w.frame()
		t0 := time.Now()
		err := w.invoke(ctx, f)
		t1 := time.Now()
		if ctx.Err() != nil {
			return
		}
		w.calls++
		if !due.Before(from) {
			w.record(t1.Sub(due), f, err)
			w.service.Record(int64(t1.Sub(t0)))
			w.last = t1
		}
	}
}

// invoke sends f, with the run's per-call deadline if any.
func (w *worker) invoke(ctx context.Context, f *frame) error {
	if w.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.timeout)
		defer cancel()
	}
	return w.conn.Invoke(ctx, method, f, &w.reply)
}

func (w *worker) frame() *frame {
	f := w.frames[w.next]
	if w.next++; w.next == len(w.frames) {
		w.next = 0
	}
	return f
}

func (w *worker) record(d time.Duration, f *frame, err error) {
	w.hist.Record(int64(d))
	c := status.Code(err)
	if c > maxCode {
		c = codes.Unknown
	}
	w.codes[c]++
	if err != nil {
		return
	}
	if int(w.reply.code) < len(w.overall) {
		w.overall[w.reply.code]++
	}
	if w.reply.statuses != f.descriptors {
		w.mismatch++
	}
}

// summary is h's quantiles in microseconds.
func summary(h *Histogram) Latency {
	us := func(ns int64) float64 { return float64(ns) / 1e3 }
	return Latency{
		Mean: h.Mean() / 1e3, P50: us(h.Quantile(0.5)), P90: us(h.Quantile(0.9)),
		P99: us(h.Quantile(0.99)), P999: us(h.Quantile(0.999)), Max: us(h.Max()),
	}
}

// summarise merges the workers' tallies; cpu is this process's CPU time
// over the run.
func (p *plan) summarise(workers []*worker, cpu time.Duration) *Result {
	var h, service Histogram
	var calls uint64
	r := &Result{
		Target: p.o.Target, Concurrency: p.conc, Connections: p.nconn, Rate: p.o.Rate,
		Seconds: p.dur.Seconds(), Codes: map[string]uint64{}, Overall: map[string]uint64{},
	}
	for _, w := range workers {
		h.Merge(&w.hist)
		if w.service != nil {
			service.Merge(w.service)
		}
		for c, n := range w.codes {
			if n > 0 {
				r.Codes[codes.Code(c).String()] += n
			}
		}
		for c, n := range w.overall {
			if n > 0 {
				r.Overall[rlspb.RateLimitResponse_Code(c).String()] += n
			}
		}
		r.StatusMismatches += w.mismatch
		calls += w.calls
	}
	r.Requests = h.Count()
	r.RPS = float64(r.Requests) / p.dur.Seconds()
	r.Latency = summary(&h)
	if p.o.Rate > 0 {
		s := summary(&service)
		r.Service = &s
	}
	if calls > 0 {
		r.CPUPerRequest = float64(cpu.Nanoseconds()) / 1e3 / float64(calls)
	}
	return r
}
