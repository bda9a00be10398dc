package main

import (
	"bytes"
	"encoding/csv"
	"testing"
)

func TestBenchResult_Outcomes(t *testing.T) {
	r := &benchResult{Requests: 100, Unfinished: 3, Codes: map[string]uint64{"OK": 90, "Unavailable": 10},
		Overall: map[string]uint64{"OK": 60, "OVER_LIMIT": 30}}
	want := outcomes{requests: 100, ok: 90, overLimit: 30, failed: 13}
	if got := r.outcomes(false); got != want {
		t.Errorf("outcomes(false) = %+v, want %+v", got, want)
	}
	want.failed, want.excused = 0, 13
	if got := r.outcomes(true); got != want {
		t.Errorf("outcomes(true) = %+v, want %+v", got, want)
	}
}

// TestInstance_Row: a row holds the medians of the readings since the
// last one and the outcomes counted since, which start anew; the
// instance keeps the medians for the summary.
func TestInstance_Row(t *testing.T) {
	in := &instance{name: "redis2", store: "redis", workload: "multi"}
	in.count(outcomes{requests: 10, ok: 9, failed: 1, canaryOK: 2})
	in.count(outcomes{requests: 5, ok: 5, overLimit: 2, excused: 1, canaryFailed: 1, canaryExcused: 3})
	r := readings{rss: []float64{300, 100, 200}, gor: []float64{12, 10, 11}, fds: []float64{7, 9, 8}}
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	o := in.row(w, &r, 20.4, true)
	w.Flush()
	if want := "20,redis2,redis,multi,200,11,8,15,14,2,1,1,2,1,3,true\n"; b.String() != want {
		t.Errorf("row %q, want %q", b.String(), want)
	}
	if o.requests != 15 || o.canaryExcused != 3 {
		t.Errorf("row returned %+v, want the two counts added", o)
	}
	if len(r.rss)+len(r.gor)+len(r.fds) != 0 || in.take() != (outcomes{}) {
		t.Errorf("after the row: readings %+v, window %+v; want both empty", r, in.window)
	}
	if len(in.rss) != 1 || in.rss[0] != 200 || in.goroutines[0] != 11 || in.times[0] != 20.4 {
		t.Errorf("kept %v %v %v, want [200] [11] [20.4]", in.rss, in.goroutines, in.times)
	}
}
