package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/sluicehq/sluice/observe"
	"github.com/sluicehq/sluice/quota"
	"github.com/sluicehq/sluice/store/redis"
	"github.com/sluicehq/sluice/store/split"
)

// Envoy's Rate Limit Quota Service on the gRPC port: the quota service,
// its metrics, and with --store redis the demand shared across replicas.
func init() {
	registerExtension("rlqs", func(fs *flag.FlagSet) extensionSetup {
		f := &rlqsFlags{}
		f.register(fs)
		return f.setup
	})
}

type rlqsFlags struct {
	enabled    bool
	interval   time.Duration
	ttl        time.Duration
	threshold  float64
	reserve    float64
	idle       time.Duration
	maxBuckets int // per stream
	maxStreams int
	maxAll     int // buckets of all streams
	maxClaims  int
	window     int
	overcommit float64
	replica    string
	fwStrategy string
}

func (f *rlqsFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.enabled, "rlqs", true, "serve Envoy's Rate Limit Quota Service (envoy.service.rate_limit_quota.v3) on the gRPC port")
	fs.DurationVar(&f.interval, "rlqs-interval", quota.DefaultInterval, "RLQS: how often shares are recomputed (and demand shared through Redis)")
	fs.DurationVar(&f.ttl, "rlqs-ttl", quota.DefaultTTL, "RLQS: assignment_time_to_live of every assignment (at least 3 intervals); re-sent before it ends")
	fs.Float64Var(&f.threshold, "rlqs-threshold", quota.DefaultThreshold, "RLQS: push a share again only when it moves by more than this fraction")
	fs.Float64Var(&f.reserve, "rlqs-reserve", quota.DefaultReserve, "RLQS: fraction of each limit kept back for proxies that just appeared (0: none)")
	fs.DurationVar(&f.idle, "rlqs-idle-abandon", quota.DefaultIdleAbandon, "RLQS: abandon a bucket with no traffic reported for this long")
	fs.IntVar(&f.maxBuckets, "rlqs-max-buckets-per-stream", quota.DefaultMaxBucketsPerStream, "RLQS: most buckets on one stream; more end it with RESOURCE_EXHAUSTED")
	fs.IntVar(&f.maxStreams, "rlqs-max-streams", quota.DefaultMaxStreams, "RLQS: most open streams on this replica; more end with RESOURCE_EXHAUSTED")
	fs.IntVar(&f.maxAll, "rlqs-max-buckets", quota.DefaultMaxBuckets, "RLQS: most buckets of all streams on this replica; a report past it ends its stream with RESOURCE_EXHAUSTED")
	fs.IntVar(&f.maxClaims, "rlqs-max-claims", quota.DefaultMaxClaims, "RLQS with --store redis: most limits claimed through Redis per interval (script calls); past it, the limits of the streams with the fewest buckets first, the others in turn")
	fs.IntVar(&f.window, "rlqs-demand-window", quota.DefaultDemandWindow, "RLQS: a limit is divided by what each proxy is expected to use of a share, from the lowest, mean and peak demand of its last this many reports (1: the last report only; with --rlqs-overcommit 1, the division before bursts were followed)")
	fs.Float64Var(&f.overcommit, "rlqs-overcommit", quota.DefaultOvercommit, "RLQS: the shares of a limit may sum up to this many times what is divided, so that what some proxies leave unused between their bursts goes to others; if all use their shares at once, up to this many times the limit is admitted a second until their reports show it (1: never above the limit; see docs/RLQS.md)")
	fs.StringVar(&f.fwStrategy, "rlqs-fixed-window-strategy", "requests_per_time_unit", "RLQS: strategy assigned for fixed-window rules: requests_per_time_unit | token_bucket (Envoy's filter does not enforce requests_per_time_unit yet)")
	fs.StringVar(&f.replica, "rlqs-replica-id", "", "RLQS with --store redis: this replica's `name` in the shared demand (default host name and process id)")
}

func (f *rlqsFlags) options() (quota.Options, error) {
	switch {
	case f.interval <= 0:
		return quota.Options{}, errors.New("--rlqs-interval must be positive")
	case f.ttl < 3*f.interval:
		return quota.Options{}, fmt.Errorf("--rlqs-ttl %v must be at least 3 × --rlqs-interval (%v)", f.ttl, 3*f.interval)
	case !(f.threshold >= 0 && f.threshold < 1):
		return quota.Options{}, errors.New("--rlqs-threshold must be in [0, 1)")
	case !(f.reserve >= 0 && f.reserve <= 0.5):
		return quota.Options{}, errors.New("--rlqs-reserve must be in [0, 0.5]")
	case f.idle <= 0:
		return quota.Options{}, errors.New("--rlqs-idle-abandon must be positive")
	case f.window < 1 || f.window > quota.MaxDemandWindow:
		return quota.Options{}, fmt.Errorf("--rlqs-demand-window must be in [1, %d]", quota.MaxDemandWindow)
	case !(f.overcommit >= 1 && f.overcommit <= 100):
		return quota.Options{}, errors.New("--rlqs-overcommit must be in [1, 100]")
	case f.maxBuckets < 1 || f.maxStreams < 1 || f.maxAll < 1 || f.maxClaims < 1:
		return quota.Options{}, errors.New("--rlqs-max-buckets-per-stream, --rlqs-max-streams, --rlqs-max-buckets and --rlqs-max-claims must be at least 1")
	}
	switch f.fwStrategy {
	case "requests_per_time_unit", "token_bucket":
	default:
		return quota.Options{}, fmt.Errorf("--rlqs-fixed-window-strategy %q: want requests_per_time_unit or token_bucket", f.fwStrategy)
	}
	o := quota.Options{FixedWindowAsTokenBucket: f.fwStrategy == "token_bucket", Interval: f.interval, TTL: f.ttl, Threshold: f.threshold, Reserve: f.reserve,
		IdleAbandon: f.idle, MaxBucketsPerStream: f.maxBuckets, MaxStreams: f.maxStreams, MaxBuckets: f.maxAll, MaxClaims: f.maxClaims,
		DemandWindow: f.window, Overcommit: f.overcommit}
	// quota.Options reads 0 as "the default"; the flags mean none.
	if f.threshold == 0 {
		o.Threshold = -1
	}
	if f.reserve == 0 {
		o.Reserve = -1
	}
	return o, nil
}

func (f *rlqsFlags) setup(_ context.Context, x *serveContext) error {
	if !f.enabled {
		return nil
	}
	o, err := f.options()
	if err != nil {
		return err
	}
	o.Logger = x.Logger
	fleet := "none (limits are divided per replica: only the redis store shares them)"
	st, ok := x.Store.(*redis.Store)
	if sp, two := x.Store.(*split.Store); two {
		// With a per-second Redis, replicas meet in the main one.
		m, _ := sp.Stores()
		st, ok = m.(*redis.Store), true
	}
	if ok {
		replica := f.replica
		if replica == "" {
			host, _ := os.Hostname()
			replica = fmt.Sprintf("%s-%d", host, os.Getpid())
		}
		o.Fleet = st.Demand(replica, 3*f.interval)
		fleet = "redis, replica " + replica
	}
	q := quota.New(x.Config, o)
	if err := observe.RegisterQuota(x.Registry, q); err != nil {
		return err
	}
	x.Quota = q
	x.Run = append(x.Run, q.Run)
	x.Logger.Info("rlqs", "interval", o.Interval, "ttl", o.TTL, "fleet", fleet)
	return nil
}
