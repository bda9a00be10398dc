package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

type settings struct {
	sluice, redisServer, egMapper  string
	csvPath, secondsPath, mdPath   string
	duration, sample               time.Duration
	replicas                       int
	pushEvery                      time.Duration
	renamed                        int
	restartEvery, redisDown, grace time.Duration
	overdrive, detailedRate        float64
	detailedValues                 int
	churnRate                      float64
	rlqsProxies, freshBuckets      int
	joinEvery, streamLife          time.Duration
	heap, keepLogs                 bool
}

func flags(fs *flag.FlagSet) *settings {
	s := &settings{}
	fs.StringVar(&s.sluice, "sluice", "bin/sluice", "the sluice binary")
	fs.StringVar(&s.redisServer, "redis-server", "redis-server", "the redis-server binary")
	fs.StringVar(&s.egMapper, "eg-mapper", "observe/testdata/envoy-gateway-statsd.yaml", "Envoy Gateway's statsd mapping (PROMETHEUS_MAPPER_YAML); empty: USE_PROMETHEUS=false")
	fs.StringVar(&s.csvPath, "csv", "soak-churn.csv", "CSV of the samples, a row per replica and sample")
	fs.StringVar(&s.secondsPath, "seconds-csv", "soak-churn-seconds.csv", "CSV of the seconds: admitted against the limits, errors")
	fs.StringVar(&s.mdPath, "md", "soak-churn.md", "markdown report")
	fs.DurationVar(&s.duration, "duration", 2*time.Minute, "how long to soak (30m for the report)")
	fs.DurationVar(&s.sample, "sample", 10*time.Second, "how often each replica is read")
	fs.IntVar(&s.replicas, "replicas", 3, "sluice serve processes on the one Redis")
	fs.DurationVar(&s.pushEvery, "push-every", time.Second, "an xDS push of renamed rules this often")
	fs.IntVar(&s.renamed, "renamed", 100, "renamed rules in each push (beside the fixed ones)")
	fs.DurationVar(&s.restartEvery, "restart-every", 2*time.Minute, "Redis is killed this often (the first time half a period in)")
	fs.DurationVar(&s.redisDown, "redis-down", 2*time.Second, "how long Redis stays killed")
	fs.DurationVar(&s.grace, "grace", 3*time.Second, "after Redis answers again, still counted as down (breakers close, RLQS shares settle)")
	fs.Float64Var(&s.overdrive, "overdrive", 2, "RLS requests on each limited rule, as a multiple of its limit")
	fs.Float64Var(&s.detailedRate, "detailed-rate", 50, "RLS requests per second on the detailed_metric rule")
	fs.IntVar(&s.detailedValues, "detailed-values", 500, "distinct values of those requests")
	fs.Float64Var(&s.churnRate, "churn-rate", 20, "RLS requests per second on the newest renamed rules")
	fs.IntVar(&s.rlqsProxies, "rlqs-proxies", 10, "simulated Envoys of the steady RLQS fleet")
	fs.DurationVar(&s.joinEvery, "join-every", time.Second, "a new RLQS stream with fresh buckets this often")
	fs.DurationVar(&s.streamLife, "stream-life", 5*time.Second, "how long each of those streams lives")
	fs.IntVar(&s.freshBuckets, "fresh-buckets", 10, "fresh buckets of each such stream")
	fs.BoolVar(&s.heap, "heap", true, "read each replica's heap profile (DEBUG_PORT) to weigh the status page's memory")
	fs.BoolVar(&s.keepLogs, "keep-logs", false, "keep the replicas' logs (the directory is printed)")
	return s
}

// check refuses settings the soak cannot run with.
func (s *settings) check() error {
	positive := map[string]time.Duration{"-duration": s.duration, "-sample": s.sample, "-push-every": s.pushEvery,
		"-restart-every": s.restartEvery, "-join-every": s.joinEvery, "-stream-life": s.streamLife}
	for name, d := range positive {
		if d <= 0 {
			return fmt.Errorf("%s must be positive", name)
		}
	}
	if s.replicas < 1 || s.renamed < 0 || s.detailedValues < 1 || s.rlqsProxies < 1 || s.freshBuckets < 0 {
		return errors.New("-replicas, -detailed-values and -rlqs-proxies must be at least 1, -renamed and -fresh-buckets at least 0")
	}
	if s.overdrive < 0 || s.detailedRate < 0 || s.churnRate < 0 {
		return errors.New("-overdrive, -detailed-rate and -churn-rate must not be negative")
	}
	return nil
}

func main() {
	s := flags(flag.CommandLine)
	flag.Parse()
	if err := s.check(); err != nil {
		fmt.Fprintln(os.Stderr, "soak-churn:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ok, err := run(ctx, *s, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak-churn:", err)
		os.Exit(2)
	}
	if !ok {
		os.Exit(1)
	}
}
