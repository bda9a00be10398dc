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
# HELP go_memstats_mallocs_total Total number of heap objects allocated, both live and gc-ed. Semantically a counter version for go_memstats_alloc_bytes_total.
# TYPE go_memstats_mallocs_total counter
go_memstats_mallocs_total 1.234567e+06
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

// TestServerScrape reads a Sluice's completed calls and allocations from
// its /metrics, and its local answers only if it counts them.
func TestServerScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(metricsSample))
	}))
	defer srv.Close()
	s := &server{proc: &harness.Sluice{Name: "sluice", HTTP: strings.TrimPrefix(srv.URL, "http://")}, counted: true}
	if got, err := s.scrape(context.Background()); err != nil || got != (served{handled: 12930, mallocs: 1234567}) {
		t.Errorf("scrape = %+v, %v; want 12930 calls, 1234567 allocations, no local answers", got, err)
	}
	s.localAnswers = true
	if got, err := s.scrape(context.Background()); err != nil || got != (served{handled: 12930, mallocs: 1234567, local: 12902}) {
		t.Errorf("scrape with local answers = %+v, %v; want 12930, 1234567, 12902", got, err)
	}
}

// TestAllocsPerCall: the allocations between two scrapes over the calls
// completed between them, less one scrape's own (the third scrape's
// growth), and never below 0.
func TestAllocsPerCall(t *testing.T) {
	for _, tc := range []struct {
		name       string
		c0, c1, c2 served
		want       float64
	}{
		{"scrape subtracted", served{handled: 100, mallocs: 10_000}, served{handled: 1100, mallocs: 62_000}, served{handled: 1100, mallocs: 64_000}, 50},
		{"no calls", served{handled: 100, mallocs: 10_000}, served{handled: 100, mallocs: 12_000}, served{handled: 100, mallocs: 14_000}, 0},
		{"scrape larger than the growth", served{handled: 0, mallocs: 0}, served{handled: 10, mallocs: 1000}, served{handled: 10, mallocs: 3000}, 0},
	} {
		if got := allocsPerCall(tc.c0, tc.c1, tc.c2); got != tc.want {
			t.Errorf("%s: allocsPerCall = %v, want %v", tc.name, got, tc.want)
		}
	}
}
