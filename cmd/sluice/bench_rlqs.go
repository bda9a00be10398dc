package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/sluicehq/sluice/loadgen"
)

// rlqsBenchFlags are `sluice bench --rlqs`'s: a fleet of simulated Envoys
// on RLQS streams.
type rlqsBenchFlags struct {
	enabled        bool
	targets        string
	metrics        string
	proxies        int
	buckets        int
	distinct       bool
	extraRequests  uint64
	demand         string
	limit          float64
	rate           float64
	reportInterval time.Duration
	step           time.Duration
	noAssignment   string
	expired        string
}

func (f *rlqsBenchFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.enabled, "rlqs", false, "simulate a fleet of Envoys on RLQS streams instead of sending ShouldRateLimit (see examples/rlqs.yaml)")
	fs.StringVar(&f.targets, "rlqs-targets", "", "RLQS: comma-separated replica `addresses`, proxies spread over them in turn (default --addr)")
	fs.StringVar(&f.metrics, "rlqs-metrics", "", "RLQS: comma-separated /metrics `URLs` of the replicas, for their CPU per bucket report")
	fs.IntVar(&f.proxies, "rlqs-proxies", 50, "RLQS: simulated proxies, one stream each")
	fs.IntVar(&f.buckets, "rlqs-buckets", 1, "RLQS: buckets each proxy reports (the first is measured, the others add load)")
	fs.Uint64Var(&f.extraRequests, "rlqs-extra-requests", 1, "RLQS: requests each extra bucket reports per report")
	fs.BoolVar(&f.distinct, "rlqs-distinct-buckets", false, "RLQS: each proxy's extra buckets are its own ({tenant: p<i>b<j>}), as a client inventing bucket ids: each a limit of its own")
	fs.StringVar(&f.demand, "rlqs-demand", loadgen.DemandSkewed, "RLQS: demand curve: steady | skewed (10:1) | bursty | churn (a fifth joins and leaves)")
	fs.Float64Var(&f.limit, "rlqs-limit", 1000, "RLQS: the shared bucket's limit per second, as configured (for the report)")
	fs.Float64Var(&f.rate, "rlqs-rate", 0, "RLQS: base demand of one proxy per second (default from the limit and the curve)")
	fs.DurationVar(&f.reportInterval, "rlqs-report-interval", time.Second, "RLQS: the proxies' reporting_interval")
	fs.DurationVar(&f.step, "rlqs-step", 10*time.Millisecond, "RLQS: simulation step (arrivals and local enforcement)")
	fs.StringVar(&f.noAssignment, "rlqs-no-assignment", "allow", "RLQS: no_assignment_behavior: allow | deny")
	fs.StringVar(&f.expired, "rlqs-expired", "reuse", "RLQS: expired_assignment_behavior: allow | deny | reuse")
}

func parseFallback(flag, v string, reuse bool) (loadgen.Fallback, error) {
	switch v {
	case "allow":
		return loadgen.FallbackAllow, nil
	case "deny":
		return loadgen.FallbackDeny, nil
	case "reuse":
		if reuse {
			return loadgen.FallbackReuse, nil
		}
	}
	return 0, fmt.Errorf("--%s %q: unknown behaviour", flag, v)
}

func runBenchRLQS(ctx context.Context, f *benchFlags, domainSet bool, stdout, stderr io.Writer) int {
	r := &f.rlqs
	o := loadgen.RLQSOptions{Targets: splitList(r.targets), MetricsURLs: splitList(r.metrics), Proxies: r.proxies,
		Buckets: r.buckets, DistinctBuckets: r.distinct, ExtraRequests: r.extraRequests, Demand: r.demand, Limit: r.limit, Rate: r.rate, ReportInterval: r.reportInterval,
		Step: r.step, Duration: f.duration, Domain: "rlqs"}
	if domainSet {
		o.Domain = f.domain
	}
	if len(o.Targets) == 0 {
		o.Targets = []string{f.addr}
	}
	var err1, err2 error
	o.NoAssignment, err1 = parseFallback("rlqs-no-assignment", r.noAssignment, false)
	o.Expired, err2 = parseFallback("rlqs-expired", r.expired, true)
	if err := errors.Join(err1, err2); err != nil || r.proxies < 1 || r.buckets < 1 {
		if err == nil {
			err = errors.New("--rlqs-proxies and --rlqs-buckets must be at least 1")
		}
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return 2
	}
	if !f.jsonOut {
		fmt.Fprintf(stdout, "rlqs: %d proxies (%s) on %s, limit %g/s, report every %v, %v\n",
			o.Proxies, o.Demand, strings.Join(o.Targets, ","), o.Limit, o.ReportInterval, o.Duration)
		fmt.Fprintln(stdout, "   t  proxies  offered/s  admitted/s  admitted/L  mean|share-fair|  max|share-fair|  server cores  bucket reports/s  µs/report")
		o.Every = func(s loadgen.Second) {
			fmt.Fprintf(stdout, "%4d  %7d  %9.0f  %10.0f  %10.3f  %16.1f%%  %15.1f%%  %12.3f  %16.0f  %9.2f\n", s.T, s.Active, s.Offered, s.Admitted,
				s.Admitted/s.Limit, 100*s.MeanDev, 100*s.MaxDev, s.ServerCores, s.Reports, s.CPUPerReport)
		}
	}
	res, err := loadgen.RunRLQS(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "sluice bench: %v\n", err)
		return 1
	}
	if f.jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(stderr, "sluice bench: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stdout, "after %ds: admitted/L within ±5%% in %.0f%% of the seconds with demand above L, at least 0.9 in %.0f%% (range %.3f–%.3f); "+
		"most admitted in a second %.3f × L (%.3f settled); |share−fair|/fair mean p50 %.1f%%, p90 %.1f%%, max p90 %.1f%%",
		res.Settle, 100*res.Within5, 100*res.Above90, res.MinRatio, res.MaxRatio, res.MaxSecond, res.MaxSettled, 100*res.DevP50, 100*res.DevP90, 100*res.MaxDevP90)
	if res.CPUPerReport > 0 {
		fmt.Fprintf(stdout, "; server %.3f cores, %.2f µs per bucket report", res.ServerCores, res.CPUPerReport)
	}
	fmt.Fprintln(stdout)
	return 0
}
