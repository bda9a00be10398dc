package main

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"time"
)

// writeMarkdown writes the report: the settings, the verdict, the
// slopes, and graphs as tables (a row per minute).
func (r *report) writeMarkdown(w io.Writer) error {
	verdict := "PASS"
	if !r.pass() {
		verdict = "FAIL"
	}
	s := r.s
	fmt.Fprintf(w, "# Churn soak, %s UTC: %s\n\n", r.rec.start.UTC().Format("2006-01-02 15:04"), verdict)
	fmt.Fprintf(w, "`%s`; %v; %d replicas on one Redis, configured over xDS with Envoy Gateway's environment (TLS off); "+
		"a push of %d renamed rules every %v; Redis killed every %v (first at %v) for %v, counted down until %v after it answers; "+
		"RLS: routes %s at %g × their limits, %g/s over %d values of a detailed_metric rule, %g/s on the newest renamed rules; "+
		"RLQS: a steady fleet of %d proxies sharing %d/s, and a stream of %d fresh buckets joining every %v for %v; "+
		"samples every %v.\n",
		r.rec.version, s.duration, s.replicas, s.renamed, s.pushEvery, s.restartEvery, s.restartEvery/2, s.redisDown, s.grace,
		routeNames(), s.overdrive, s.detailedRate, s.detailedValues, s.churnRate,
		s.rlqsProxies, rlqsLimit, s.freshBuckets, s.joinEvery, s.streamLife, s.sample)
	fmt.Fprintf(w, "\n## Verdict\n")
	r.writeChecks(w)
	fmt.Fprintf(w, "\n## Slopes\n\nLeast squares over the second half of the run (the first is warm-up), per minute; then the median there.\n")
	r.writeSlopes(w)
	r.writeEvents(w)
	fmt.Fprintf(w, "\n## Per minute\n\nMeans of the samples in each minute.\n")
	for rep := range s.replicas {
		r.writeReplicaMinutes(w, rep)
	}
	r.writeTrafficMinutes(w)
	return nil
}

func routeNames() string {
	var n []string
	for _, l := range limited {
		n = append(n, fmt.Sprintf("%s (%d/s)", l.name, l.perSecond))
	}
	return strings.Join(n, ", ")
}

func (r *report) writeEvents(w io.Writer) {
	x, c := r.rec.xds, r.rec.churn
	fmt.Fprintf(w, "\n## Events\n\n- %d Redis restarts, down %v in all (grace included).\n", r.rec.restarts, r.rec.down.Total().Round(time.Millisecond))
	fmt.Fprintf(w, "- xDS: %d generations pushed, %d ACKs, %d NACKs%s.\n", x.Pushed, x.ACKs, x.NACKs, lastNACK(x.LastNACK))
	fmt.Fprintf(w, "- RLQS: %d churning streams opened, %d bucket actions received; %d steady-fleet seconds.\n", c.Opened, c.Actions, len(r.rec.fleet))
	r.writeFailedReads(w)
	for _, e := range r.rec.rlsErrs {
		fmt.Fprintf(w, "- error while Redis up: %s\n", e)
	}
	for _, e := range c.Errs {
		fmt.Fprintf(w, "- error: %s\n", e)
	}
}

// writeFailedReads counts, per replica, the samples in which a source
// could not be read within the client's timeout.
func (r *report) writeFailedReads(w io.Writer) {
	failed := map[string]int{}
	for _, s := range r.rec.samples {
		for _, f := range s.Failed {
			failed[fmt.Sprintf("sluice%d %s", s.Replica+1, f)]++
		}
	}
	for _, k := range slices.Sorted(maps.Keys(failed)) {
		fmt.Fprintf(w, "- not read within %v: %s, %d times.\n", readTimeout, k, failed[k])
	}
}

func lastNACK(m string) string {
	if m == "" {
		return ""
	}
	if len(m) > 300 {
		m = m[:300] + "…"
	}
	return fmt.Sprintf(" (the last: %q)", m)
}

// minuteOf is the minute of the run t falls in.
func (r *report) minuteOf(t time.Time) int { return int(t.Sub(r.rec.start) / time.Minute) }

func (r *report) minutesRun() int { return int(math.Ceil(r.s.duration.Minutes())) }

// writeReplicaMinutes: a row per minute, a column per figure marked
// perMinute.
func (r *report) writeReplicaMinutes(w io.Writer, rep int) {
	fmt.Fprintf(w, "\n### sluice%d\n\n| minute |", rep+1)
	var cols []figure
	for _, f := range figures {
		if f.perMinute {
			cols = append(cols, f)
			if f.unit != "" {
				fmt.Fprintf(w, " %s (%s) |", f.name, f.unit)
			} else {
				fmt.Fprintf(w, " %s |", f.name)
			}
		}
	}
	fmt.Fprintf(w, "\n|---:|%s\n", strings.Repeat("---:|", len(cols)))
	sums := make([][]float64, r.minutesRun())
	counts := make([][]int, r.minutesRun())
	for m := range sums {
		sums[m], counts[m] = make([]float64, len(cols)), make([]int, len(cols))
	}
	for _, s := range r.rec.samples {
		m := r.minuteOf(s.At)
		if s.Replica != rep || m >= len(sums) {
			continue
		}
		for i, f := range cols {
			if v := f.get(s); !math.IsNaN(v) {
				sums[m][i] += v
				counts[m][i]++
			}
		}
	}
	for m := range sums {
		fmt.Fprintf(w, "| %d |", m+1)
		for i, f := range cols {
			if counts[m][i] == 0 {
				fmt.Fprint(w, " – |")
				continue
			}
			fmt.Fprintf(w, " "+f.format+" |", sums[m][i]/float64(counts[m][i]))
		}
		fmt.Fprintln(w)
	}
}

// trafficMinute sums a minute of the seconds.
type trafficMinute struct {
	seconds, judged   int
	admitted          []int // per limited rule, granted and answered the next second
	most              []int // the most granted in a judged window
	errUp, errDown    int
	rlqsLo, rlqsHi    float64 // admitted/limit of the judged fleet seconds
	rlqsSum           float64
	rlqsN, redisDownS int
	lag               time.Duration // the soak's own, the most
}

func (r *report) trafficMinutes() []trafficMinute {
	ms := make([]trafficMinute, r.minutesRun())
	for i := range ms {
		ms[i] = trafficMinute{admitted: make([]int, len(limited)), most: make([]int, len(limited)), rlqsLo: math.Inf(1)}
	}
	for sec, s := range r.rec.rls {
		t := time.Unix(sec, 0)
		m := r.minuteOf(t)
		if m < 0 || m >= len(ms) {
			continue
		}
		tm := &ms[m]
		tm.seconds++
		tm.lag = max(tm.lag, r.rec.lag[sec])
		tm.errUp, tm.errDown = tm.errUp+s.ErrUp, tm.errDown+s.ErrDown
		judged := r.judgedSecond(t)
		if judged {
			tm.judged++
		} else {
			tm.redisDownS++
		}
		for i := range limited {
			tm.admitted[i] += s.Granted[i] + s.Ambiguous[i]
			if judged {
				tm.most[i] = max(tm.most[i], s.Granted[i])
			}
		}
	}
	for _, s := range r.rec.fleet {
		m := r.minuteOf(s.Start)
		if m < 0 || m >= len(ms) || !r.judgedFleetSecond(s) {
			continue
		}
		ratio := s.Admitted / s.Limit
		ms[m].rlqsLo, ms[m].rlqsHi = min(ms[m].rlqsLo, ratio), max(ms[m].rlqsHi, ratio)
		ms[m].rlqsSum += ratio
		ms[m].rlqsN++
	}
	return ms
}

// writeTrafficMinutes: the fleet's admitted totals against the limits,
// and the errors, a row per minute.
func (r *report) writeTrafficMinutes(w io.Writer) {
	fmt.Fprintf(w, "\n### Traffic\n\nRLS: admitted per second (mean over the minute) and the most granted in one window that met no outage, against the limit. "+
		"RLQS: the steady fleet's admitted/limit per judged second (settled, no outage, the simulator keeping up: min, mean, max). "+
		"The soak's own lag: how late its goroutines ran (a 100 ms ticker), the most in the minute.\n\n| minute |")
	for _, l := range limited {
		fmt.Fprintf(w, " route %s: mean/s, most (limit %d) |", l.name, l.perSecond)
	}
	fmt.Fprintf(w, " RLS errors, Redis up / down | seconds down | RLQS admitted/limit | soak's own lag, most |\n|---:|%s---:|---:|---|---:|\n", strings.Repeat("---:|", len(limited)))
	for m, tm := range r.trafficMinutes() {
		fmt.Fprintf(w, "| %d |", m+1)
		for i := range limited {
			mean := 0.0
			if tm.seconds > 0 {
				mean = float64(tm.admitted[i]) / float64(tm.seconds)
			}
			fmt.Fprintf(w, " %.1f, %d |", mean, tm.most[i])
		}
		fmt.Fprintf(w, " %d / %d | %d |", tm.errUp, tm.errDown, tm.redisDownS)
		if tm.rlqsN == 0 {
			fmt.Fprint(w, " – |")
		} else {
			fmt.Fprintf(w, " %.3f, %.3f, %.3f |", tm.rlqsLo, tm.rlqsSum/float64(tm.rlqsN), tm.rlqsHi)
		}
		fmt.Fprintf(w, " %v |\n", tm.lag.Round(time.Millisecond))
	}
}
