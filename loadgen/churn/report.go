package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// figure is a quantity read from every replica at every sample.
type figure struct {
	name, unit, format string
	get                func(sample) float64 // NaN: not read
	// A judged figure must not grow with the churn, over the second half
	// of the run (the first is warm-up): with maxSlope > 0, its fitted
	// slope per minute must stay under maxSlope; with rel or abs > 0, the
	// fitted line may move over the second half by at most max(rel ×
	// median, abs). The abs floor covers counts that move by a few
	// (goroutines of requests in flight) and the heap profile's sampling
	// (one record per 512 KiB allocated).
	maxSlope, rel, abs float64
	perMinute          bool // a column of the per-minute tables
}

func (f figure) judged() bool { return f.maxSlope > 0 || f.rel > 0 || f.abs > 0 }

func heapOf(group string) func(sample) float64 {
	return func(s sample) float64 {
		if s.Heap == nil {
			return math.NaN()
		}
		return s.Heap[group]
	}
}

// figures are what the soak watches. The thresholds:
//
//   - RSS: a slope under 1 MiB a minute (1.4 GiB a day would still be a
//     leak to fix, but less than that is within what the garbage
//     collector's cycles move RSS by over a quarter of an hour);
//   - /metrics series (Sluice's and the reference's): flat within 2 %:
//     with the leaks fixed their count is set by the config in force,
//     which is the same size at every push (a push renames its rules,
//     each with 6 series: 100 renamed rules leak 36,000 series a minute);
//   - the per-rule counters' label sets (sluice_rule_label_sets) and the
//     rules the status page's samples hold (sluice_ui_traffic_rules):
//     flat within 2 %, as the series;
//   - the bytes of the status page's samples (sluice_ui_traffic_bytes):
//     within 10 % or 1 MiB (the samples' arrays grow to the largest
//     config of the window and keep it);
//   - the status page's heap (from the heap profile): within 10 % or
//     4 MiB (the profile samples one record per 512 KiB allocated);
//   - goroutines and descriptors: within 10 % or 10 (streams that come
//     and go, requests in flight).
var figures = []figure{
	{name: "RSS", unit: "MiB", format: "%.1f", get: func(s sample) float64 { return s.RSSMiB }, maxSlope: 1, perMinute: true},
	{name: "Go heap in use", unit: "MiB", format: "%.1f", get: func(s sample) float64 { return s.HeapMiB }, perMinute: true},
	{name: "goroutines", format: "%.0f", get: func(s sample) float64 { return s.Goroutines }, rel: 0.10, abs: 10, perMinute: true},
	{name: "open descriptors", format: "%.0f", get: func(s sample) float64 { return s.FDs }, rel: 0.10, abs: 10},
	{name: "/metrics series", format: "%.0f", get: func(s sample) float64 { return s.Series }, rel: 0.02, abs: 20, perMinute: true},
	{name: "reference metrics series", format: "%.0f", get: func(s sample) float64 { return s.RefSeries }, rel: 0.02, abs: 20, perMinute: true},
	{name: "rule label sets", format: "%.0f", get: func(s sample) float64 { return s.LabelSets }, rel: 0.02, abs: 20, perMinute: true},
	{name: "status page rules", format: "%.0f", get: func(s sample) float64 { return s.TrafficRules }, rel: 0.02, abs: 20},
	{name: "status page samples", unit: "MiB", format: "%.2f", get: func(s sample) float64 { return s.TrafficMiB }, rel: 0.10, abs: 1, perMinute: true},
	{name: "status page heap", unit: "MiB", format: "%.1f", get: heapOf("status page"), rel: 0.10, abs: 4, perMinute: true},
	{name: "metrics heap", unit: "MiB", format: "%.1f", get: heapOf("metrics"), perMinute: true},
	{name: "RLQS heap", unit: "MiB", format: "%.1f", get: heapOf("rlqs"), perMinute: true},
	{name: "config heap", unit: "MiB", format: "%.1f", get: heapOf("config")},
	{name: "/metrics size", unit: "KiB", format: "%.0f", get: func(s sample) float64 { return s.MetricsKiB }},
	{name: "/metrics read time", unit: "s", format: "%.2f", get: func(s sample) float64 { return s.ScrapeSec }, perMinute: true},
	{name: "traffic JSON", unit: "KiB", format: "%.1f", get: func(s sample) float64 { return s.TrafficKiB }},
	{name: "RLQS buckets", format: "%.0f", get: func(s sample) float64 { return s.Buckets }},
	{name: "RLQS fleet exchange errors", format: "%.0f", get: func(s sample) float64 { return s.FleetErrors }},
	{name: "CPU", unit: "cores", format: "%.2f", get: func(s sample) float64 { return s.Cores }, perMinute: true},
}

// fitted is one figure of one replica over the second half of the run.
type fitted struct {
	slope  float64 // per minute, least squares
	median float64
	change float64 // slope × the second half's minutes
	n      int     // samples
}

// check is one line of the verdict.
type check struct {
	name, who, measured, threshold string
	ok                             bool
}

// report is the soak's analysis.
type report struct {
	s      settings
	rec    *record
	fits   [][]fitted // [figure][replica]
	checks []check
}

// rlqsSlack is how far above its limit the RLQS fleet may admit in a
// second: joins and re-divisions in the middle of a one-second window
// admitted up to 1.10 × L in docs/RLQS.md's measurements.
const rlqsSlack = 1.10

// maxLag is how many generations the config in force may trail the last
// push at the end (pushes every second: 10 s behind).
const maxLag = 10

func analyse(s settings, rec *record) *report {
	r := &report{s: s, rec: rec}
	deriveCores(rec.samples)
	r.fitFigures()
	r.judgeFigures()
	r.judgeErrors()
	r.judgeRLS()
	r.judgeRLQS()
	r.judgeXDS()
	return r
}

// deriveCores sets each sample's CPU use since the replica's previous
// sample.
func deriveCores(samples []sample) {
	prev := map[int]sample{}
	for i := range samples {
		s := &samples[i]
		s.Cores = math.NaN()
		if p, ok := prev[s.Replica]; ok {
			s.Cores = (s.CPU - p.CPU) / s.At.Sub(p.At).Seconds()
		}
		prev[s.Replica] = *s
	}
}

// minutes is t's time since the start, in minutes.
func (r *report) minutes(t time.Time) float64 { return t.Sub(r.rec.start).Minutes() }

func (r *report) fitFigures() {
	half := r.s.duration.Minutes() / 2
	r.fits = make([][]fitted, len(figures))
	for i, f := range figures {
		r.fits[i] = make([]fitted, r.s.replicas)
		for rep := range r.s.replicas {
			var ts, vs []float64
			for _, s := range r.rec.samples {
				if t, v := r.minutes(s.At), f.get(s); s.Replica == rep && t >= half && !math.IsNaN(v) {
					ts, vs = append(ts, t), append(vs, v)
				}
			}
			slope := leastSquares(ts, vs)
			r.fits[i][rep] = fitted{slope: slope, median: median(vs), change: slope * half, n: len(vs)}
		}
	}
}

// leastSquares is the slope of the line fitted to (t, v); NaN with fewer
// than two points or one t.
func leastSquares(t, v []float64) float64 {
	n := float64(len(t))
	if len(t) < 2 {
		return math.NaN()
	}
	var st, sv, stt, stv float64
	for i := range t {
		st, sv, stt, stv = st+t[i], sv+v[i], stt+t[i]*t[i], stv+t[i]*v[i]
	}
	d := n*stt - st*st
	if d == 0 {
		return math.NaN()
	}
	return (n*stv - st*sv) / d
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func (r *report) add(name, who, measured, threshold string, ok bool) {
	r.checks = append(r.checks, check{name: name, who: who, measured: measured, threshold: threshold, ok: ok})
}

func (r *report) judgeFigures() {
	for i, f := range figures {
		if !f.judged() {
			continue
		}
		for rep, ft := range r.fits[i] {
			who := fmt.Sprintf("sluice%d", rep+1)
			if ft.n < 2 {
				r.add(f.name+" flat", who, fmt.Sprintf("%d samples", ft.n), "at least 2 in the second half", false)
				continue
			}
			if f.maxSlope > 0 {
				r.add(f.name+" slope", who, fmt.Sprintf("%+.2f %s/min", ft.slope, f.unit),
					fmt.Sprintf("≤ %g %s/min", f.maxSlope, f.unit), ft.slope <= f.maxSlope)
				continue
			}
			tol := max(f.rel*ft.median, f.abs)
			r.add(f.name+" flat", who, fmt.Sprintf("%+.1f over the second half (median "+f.format+")", ft.change, ft.median),
				fmt.Sprintf("|change| ≤ %.1f (max(%g %% of median, %g))", tol, 100*f.rel, f.abs), math.Abs(ft.change) <= tol)
		}
	}
}
