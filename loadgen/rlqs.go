package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/loadgen/harness"
	"github.com/sluicehq/sluice/quota"
)

// The demand curves of a fleet simulation.
const (
	DemandSteady = "steady" // every proxy at Rate
	DemandSkewed = "skewed" // the first fifth at 10×Rate, the rest at Rate
	DemandBursty = "bursty" // each proxy at 4×Rate one second in four (staggered), Rate/4 otherwise
	DemandChurn  = "churn"  // steady; the last fifth joins at a third of the run and leaves at two thirds
)

// RLQSOptions describe a fleet simulation: Proxies simulated Envoys, each
// with one stream to a replica in Targets (in turn), reporting every
// ReportInterval and enforcing their assignments locally as Envoy's
// rate_limit_quota filter does. Every proxy reports bucket {Key:
// "shared"}, whose limit L is Limit per second, and Buckets-1 more
// buckets {Key: "b<j>"} with ExtraRequests per report (load on the server,
// not measured; with DistinctBuckets {Key: "p<i>b<j>"}, each proxy's
// own). The zero value of each field means its default.
type RLQSOptions struct {
	Targets     []string
	DialOptions []grpc.DialOption
	Domain      string // default "rlqs"
	Key         string // default "tenant"
	Buckets     int    // per proxy, default 1
	// DistinctBuckets gives each proxy extra buckets of its own, as a
	// client inventing bucket ids does: every one is a limit of its own.
	DistinctBuckets bool
	// ExtraRequests is what each extra bucket reports allowed per report;
	// default 1.
	ExtraRequests uint64
	Proxies       int    // default 50
	Demand        string // default steady
	// Rate is the base demand of one proxy in requests per second;
	// default 2·Limit/Proxies (Limit/(2·Proxies) for skewed, so that the
	// light proxies need less than an equal share).
	Rate float64
	// Limit is L in requests per second: the config's limit of the
	// shared bucket. Required.
	Limit          float64
	ReportInterval time.Duration // default 1s
	// Step is the simulation's time step (default 10 ms): arrivals and
	// local enforcement happen in steps.
	Step     time.Duration
	Duration time.Duration // default 30s
	// NoAssignment and Expired are the proxies' no_assignment_behavior
	// and expired_assignment_behavior.
	NoAssignment, Expired Fallback
	// MetricsURLs are the replicas' /metrics, read every second for
	// their CPU and bucket reports; optional.
	MetricsURLs []string
	// Every, if set, is called with each second's figures as it ends.
	Every func(Second)
}

// Second is one second of a simulation.
type Second struct {
	T int `json:"t"`
	// Start is when the second began (seconds of a run are whole
	// wall-clock seconds).
	Start  time.Time `json:"start"`
	Active int       `json:"proxies"`
	// Offered and Admitted are the fleet's requests in the second.
	Offered  float64 `json:"offered"`
	Admitted float64 `json:"admitted"`
	Limit    float64 `json:"limit"`
	// MaxDev and MeanDev compare each active proxy's admitted requests
	// with its max-min fair share of Limit given the second's offered
	// demands: |admitted − fair| / fair, the largest and the mean.
	MaxDev  float64 `json:"max_dev"`
	MeanDev float64 `json:"mean_dev"`
	// ServerCores is the replicas' CPU in the second (from MetricsURLs),
	// Reports the bucket reports they received, CPUPerReport their CPU
	// per bucket report in µs.
	ServerCores  float64 `json:"server_cores,omitempty"`
	Reports      float64 `json:"bucket_reports,omitempty"`
	CPUPerReport float64 `json:"cpu_per_report_us,omitempty"`
}

// RLQSResult sums a simulation up from its Settle-th second on (after two
// reporting intervals, the proxies' first assignments and reports).
type RLQSResult struct {
	Seconds []Second `json:"seconds"`
	Settle  int      `json:"settle_s"`
	// Within5 is the fraction of settled seconds with demand above the
	// limit whose admitted total was within ±5 % of it; MinRatio and
	// MaxRatio bound admitted/limit over those seconds.
	Within5            float64 `json:"within_5pct"`
	MinRatio, MaxRatio float64
	// Above90 is the fraction of those seconds that admitted at least
	// 0.9 × the limit; MaxSecond is the most any second of the run
	// admitted, settled or not, over the limit (MaxSettled of the settled
	// seconds), whatever the demand.
	Above90    float64 `json:"above_90pct"`
	MaxSecond  float64 `json:"max_second"`
	MaxSettled float64 `json:"max_settled"`
	// DevP50 and DevP90 are quantiles of the seconds' MeanDev, MaxDevP90
	// of their MaxDev.
	DevP50, DevP90, MaxDevP90 float64
	CPUPerReport              float64 `json:"cpu_per_report_us,omitempty"`
	ServerCores               float64 `json:"server_cores,omitempty"`
}

func (o *RLQSOptions) defaults() error {
	if len(o.Targets) == 0 {
		return errors.New("loadgen: no target")
	}
	if !(o.Limit > 0) {
		return errors.New("loadgen: the shared bucket's limit per second must be positive")
	}
	if o.Domain == "" {
		o.Domain = "rlqs"
	}
	if o.Key == "" {
		o.Key = "tenant"
	}
	o.Buckets = max(o.Buckets, 1)
	o.ExtraRequests = max(o.ExtraRequests, 1)
	if o.Proxies <= 0 {
		o.Proxies = 50
	}
	switch o.Demand {
	case "":
		o.Demand = DemandSteady
	case DemandSteady, DemandSkewed, DemandBursty, DemandChurn:
	default:
		return fmt.Errorf("loadgen: demand %q: want steady, skewed, bursty or churn", o.Demand)
	}
	if o.Rate <= 0 {
		o.Rate = 2 * o.Limit / float64(o.Proxies)
		if o.Demand == DemandSkewed {
			o.Rate = o.Limit / float64(2*o.Proxies)
		}
	}
	if o.ReportInterval <= 0 {
		o.ReportInterval = time.Second
	}
	if o.Step <= 0 {
		o.Step = 10 * time.Millisecond
	}
	if o.Duration <= 0 {
		o.Duration = 30 * time.Second
	}
	return nil
}

// rate is proxy i's demand per second at t seconds into a run of d
// seconds; 0 while it is not part of the fleet.
func (o *RLQSOptions) rate(i int, t, d float64) float64 {
	n := o.Proxies
	switch o.Demand {
	case DemandSkewed:
		if i < n/5 {
			return 10 * o.Rate
		}
	case DemandBursty:
		if int(t)%4 == i%4 {
			return 4 * o.Rate
		}
		return o.Rate / 4
	case DemandChurn:
		if i >= n-n/5 && (t < d/3 || t >= 2*d/3) {
			return 0
		}
	}
	return o.Rate
}

// RunRLQS runs a fleet simulation until its Duration passes or ctx ends.
func RunRLQS(ctx context.Context, o RLQSOptions) (*RLQSResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	conns, err := dialRLQS(ctx, o.Targets, o.DialOptions)
	if err != nil {
		return nil, err
	}
	defer closeConns(conns)
	// Seconds of the run are whole wall-clock seconds, as the windows of
	// requests_per_time_unit are: a second then holds exactly one window.
	start := time.Now().Truncate(time.Second).Add(time.Second)
	if err := sleepUntil(ctx, start); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithDeadline(ctx, start.Add(o.Duration+10*time.Second))
	defer cancel()
	f := startFleet(ctx, &o, conns, start)
	res, err := f.watch(ctx)
	if err != nil {
		return nil, err
	}
	cancel()
	if err := f.wait(); err != nil {
		return res, err
	}
	res.summarize()
	return res, nil
}

// dialRLQS opens a connection to each target and waits until each is
// ready: connection setup would otherwise take the run's first steps (on
// a busy machine, up to its whole first second, which then has no
// traffic).
func dialRLQS(ctx context.Context, targets []string, extra []grpc.DialOption) ([]*grpc.ClientConn, error) {
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, extra...)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conns := make([]*grpc.ClientConn, 0, len(targets))
	for _, t := range targets {
		cc, err := grpc.NewClient(t, opts...)
		if err == nil {
			conns = append(conns, cc)
			err = connect(ctx, cc)
		}
		if err != nil {
			closeConns(conns)
			return nil, fmt.Errorf("loadgen: connect to %s: %w", t, err)
		}
	}
	return conns, nil
}

// sleepUntil waits until t, or returns ctx's error if it ends first.
func sleepUntil(ctx context.Context, t time.Time) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(t)):
		return nil
	}
}

// simFleet is a simulation under way: its proxies, each on a goroutine
// of its own from start.
type simFleet struct {
	o       *RLQSOptions
	start   time.Time
	secs    int // whole seconds in the run
	proxies []*simProxy
	wg      sync.WaitGroup
	errc    chan error // the proxies' failures
}

// startFleet starts o.Proxies proxies, spread over conns in turn.
func startFleet(ctx context.Context, o *RLQSOptions, conns []*grpc.ClientConn, start time.Time) *simFleet {
	secs := int(o.Duration / time.Second)
	f := &simFleet{o: o, start: start, secs: secs, proxies: make([]*simProxy, o.Proxies), errc: make(chan error, o.Proxies)}
	for i := range f.proxies {
		p := newSimProxy(o, i, secs)
		f.proxies[i] = p
		f.wg.Go(func() {
			if err := p.run(ctx, conns[i%len(conns)], start); err != nil {
				f.errc <- err
			}
		})
	}
	return f
}

// watch reads each second of the run once it has ended, with the
// servers' figures when there are MetricsURLs, and passes it to
// o.Every. It returns ctx's error if ctx ends first.
func (f *simFleet) watch(ctx context.Context) (*RLQSResult, error) {
	o := f.o
	res := &RLQSResult{Settle: int(math.Ceil((2 * o.ReportInterval).Seconds())) + 1}
	servers := newServerMeter(ctx, o.MetricsURLs)
	for s := range f.secs {
		// Read second s once every proxy has stepped past it.
		if err := f.waitPast(ctx, f.start.Add(time.Duration(s+1)*time.Second)); err != nil {
			return nil, err
		}
		sec := f.second(s)
		servers.read(ctx, &sec)
		res.Seconds = append(res.Seconds, sec)
		if o.Every != nil {
			o.Every(sec)
		}
	}
	return res, nil
}

// waitPast waits until t, then until every proxy has done its steps
// before t: its latest step was at t or later, or it stopped. A proxy
// late on a busy machine (a step runs whenever its goroutine gets to)
// would otherwise have arrivals of the second missing when it is read,
// or its offered requests read before and its admitted ones after a step.
func (f *simFleet) waitPast(ctx context.Context, t time.Time) error {
	if err := sleepUntil(ctx, t); err != nil {
		return err
	}
	for _, p := range f.proxies {
		for p.past.Load() < t.UnixNano() {
			if err := sleepUntil(ctx, time.Now().Add(f.o.Step)); err != nil {
				return fmt.Errorf("loadgen: proxy %d has not stepped past second %d: %w", p.i, int(t.Sub(f.start)/time.Second), err)
			}
		}
	}
	return nil
}

// second is second s of the run (from 0) as the proxies counted it: the
// fleet's requests, and how far each active proxy's admitted requests
// were from its max-min fair share of the limit given the second's
// offered demands.
func (f *simFleet) second(s int) Second {
	o := f.o
	sec := Second{T: s + 1, Start: f.start.Add(time.Duration(s) * time.Second), Limit: o.Limit}
	var active []*simProxy
	var demands []float64
	for _, p := range f.proxies {
		if o.rate(p.i, float64(s), o.Duration.Seconds()) == 0 {
			continue
		}
		active = append(active, p)
		off := float64(p.offered[s].Load())
		demands = append(demands, off)
		sec.Offered += off
		sec.Admitted += float64(p.admitted[s].Load())
	}
	sec.Active = len(active)
	fair := make([]float64, len(demands))
	quota.FairShares(demands, o.Limit, fair)
	n := 0
	for j, p := range active {
		if fair[j] < 1 {
			continue
		}
		d := math.Abs(float64(p.admitted[s].Load())-fair[j]) / fair[j]
		sec.MaxDev = max(sec.MaxDev, d)
		sec.MeanDev += d
		n++
	}
	if n > 0 {
		sec.MeanDev /= float64(n)
	}
	return sec
}

// wait waits for the proxies to stop (cancel their context first) and
// returns a failure of one of them.
func (f *simFleet) wait() error {
	f.wg.Wait()
	select {
	case err := <-f.errc:
		return err
	default:
		return nil
	}
}

func (r *RLQSResult) summarize() {
	var means, maxes, cpus, cores []float64
	in, above, over := 0, 0, 0
	r.MinRatio, r.MaxRatio = math.Inf(1), 0
	for _, s := range r.Seconds {
		r.MaxSecond = max(r.MaxSecond, s.Admitted/s.Limit)
		if s.T <= r.Settle {
			continue
		}
		r.MaxSettled = max(r.MaxSettled, s.Admitted/s.Limit)
		means, maxes = append(means, s.MeanDev), append(maxes, s.MaxDev)
		if s.CPUPerReport > 0 {
			cpus, cores = append(cpus, s.CPUPerReport), append(cores, s.ServerCores)
		}
		if s.Offered <= s.Limit {
			continue
		}
		over++
		ratio := s.Admitted / s.Limit
		r.MinRatio, r.MaxRatio = min(r.MinRatio, ratio), max(r.MaxRatio, ratio)
		if math.Abs(ratio-1) <= 0.05 {
			in++
		}
		if ratio >= 0.9 {
			above++
		}
	}
	if over > 0 {
		r.Within5, r.Above90 = float64(in)/float64(over), float64(above)/float64(over)
	} else {
		r.MinRatio = 0
	}
	r.DevP50, r.DevP90, r.MaxDevP90 = quantile(means, 0.5), quantile(means, 0.9), quantile(maxes, 0.9)
	r.CPUPerReport, r.ServerCores = quantile(cpus, 0.5), quantile(cores, 0.5)
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1)+0.5)]
}

// serverMeter reads the replicas' CPU and bucket reports from their
// /metrics, to give each second the change since the one before.
type serverMeter struct {
	urls   []string
	prev   metricsSample
	prevOK bool
}

func newServerMeter(ctx context.Context, urls []string) *serverMeter {
	m := &serverMeter{urls: urls}
	if len(urls) > 0 {
		m.prev, m.prevOK = readMetrics(ctx, urls)
	}
	return m
}

// read sets sec's server figures. A second whose metrics (or the
// previous ones) could not be read has none.
func (m *serverMeter) read(ctx context.Context, sec *Second) {
	if len(m.urls) == 0 {
		return
	}
	cur, ok := readMetrics(ctx, m.urls)
	if ok && m.prevOK {
		sec.ServerCores = cur.cpu - m.prev.cpu
		sec.Reports = cur.reports - m.prev.reports
		if sec.Reports > 0 {
			sec.CPUPerReport = sec.ServerCores / sec.Reports * 1e6
		}
	}
	m.prev, m.prevOK = cur, ok
}

type metricsSample struct{ cpu, reports float64 }

// readMetrics sums process_cpu_seconds_total and
// sluice_rlqs_bucket_reports_total over urls; ok is false if any could
// not be read.
func readMetrics(ctx context.Context, urls []string) (m metricsSample, ok bool) {
	const cpu, reports = "process_cpu_seconds_total", "sluice_rlqs_bucket_reports_total"
	ok = true
	for _, u := range urls {
		s, err := harness.Scrape(ctx, http.DefaultClient, u, cpu, reports)
		if err != nil {
			ok = false
			continue
		}
		m.cpu += s.Sum[cpu]
		m.reports += s.Sum[reports]
	}
	return m, ok
}
