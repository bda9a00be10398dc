package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/loadgen/harness"
)

// summarise prints the pass/fail table and reports whether all passed.
func summarise(out io.Writer, s settings, insts []*instance, total outcomes, can *canaries, down *harness.Outages, restarts int) bool {
	pass := true
	check := func(ok bool) string {
		if ok {
			return "pass"
		}
		pass = false
		return "**FAIL**"
	}
	d := s.duration.Seconds()
	refFrom, refTo, lastFrom := 120.0, 180.0, d-60
	if d < 240 {
		refFrom, refTo, lastFrom = d/4, d/2, d*3/4
	}
	fmt.Fprintf(out, "\n| check | instance | reference median | final median | change | result |\n|---|---|---:|---:|---:|---|\n")
	for _, in := range insts {
		for _, m := range []struct {
			name string
			v    []float64
			unit string
		}{{"RSS", in.rss, " KiB"}, {"goroutines", in.goroutines, ""}} {
			ref, last := medianIn(in.times, m.v, refFrom, refTo), medianIn(in.times, m.v, lastFrom, d+1)
			change := (last - ref) / ref
			fmt.Fprintf(out, "| %s flat (≤ 10 %%) | %s (%s) | %.0f%s | %.0f%s | %+.1f %% | %s |\n", m.name, in.name, in.store,
				ref, m.unit, last, m.unit, 100*change, check(ref > 0 && math.Abs(change) <= 0.10))
		}
	}
	over, windows, grants := can.overGrants()
	fmt.Fprintf(out, "| canary over-grants | all | | | %d of %d key windows over the limit of %d, %d grants | %s |\n", len(over), windows, s.canaryLimit, grants, check(len(over) == 0 && grants > 0))
	fmt.Fprintf(out, "| failed outside Redis-down intervals | all | | | %d of %d bench + %d of %d canary | %s |\n",
		total.failed, total.requests, total.canaryFailed, total.canaryOK+total.canaryFailed+total.canaryExcused, check(total.failed == 0 && total.canaryFailed == 0))
	for _, o := range over {
		fmt.Fprintf(out, "over-granted: %s\n", o)
	}
	can.mu.Lock()
	for _, f := range can.failures {
		fmt.Fprintf(out, "canary failed: %s\n", f)
	}
	can.mu.Unlock()
	downFor := down.Total()
	fmt.Fprintf(out, "\n%v soak, %d Redis restarts (down %v in all, grace included); %d bench requests (%d OK, %d over limit), %d failed while Redis was down (excused); %d canary requests failed while Redis was down (excused).\n",
		s.duration, restarts, downFor.Round(time.Millisecond), total.requests, total.ok, total.overLimit, total.excused, total.canaryExcused)
	if pass {
		fmt.Fprintln(out, "PASS")
	} else {
		fmt.Fprintln(out, "FAIL")
	}
	return pass
}

// medianIn is the median of v at times in [from, to).
func medianIn(times, v []float64, from, to float64) float64 {
	var sel []float64
	for i, t := range times {
		if t >= from && t < to {
			sel = append(sel, v[i])
		}
	}
	return median(sel)
}

// median sorts v and returns its median (0 if empty).
func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	return v[len(v)/2]
}
