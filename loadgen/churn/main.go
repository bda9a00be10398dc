// Command churn is the churn soak behind `make soak-churn`: a few Sluice
// replicas on one Redis, configured over xDS as Envoy Gateway configures
// them, under a config that changes every second, RLQS streams that come
// and go with buckets no one used before, Redis restarts, and steady RLS
// traffic on rules that every config keeps. It measures whether anything
// grows with the churn (memory, goroutines, /metrics series, the status
// page's heap) and whether limits hold, and says PASS or FAIL.
//
// What runs (see fleet.go, xds.go, rls.go, rlqs.go):
//
//   - --replicas `sluice serve` processes with the environment of Envoy
//     Gateway's default rate-limit Deployment (CONFIG_TYPE=GRPC_XDS_SOTW,
//     REDIS_URL, USE_PROMETHEUS with its statsd mapping, ...; TLS off),
//     on one redis-server, RLQS on (the default);
//   - a go-control-plane ADS server that pushes a new generation every
//     --push-every: the fixed rules, and --renamed rules whose keys
//     change with every generation, as routes renamed in a gateway;
//   - steady RLS traffic sent to each replica in turn: the two limited
//     rules at --overdrive × their limits (100/s and 20/s), a
//     detailed_metric rule over --detailed-values values, and requests on
//     the newest renamed rules;
//   - a steady RLQS fleet (loadgen.RunRLQS: --rlqs-proxies simulated
//     Envoys enforcing their shares of 100/s) and, every --join-every, a
//     new RLQS stream with --fresh-buckets buckets no one used before that
//     reports for --stream-life and leaves;
//   - Redis killed every --restart-every (the first half a period in) and
//     started again --redis-down later.
//
// Every --sample it reads each replica's RSS, descriptors, /metrics (go
// heap, goroutines, series, CPU, RLQS), the reference's metrics endpoint,
// the status page's traffic JSON and its heap profile (the live heap of
// the status page, the metrics, RLQS and config code). At the end it fits
// a line to each figure over the second half of the run (the first is
// warm-up) and judges; see report.go for the thresholds and why. It
// writes a CSV of the samples, a CSV of the seconds (RLS and RLQS
// admitted against the limits, errors) and a markdown report with a row
// per minute.
//
//	go run ./loadgen/churn -sluice bin/sluice -duration 30m
package main

import (
	"context"
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
	fs.DurationVar(&s.sample, "sample", 5*time.Second, "how often each replica is read")
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

func main() {
	s := flags(flag.CommandLine)
	flag.Parse()
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
