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
// heap, goroutines, series, CPU, RLQS, and the gauges of what the
// per-rule counters and the status page's samples hold), the reference's
// metrics endpoint,
// the status page's traffic JSON and its heap profile (the live heap of
// the status page, the metrics, RLQS and config code). At the end it fits
// a line to each figure over the second half of the run (the first is
// warm-up) and judges (report.go and judge.go give the thresholds and
// why; docs/RELIABILITY.md, "Churn soak", the whole). It
// writes a CSV of the samples, a CSV of the seconds (RLS and RLQS
// admitted against the limits, errors) and a markdown report with a row
// per minute.
//
//	go run ./loadgen/churn -sluice bin/sluice -duration 30m
package main
