package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// localAnswersMetric counts the requests the Redis store's local
// over-limit cache answered without Redis (cmd/sluice's
// registerRedisMetrics).
const localAnswersMetric = "sluice_redis_local_answers_total"

var metricsClient = &http.Client{Timeout: 5 * time.Second}

// scrapeCounter reads the counter name from the /metrics served at
// httpAddr.
func scrapeCounter(ctx context.Context, httpAddr, name string) (float64, error) {
	m, err := harness.Scrape(ctx, metricsClient, "http://"+httpAddr+"/metrics", name)
	if err != nil {
		return 0, err
	}
	return counter(m, name)
}

// counter is the value of the counter name in m, an error if m has no
// sample of it.
func counter(m *harness.Metrics, name string) (float64, error) {
	v, ok := m.Sum[name]
	if !ok {
		return 0, fmt.Errorf("/metrics has no %s", name)
	}
	return v, nil
}
