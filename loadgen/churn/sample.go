package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// sample is one reading of one replica. A figure that could not be read
// is NaN.
type sample struct {
	At      time.Time
	Replica int
	// RedisDown: the interval since the previous sample met an outage.
	RedisDown bool

	// Failed names what could not be read.
	Failed []string

	RSSMiB, FDs         float64 // /proc
	HeapMiB, Goroutines float64 // go_memstats_heap_inuse_bytes, go_goroutines
	// Series and MetricsKiB are the samples and size of /metrics;
	// RefSeries the samples of the reference's Prometheus endpoint.
	Series, MetricsKiB, RefSeries float64
	// ScrapeSec is how long /metrics took to read (NaN: not within the
	// client's timeout).
	ScrapeSec        float64
	CPU              float64 // process_cpu_seconds_total
	Cores            float64 // CPU since the previous sample (analyse sets it)
	Streams, Buckets float64 // sluice_rlqs_streams, sluice_rlqs_buckets
	FleetErrors      float64 // sluice_rlqs_fleet_errors_total
	// LabelSets are the per-rule counters' label sets
	// (sluice_rule_label_sets); TrafficRules and TrafficMiB what the
	// status page's traffic samples hold (sluice_ui_traffic_rules,
	// sluice_ui_traffic_bytes).
	LabelSets, TrafficRules, TrafficMiB float64
	// Heap is the live heap by heapGroups, in MiB, from the heap profile.
	Heap map[string]float64
	// TrafficKiB is the size of the status page's ui/api/traffic.
	TrafficKiB float64
}

// sampler reads the replicas.
type sampler struct {
	procs  []*harness.Sluice
	client *http.Client
	heap   bool // read heap profiles
	down   *harness.Outages
}

const mib = 1 << 20

// every reads every replica each period until ctx ends, and returns the
// samples; a sample under way when ctx ends is dropped.
func (sp *sampler) every(ctx context.Context, period time.Duration) []sample {
	var out []sample
	t := time.NewTicker(period)
	defer t.Stop()
	prev := time.Now()
	for {
		select {
		case <-ctx.Done():
			return out
		case <-t.C:
		}
		now := time.Now()
		down := sp.down.Overlaps(prev, now)
		prev = now
		batch := make([]sample, len(sp.procs))
		var wg sync.WaitGroup
		for i := range sp.procs {
			wg.Go(func() { batch[i] = sp.read(ctx, i, now, down) })
		}
		wg.Wait()
		if ctx.Err() != nil {
			return out // reads cut short by the end of the soak
		}
		out = append(out, batch...)
	}
}

// read reads replica i. What it could not read (within the client's
// timeout) stays NaN and is named in Failed.
func (sp *sampler) read(ctx context.Context, i int, at time.Time, down bool) sample {
	p := sp.procs[i]
	nan := math.NaN()
	s := sample{At: at, Replica: i, RedisDown: down, HeapMiB: nan, Goroutines: nan, Series: nan, MetricsKiB: nan, ScrapeSec: nan,
		RefSeries: nan, CPU: nan, Streams: nan, Buckets: nan, FleetErrors: nan, TrafficKiB: nan, LabelSets: nan, TrafficRules: nan, TrafficMiB: nan}
	rss, fds := harness.ProcStats(p.Pid())
	s.RSSMiB, s.FDs = rss/1024, float64(fds)
	t0 := time.Now()
	if m, err := harness.Scrape(ctx, sp.client, "http://"+p.HTTP+"/metrics", "go_memstats_heap_inuse_bytes", "go_goroutines",
		"process_cpu_seconds_total", "sluice_rlqs_fleet_errors_total", "sluice_rlqs_streams", "sluice_rlqs_buckets",
		"sluice_rule_label_sets", "sluice_ui_traffic_rules", "sluice_ui_traffic_bytes"); err != nil {
		s.Failed = append(s.Failed, "/metrics")
	} else {
		s.ScrapeSec = time.Since(t0).Seconds()
		s.Series, s.MetricsKiB = float64(m.Series), float64(m.Bytes)/1024
		s.HeapMiB, s.Goroutines = m.Sum["go_memstats_heap_inuse_bytes"]/mib, m.Sum["go_goroutines"]
		s.CPU, s.FleetErrors = m.Sum["process_cpu_seconds_total"], m.Sum["sluice_rlqs_fleet_errors_total"]
		s.Streams, s.Buckets = m.Sum["sluice_rlqs_streams"], m.Sum["sluice_rlqs_buckets"]
		s.LabelSets, s.TrafficRules, s.TrafficMiB = gauge(m, "sluice_rule_label_sets"), gauge(m, "sluice_ui_traffic_rules"), gauge(m, "sluice_ui_traffic_bytes")/mib
	}
	if p.RefMetrics != "" {
		if m, err := harness.Scrape(ctx, sp.client, "http://"+p.RefMetrics+"/metrics"); err != nil {
			s.Failed = append(s.Failed, "reference metrics")
		} else {
			s.RefSeries = float64(m.Series)
		}
	}
	if n, err := sp.size(ctx, "http://"+p.HTTP+"/ui/api/traffic"); err != nil {
		s.Failed = append(s.Failed, "ui/api/traffic")
	} else {
		s.TrafficKiB = float64(n) / 1024
	}
	if sp.heap {
		if s.Heap = sp.heapOf(ctx, p.Debug); s.Heap == nil {
			s.Failed = append(s.Failed, "heap profile")
		}
	}
	return s
}

// gauge is the sum of name's samples in m; NaN if m has none (a binary
// from before the gauge).
func gauge(m *harness.Metrics, name string) float64 {
	if v, ok := m.Sum[name]; ok {
		return v
	}
	return math.NaN()
}

// size is the length of a GET's answer.
func (sp *sampler) size(ctx context.Context, url string) (int64, error) {
	res, err := sp.get(ctx, url)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	return io.Copy(io.Discard, res.Body)
}

// heapOf reads the heap profile of the debug endpoints at addr, in MiB
// by heapGroups; nil if it could not be read.
func (sp *sampler) heapOf(ctx context.Context, addr string) map[string]float64 {
	res, err := sp.get(ctx, "http://"+addr+"/debug/pprof/heap?debug=1")
	if err != nil {
		return nil
	}
	defer res.Body.Close()
	by, err := heapBy(res.Body, heapGroups)
	if err != nil {
		return nil
	}
	for k, v := range by {
		by[k] = v / mib
	}
	return by
}

func (sp *sampler) get(ctx context.Context, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	res, err := sp.client.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		return nil, fmt.Errorf("%s: %s", url, res.Status)
	}
	return res, nil
}
