package loadgen

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

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

// simProxy is one simulated Envoy.
type simProxy struct {
	o        *RLQSOptions
	i        int
	offered  []atomic.Uint64 // per second of the run
	admitted []atomic.Uint64
}

// RunRLQS runs a fleet simulation until its Duration passes or ctx ends.
func RunRLQS(ctx context.Context, o RLQSOptions) (*RLQSResult, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	conns := make([]*grpc.ClientConn, len(o.Targets))
	for i, t := range o.Targets {
		opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, o.DialOptions...)
		cc, err := grpc.NewClient(t, opts...)
		if err != nil {
			return nil, err
		}
		defer cc.Close()
		conns[i] = cc
	}
	secs := int(o.Duration / time.Second)
	// Seconds of the run are whole wall-clock seconds, as the windows of
	// requests_per_time_unit are: a second then holds exactly one window.
	start := time.Now().Truncate(time.Second).Add(time.Second)
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(time.Until(start)):
	}
	ctx, cancel := context.WithDeadline(ctx, start.Add(o.Duration+10*time.Second))
	defer cancel()
	proxies := make([]*simProxy, o.Proxies)
	var wg sync.WaitGroup
	errc := make(chan error, o.Proxies)
	for i := range proxies {
		p := &simProxy{o: &o, i: i, offered: make([]atomic.Uint64, secs+2), admitted: make([]atomic.Uint64, secs+2)}
		proxies[i] = p
		wg.Go(func() {
			if err := p.run(ctx, conns[i%len(conns)], start); err != nil {
				errc <- err
			}
		})
	}
	res := &RLQSResult{Settle: int(math.Ceil((2 * o.ReportInterval).Seconds())) + 1}
	var prev metricsSample
	prevOK := false
	if len(o.MetricsURLs) > 0 {
		prev, prevOK = readMetrics(ctx, o.MetricsURLs)
	}
	demands, fair := make([]float64, 0, o.Proxies), make([]float64, o.Proxies)
	for s := 0; s < secs; s++ {
		// Read second s once every proxy has stepped past it.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Until(start.Add(time.Duration(s+1)*time.Second + 3*o.Step))):
		}
		sec := Second{T: s + 1, Start: start.Add(time.Duration(s) * time.Second), Limit: o.Limit}
		demands = demands[:0]
		var active []*simProxy
		for _, p := range proxies {
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
		quota.FairShares(demands, o.Limit, fair[:len(demands)])
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
		if len(o.MetricsURLs) > 0 {
			// A second whose metrics (or the previous ones) could not be
			// read has no server figures.
			cur, ok := readMetrics(ctx, o.MetricsURLs)
			if ok && prevOK {
				sec.ServerCores = cur.cpu - prev.cpu
				sec.Reports = cur.reports - prev.reports
				if sec.Reports > 0 {
					sec.CPUPerReport = sec.ServerCores / sec.Reports * 1e6
				}
			}
			prev, prevOK = cur, ok
		}
		res.Seconds = append(res.Seconds, sec)
		if o.Every != nil {
			o.Every(sec)
		}
	}
	cancel()
	wg.Wait()
	select {
	case err := <-errc:
		return res, err
	default:
	}
	res.summarize()
	return res, nil
}

func (r *RLQSResult) summarize() {
	var means, maxes, cpus, cores []float64
	in, over := 0, 0
	r.MinRatio, r.MaxRatio = math.Inf(1), 0
	for _, s := range r.Seconds {
		if s.T <= r.Settle {
			continue
		}
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
	}
	if over > 0 {
		r.Within5 = float64(in) / float64(over)
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

// run is one proxy: it joins the fleet when its demand starts, leaves
// when it stops (closing its stream), and in between steps.
func (p *simProxy) run(ctx context.Context, cc *grpc.ClientConn, start time.Time) error {
	o := p.o
	d := o.Duration.Seconds()
	tick := time.NewTicker(o.Step)
	defer tick.Stop()
	var stream rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	var streamCancel context.CancelFunc
	defer func() {
		if streamCancel != nil {
			streamCancel()
		}
	}()
	actions := make(chan *rlqspb.RateLimitQuotaResponse_BucketAction, 1024)
	shared := map[string]string{o.Key: "shared"}
	var b localBucket
	var acc float64
	var lastStep time.Time
	var allowed, denied uint64
	subscribed := false // a report of the shared bucket was sent since it was created
	var lastReport time.Time
	extra := make([]map[string]string, o.Buckets-1)
	prefix := ""
	if o.DistinctBuckets {
		prefix = "p" + strconv.Itoa(p.i)
	}
	for j := range extra {
		extra[j] = map[string]string{o.Key: prefix + "b" + strconv.Itoa(j)}
	}
	send := func(now time.Time, first bool) error {
		el := now.Sub(lastReport)
		if lastReport.IsZero() || el <= 0 {
			el = o.ReportInterval
		}
		m := &rlqspb.RateLimitQuotaUsageReports{BucketQuotaUsages: make([]*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, 0, o.Buckets)}
		if first {
			m.Domain = o.Domain
		}
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId: &rlqspb.BucketId{Bucket: shared}, TimeElapsed: durationpb.New(el),
			NumRequestsAllowed: allowed, NumRequestsDenied: denied})
		for _, id := range extra {
			m.BucketQuotaUsages = append(m.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: &rlqspb.BucketId{Bucket: id}, TimeElapsed: durationpb.New(el), NumRequestsAllowed: o.ExtraRequests})
		}
		allowed, denied, lastReport, subscribed = 0, 0, now, true
		return stream.Send(m)
	}
	for {
		var now time.Time
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			now = time.Now()
		}
		t := now.Sub(start).Seconds()
		rate := o.rate(p.i, t, d)
		if rate == 0 {
			if stream != nil { // leave: Envoy stopped, its stream ends
				streamCancel()
				stream, streamCancel = nil, nil
			}
			continue
		}
		if stream == nil { // join: a new Envoy, no assignments yet
			sctx, c := context.WithCancel(ctx)
			s, err := rlqspb.NewRateLimitQuotaServiceClient(cc).StreamRateLimitQuotas(sctx)
			if err != nil {
				c()
				return fmt.Errorf("proxy %d: %w", p.i, err)
			}
			stream, streamCancel = s, c
			b = localBucket{noAssign: o.NoAssignment, onExpired: o.Expired}
			subscribed, lastReport = false, time.Time{}
			go func() {
				for {
					r, err := s.Recv()
					if err != nil {
						return
					}
					for _, a := range r.BucketAction {
						select {
						case actions <- a:
						case <-sctx.Done():
							return
						}
					}
				}
			}()
		}
	drain:
		for {
			select {
			case a := <-actions:
				if a.GetBucketId().GetBucket()[o.Key] != "shared" {
					continue
				}
				if a.GetAbandonAction() != nil {
					b = localBucket{noAssign: o.NoAssignment, onExpired: o.Expired}
					subscribed = false
				} else {
					b.apply(now, a.GetQuotaAssignmentAction())
				}
			default:
				break drain
			}
		}
		// Arrivals over the time since the last step: a late tick (a busy
		// machine) brings more at once, not fewer overall.
		from, el := lastStep, min(now.Sub(lastStep), time.Second)
		if !lastStep.IsZero() && el > 0 {
			acc += rate * el.Seconds()
		} else {
			from, el = now, 0
		}
		lastStep = now
		n := uint64(max(acc, 0))
		acc -= float64(n)
		sec := int(t)
		if sec >= len(p.offered) {
			continue
		}
		// The step's arrivals are spread evenly over it, as real traffic
		// is, even when the step ran late.
		var ok uint64
		for k := range n {
			if b.allow(from.Add(el * time.Duration(k+1) / time.Duration(n))) {
				ok++
			}
		}
		allowed += ok
		denied += n - ok
		p.offered[sec].Add(n)
		p.admitted[sec].Add(ok)
		// A new bucket is reported at once; then every interval.
		if !subscribed && n > 0 || subscribed && now.Sub(lastReport) >= o.ReportInterval {
			if err := send(now, lastReport.IsZero()); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("proxy %d: report: %w", p.i, err)
			}
		}
	}
}

type metricsSample struct{ cpu, reports float64 }

// readMetrics sums process_cpu_seconds_total and
// sluice_rlqs_bucket_reports_total over urls; ok is false if any could
// not be read.
func readMetrics(ctx context.Context, urls []string) (m metricsSample, ok bool) {
	ok = true
	for _, u := range urls {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			ok = false
			continue
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ok = false
			continue
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			name, val, ok := strings.Cut(line, " ")
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			if err != nil {
				continue
			}
			switch name {
			case "process_cpu_seconds_total":
				m.cpu += v
			case "sluice_rlqs_bucket_reports_total":
				m.reports += v
			}
		}
		resp.Body.Close()
	}
	return m, ok
}
