package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/loadgen/harness"
)

const (
	// localAnswersMetric counts the requests the Redis store's local
	// over-limit cache answered without Redis (cmd/sluice's
	// registerRedisMetrics).
	localAnswersMetric = "sluice_redis_local_answers_total"
	// handledMetric counts the gRPC calls the server completed, by
	// method and code (observe's gRPC metrics).
	handledMetric = "grpc_server_handled_total"
	// mallocsMetric counts the heap objects the process allocated (Go's
	// collector, observe.RegisterProcess).
	mallocsMetric = "go_memstats_mallocs_total"
)

var metricsClient = &http.Client{Timeout: 5 * time.Second}

// scrapeCounters reads the counters names, each summed over its label
// sets, from the /metrics served at httpAddr.
func scrapeCounters(ctx context.Context, httpAddr string, names ...string) ([]float64, error) {
	m, err := harness.Scrape(ctx, metricsClient, "http://"+httpAddr+"/metrics", names...)
	if err != nil {
		return nil, err
	}
	return counterValues(m, names...)
}

// counterValues are the values of the counters names in m, an error if
// m has no sample of one.
func counterValues(m *harness.Metrics, names ...string) ([]float64, error) {
	vs := make([]float64, len(names))
	for i, n := range names {
		v, ok := m.Sum[n]
		if !ok {
			return nil, fmt.Errorf("/metrics has no %s", n)
		}
		vs[i] = v
	}
	return vs, nil
}
