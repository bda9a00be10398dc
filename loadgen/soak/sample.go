package main

import (
	"context"
	"encoding/csv"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// csvHeader names the columns of the CSV, a row per instance and sample.
var csvHeader = []string{"t_s", "instance", "store", "workload", "rss_kib", "goroutines", "open_fds", "requests", "ok", "over_limit",
	"failed", "failed_redis_down", "canary_ok", "canary_failed", "canary_failed_redis_down", "redis_down"}

// sample reads each instance's RSS, goroutines and descriptors every
// second until the soak ends, and every -sample (and at the end) writes
// a row per instance to w. It returns the outcomes of the rows.
func (f *fleet) sample(ctx context.Context, rec *record, w *csv.Writer) outcomes {
	w.Write(csvHeader)
	var total outcomes
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	rs := make([]readings, len(f.insts))
	nextRow := rec.start.Add(f.s.sample)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
		}
		for i, in := range f.insts {
			rs[i].read(in)
		}
		now := time.Now()
		if now.Before(nextRow) && !done {
			continue
		}
		nextRow = nextRow.Add(f.s.sample)
		el := now.Sub(rec.start).Seconds()
		isDown := rec.down.Overlaps(now.Add(-f.s.sample), now)
		for i, in := range f.insts {
			total.add(in.row(w, &rs[i], el, isDown))
		}
		w.Flush()
	}
	return total
}

// readings are an instance's readings since its last row.
type readings struct{ rss, gor, fds []float64 }

func (r *readings) read(in *instance) {
	rss, fds := harness.ProcStats(in.proc.Pid())
	r.rss, r.gor, r.fds = append(r.rss, rss), append(r.gor, goroutines(in.proc.HTTP)), append(r.fds, float64(fds))
}

// medians returns the readings' medians, so that the requests in flight
// at one instant do not decide a row, and empties r.
func (r *readings) medians() (rss, gor, fds float64) {
	rss, gor, fds = median(r.rss), median(r.gor), median(r.fds)
	*r = readings{r.rss[:0], r.gor[:0], r.fds[:0]}
	return rss, gor, fds
}

// row writes in's row at el seconds into the soak: the medians of r and
// the outcomes since the last row, which it returns. It keeps the medians
// for the summary.
func (in *instance) row(w *csv.Writer, r *readings, el float64, redisDown bool) outcomes {
	rss, gor, fds := r.medians()
	o := in.take()
	in.rss, in.goroutines, in.times = append(in.rss, rss), append(in.goroutines, gor), append(in.times, el)
	f0 := func(v float64) string { return strconv.FormatFloat(v, 'f', 0, 64) }
	w.Write([]string{f0(el), in.name, in.store, in.workload, f0(rss), f0(gor), f0(fds),
		u(o.requests), u(o.ok), u(o.overLimit), u(o.failed), u(o.excused), u(o.canaryOK), u(o.canaryFailed), u(o.canaryExcused),
		strconv.FormatBool(redisDown)})
	return o
}

func u(v uint64) string { return strconv.FormatUint(v, 10) }

// goroutines reads go_goroutines from an instance's /metrics.
func goroutines(httpAddr string) float64 {
	m, err := harness.Scrape(context.Background(), http.DefaultClient, "http://"+httpAddr+"/metrics", "go_goroutines")
	if err != nil {
		return 0
	}
	return m.Sum["go_goroutines"]
}
