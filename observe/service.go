package observe

import (
	"net/http"
	"runtime"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/config"
	"github.com/sluicehq/sluice/store/memory"
)

// LatencyBuckets are the request latency histogram's bounds in seconds,
// fine below a millisecond where a rate limiter's answers fall (Envoy's
// filter gives up after 20 ms by default).
var LatencyBuckets = []float64{
	0.000025, 0.00005, 0.0001, 0.00025, 0.0005,
	0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1,
}

// Build identifies the running binary.
type Build struct {
	Version, Commit string
}

// RegisterProcess registers Go runtime and process collectors and
// sluice_build_info on reg.
func RegisterProcess(reg prometheus.Registerer, b Build) error {
	info := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "sluice", Name: "build_info",
		Help:        "Always 1; the labels name the running build.",
		ConstLabels: prometheus.Labels{"version": b.Version, "commit": b.Commit, "goversion": runtime.Version()}})
	info.Set(1)
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), info} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// InstrumentHTTP counts h's requests by method and status code and times
// them with LatencyBuckets (sluice_http_requests_total,
// sluice_http_request_duration_seconds).
func InstrumentHTTP(reg prometheus.Registerer, h http.Handler) (http.Handler, error) {
	total := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "sluice", Subsystem: "http", Name: "requests_total",
		Help: "HTTP requests by method and status code."}, []string{"method", "code"})
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "sluice", Subsystem: "http", Name: "request_duration_seconds",
		Help: "HTTP request latency.", Buckets: LatencyBuckets}, []string{"method", "code"})
	for _, c := range []prometheus.Collector{total, dur} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return promhttp.InstrumentHandlerDuration(dur, promhttp.InstrumentHandlerCounter(total, h)), nil
}

// Handler serves reg's metrics in the Prometheus exposition formats.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// ReloadStatuser reports a config's reload history; *config.Reloader is one.
type ReloadStatuser interface {
	Status() config.ReloadStatus
}

// RegisterConfig registers the config reload metrics, read from src at
// each scrape.
func RegisterConfig(reg prometheus.Registerer, src ReloadStatuser) error {
	return reg.Register(configCollector{src})
}

var (
	reloadsDesc = prometheus.NewDesc("sluice_config_reloads_total",
		"Config load attempts by result (success, failure), the first load included.", []string{"result"}, nil)
	lastOKDesc = prometheus.NewDesc("sluice_config_last_reload_successful",
		"1 if the last config load attempt succeeded, else 0 (the previous config stays in force).", nil, nil)
	lastSuccessDesc = prometheus.NewDesc("sluice_config_last_reload_success_timestamp_seconds",
		"When a config last loaded successfully, in Unix seconds; 0 before the first.", nil, nil)
	configInfoDesc = prometheus.NewDesc("sluice_config_info",
		"Always 1; hash is the SHA-256 of the config in force (absent before the first load).", []string{"hash"}, nil)
)

type configCollector struct{ src ReloadStatuser }

func (c configCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{reloadsDesc, lastOKDesc, lastSuccessDesc, configInfoDesc} {
		ch <- d
	}
}

func (c configCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.src.Status()
	collectLoads(ch, reloadsDesc, lastOKDesc, s)
	var ts float64
	if !s.LastSuccess.IsZero() {
		ts = float64(s.LastSuccess.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(lastSuccessDesc, prometheus.GaugeValue, ts)
	if s.Hash != "" {
		ch <- prometheus.MustNewConstMetric(configInfoDesc, prometheus.GaugeValue, 1, s.Hash)
	}
}

// collectLoads sends a source's load attempts by result (attempts) and
// whether its last one succeeded (lastOK), from s.
func collectLoads(ch chan<- prometheus.Metric, attempts, lastOK *prometheus.Desc, s config.ReloadStatus) {
	ch <- prometheus.MustNewConstMetric(attempts, prometheus.CounterValue, float64(s.Successes), "success")
	ch <- prometheus.MustNewConstMetric(attempts, prometheus.CounterValue, float64(s.Failures), "failure")
	ok := 0.0
	if s.LastOK {
		ok = 1
	}
	ch <- prometheus.MustNewConstMetric(lastOK, prometheus.GaugeValue, ok)
}

// OverlayStatuser reports an overlay's load history and the table it
// applies to; *config.Reloader is one.
type OverlayStatuser interface {
	OverlayStatus() config.OverlayStatus
	Current() *config.Table
}

// RegisterOverlay registers the metrics of the overlay on pushed limits
// (--xds-overlay), read from src at each scrape.
func RegisterOverlay(reg prometheus.Registerer, src OverlayStatuser) error {
	return reg.Register(overlayCollector{src})
}

var (
	overlayReloadsDesc = prometheus.NewDesc("sluice_xds_overlay_reloads_total",
		"Overlay load attempts by result (success, failure), the first load included.", []string{"result"}, nil)
	overlayLastOKDesc = prometheus.NewDesc("sluice_xds_overlay_last_reload_successful",
		"1 if the last overlay load attempt succeeded, else 0 (the previous overlay stays in force).", nil, nil)
	overlayUnmatchedDesc = prometheus.NewDesc("sluice_xds_overlay_unmatched",
		"Overlay entries that change no rule of the config in force (they match none, or cannot apply to those they match).", nil, nil)
	overlayProblemsDesc = prometheus.NewDesc("sluice_xds_overlay_problems",
		"Overlay entries that match a rule of the config in force but cannot apply to it (the rule keeps its pushed limit).", nil, nil)
)

type overlayCollector struct{ src OverlayStatuser }

func (c overlayCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{overlayReloadsDesc, overlayLastOKDesc, overlayUnmatchedDesc, overlayProblemsDesc} {
		ch <- d
	}
}

func (c overlayCollector) Collect(ch chan<- prometheus.Metric) {
	collectLoads(ch, overlayReloadsDesc, overlayLastOKDesc, c.src.OverlayStatus().ReloadStatus)
	var rep config.OverlayReport
	if t := c.src.Current(); t != nil {
		rep = t.Overlay()
	}
	ch <- prometheus.MustNewConstMetric(overlayUnmatchedDesc, prometheus.GaugeValue, float64(len(rep.Unmatched)))
	ch <- prometheus.MustNewConstMetric(overlayProblemsDesc, prometheus.GaugeValue, float64(len(rep.Problems)))
}

// MemoryStatser reports a memory store's counts; *memory.Store is one.
type MemoryStatser interface {
	Stats() memory.Stats
}

// RegisterMemory registers the memory store's metrics, read from st at
// each scrape.
func RegisterMemory(reg prometheus.Registerer, st MemoryStatser) error {
	return reg.Register(memoryCollector{st})
}

var (
	memKeysDesc      = prometheus.NewDesc("sluice_memory_keys", "Counters the memory store holds.", nil, nil)
	memInsertsDesc   = prometheus.NewDesc("sluice_memory_inserts_total", "Counters the memory store created.", nil, nil)
	memSweptDesc     = prometheus.NewDesc("sluice_memory_swept_total", "Idle counters the memory store dropped (no decision changes).", nil, nil)
	memEvictionsDesc = prometheus.NewDesc("sluice_memory_evictions_total", "Live counters dropped at --memory-max-keys (their keys start afresh).", nil, nil)
)

type memoryCollector struct{ st MemoryStatser }

func (c memoryCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{memKeysDesc, memInsertsDesc, memSweptDesc, memEvictionsDesc} {
		ch <- d
	}
}

func (c memoryCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.st.Stats()
	ch <- prometheus.MustNewConstMetric(memKeysDesc, prometheus.GaugeValue, float64(s.Keys))
	ch <- prometheus.MustNewConstMetric(memInsertsDesc, prometheus.CounterValue, float64(s.Inserts))
	ch <- prometheus.MustNewConstMetric(memSweptDesc, prometheus.CounterValue, float64(s.Swept))
	ch <- prometheus.MustNewConstMetric(memEvictionsDesc, prometheus.CounterValue, float64(s.Evictions))
}
