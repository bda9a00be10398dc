package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// metricsSample is part of what `sluice serve --store redis` served on
// /metrics after a run of the hot workload.
const metricsSample = `# HELP grpc_server_handled_total Total number of RPCs completed on the server, regardless of success or failure.
# TYPE grpc_server_handled_total counter
grpc_server_handled_total{grpc_code="Canceled",grpc_method="ShouldRateLimit",grpc_service="envoy.service.ratelimit.v3.RateLimitService",grpc_type="unary"} 1
grpc_server_handled_total{grpc_code="OK",grpc_method="ShouldRateLimit",grpc_service="envoy.service.ratelimit.v3.RateLimitService",grpc_type="unary"} 12929
# HELP sluice_redis_local_answers_total Requests the local over-limit cache answered without Redis.
# TYPE sluice_redis_local_answers_total counter
sluice_redis_local_answers_total 12902
# HELP sluice_redis_local_cache_keys Keys in the local over-limit cache.
# TYPE sluice_redis_local_cache_keys gauge
sluice_redis_local_cache_keys 1
`

// TestCounterValues: the local answers and the completed calls (summed
// over their codes) are read from Sluice's text, and a counter it lacks
// is an error naming it.
func TestCounterValues(t *testing.T) {
	m, err := harness.ParseMetrics(strings.NewReader(metricsSample), localAnswersMetric, handledMetric, "absent_total")
	if err != nil {
		t.Fatal(err)
	}
	got, err := counterValues(m, localAnswersMetric, handledMetric)
	if want := []float64{12902, 12930}; err != nil || !slices.Equal(got, want) {
		t.Errorf("counterValues = %v, %v; want %v", got, err, want)
	}
	if got, err := counterValues(m, localAnswersMetric, "absent_total"); err == nil || !strings.Contains(err.Error(), "absent_total") {
		t.Errorf("counterValues of a missing counter = %v, %v; want an error naming it", got, err)
	}
}

// TestScrapeCounters reads the counters over HTTP from /metrics, and
// fails on an answer that is not 200.
func TestScrapeCounters(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(metricsSample))
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	got, err := scrapeCounters(context.Background(), addr, handledMetric, localAnswersMetric)
	if want := []float64{12930, 12902}; err != nil || !slices.Equal(got, want) {
		t.Errorf("scrapeCounters = %v, %v; want %v", got, err, want)
	}
	if share := ratio(got[1], got[0]); share < 0.99 || share > 1 {
		t.Errorf("local share = %v, want 12902/12930", share)
	}
	srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	if got, err := scrapeCounters(context.Background(), addr, localAnswersMetric); err == nil {
		t.Errorf("scrapeCounters of a 503 = %v, want an error", got)
	}
}
