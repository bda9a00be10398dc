package main

import (
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/loadgen"
)

// judgeErrors: no RLS request, RLQS stream or fleet exchange fails while
// Redis is up (outside the outages: the kill to --grace after the new
// process answers).
func (r *report) judgeErrors() {
	var up, starved, down, total int
	for sec, s := range r.rec.rls {
		up, down = up+s.ErrUp, down+s.ErrDown
		if r.starved(sec) {
			starved += s.ErrUp
		}
		total += s.Others
		for _, n := range s.Offered {
			total += n
		}
	}
	r.add("RLS errors while Redis up", "all",
		fmt.Sprintf("%d of %d requests, %d of them sent while the soak itself ran late; %d more while down", up, total, starved, down), "0", up == 0)
	c := r.rec.churn
	streamErrs := c.ErrUp
	fleet := "none"
	if r.rec.fleetErr != nil {
		streamErrs++
		fleet = r.rec.fleetErr.Error()
	}
	r.add("RLQS stream errors while Redis up", "all",
		fmt.Sprintf("%d of %d churning streams (%d more while down); steady fleet: %s", c.ErrUp, c.Opened, c.ErrDown, fleet), "0", streamErrs == 0)
	exUp, exDown := r.fleetExchangeErrors()
	r.add("RLQS fleet exchange errors while Redis up", "all",
		fmt.Sprintf("%.0f (sluice_rlqs_fleet_errors_total; %.0f more between readings that met an outage)", exUp, exDown), "0", exUp == 0)
}

// fleetExchangeErrors sums sluice_rlqs_fleet_errors_total's increases
// between a replica's readings, apart for the spans that met an outage
// (a span runs from one reading to the next that succeeded).
func (r *report) fleetExchangeErrors() (up, down float64) {
	prev := map[int]sample{}
	for _, s := range r.rec.samples {
		if math.IsNaN(s.FleetErrors) {
			continue
		}
		if p, ok := prev[s.Replica]; ok {
			if r.rec.down.Overlaps(p.At, s.At) {
				down += s.FleetErrors - p.FleetErrors
			} else {
				up += s.FleetErrors - p.FleetErrors
			}
		}
		prev[s.Replica] = s
	}
	return up, down
}

// starved reports whether the soak itself ran more than starvedLag late
// in the second sec or the two after it (a request's time and its
// deadline's), so that an error of a request sent in sec may be the
// soak's own.
func (r *report) starved(sec int64) bool {
	for s := sec; s <= sec+2; s++ {
		if r.rec.lag[s] > starvedLag {
			return true
		}
	}
	return false
}

// judgedSecond reports whether the second starting at t is judged
// against a limit: it met no outage.
func (r *report) judgedSecond(t time.Time) bool { return !r.rec.down.Overlaps(t, t.Add(time.Second)) }

// judgeRLS: no window of a limited rule granted more than its limit,
// counting the grants known to be in the window (sent and answered in
// the same second: the limits are per second, fixed windows on the wall
// clock, shared by every replica through Redis). A grant answered in the
// next second may belong to either window; the measured column shows the
// bound with them too.
func (r *report) judgeRLS() {
	for i, l := range limited {
		var windows, over, maxCertain, maxBound int
		var sum float64
		for sec, s := range r.rec.rls {
			if !r.judgedSecond(time.Unix(sec, 0)) {
				continue
			}
			windows++
			bound := s.Granted[i] + s.Ambiguous[i]
			if p := r.rec.rls[sec-1]; p != nil {
				bound += p.Ambiguous[i]
			}
			maxCertain, maxBound = max(maxCertain, s.Granted[i]), max(maxBound, bound)
			sum += float64(s.Granted[i] + s.Ambiguous[i])
			if s.Granted[i] > int(l.perSecond) {
				over++
			}
		}
		mean := 0.0
		if windows > 0 {
			mean = sum / float64(windows)
		}
		r.add("RLS admitted ≤ limit, every window", "route "+l.name,
			fmt.Sprintf("%d of %d windows over; most %d (≤ %d with the answers of the next second); mean %.1f/s", over, windows, maxCertain, maxBound, mean),
			fmt.Sprintf("≤ %d a second", l.perSecond), over == 0 && windows > 0)
	}
}

// judgedFleetSecond reports whether a second of the steady RLQS fleet
// is judged: settled, no outage, and the simulator not starved. Its
// proxies step every 20 ms and count a step's admissions in the second
// the step ran in; a step that ran late spans two windows and counts
// both in one (docs/RLQS.md). Its offered requests show most of them:
// the fleet offers 2 × rlqsLimit a second, and a second off by more than
// a quarter is one the simulator could not keep; and so is a second in
// which the soak itself ran more than starvedLag late (its steps, whose
// offers may still add up, ran late with it).
func (r *report) judgedFleetSecond(s loadgen.Second) bool {
	const want = 2 * rlqsLimit
	return s.T > rlqsSettle && r.judgedSecond(s.Start) && math.Abs(s.Offered-want) <= want/4 && !r.starved(s.Start.Unix())
}

// judgeRLQS: the steady fleet admits at most rlqsSlack × its limit in
// every judged second.
func (r *report) judgeRLQS() {
	var judged, over, starved int
	lo, hi := math.Inf(1), 0.0
	for _, s := range r.rec.fleet {
		if s.T > rlqsSettle && r.judgedSecond(s.Start) && !r.judgedFleetSecond(s) {
			starved++
		}
		if !r.judgedFleetSecond(s) {
			continue
		}
		judged++
		ratio := s.Admitted / s.Limit
		lo, hi = min(lo, ratio), max(hi, ratio)
		if ratio > rlqsSlack {
			over++
		}
	}
	if judged == 0 {
		lo = 0
	}
	r.add("RLQS fleet admitted ≤ 1.10 × limit, every second", "fleet",
		fmt.Sprintf("%d of %d seconds over; admitted/limit %.3f–%.3f (%d seconds the simulator could not keep up not judged)", over, judged, lo, hi, starved),
		fmt.Sprintf("≤ %.2f × %d a second", rlqsSlack, rlqsLimit), over == 0 && judged > 0)
}

// rlqsSettle are the fleet's first seconds, before its first assignments
// (loadgen's settling: two reporting intervals and one).
const rlqsSettle = 3

// judgeXDS: every replica takes every push (no NACK) and keeps up.
func (r *report) judgeXDS() {
	x := r.rec.xds
	r.add("xDS pushes taken", "all",
		fmt.Sprintf("%d pushed, %d ACKs, %d NACKs; at the end %d of %d replicas' streams %d generations behind at most",
			x.Pushed, x.ACKs, x.NACKs, x.Streams, r.s.replicas, x.Lag),
		fmt.Sprintf("0 NACKs, every replica ≤ %d behind", maxLag), x.NACKs == 0 && x.Lag <= maxLag && x.Streams == r.s.replicas)
}

func (r *report) pass() bool {
	for _, c := range r.checks {
		if !c.ok {
			return false
		}
	}
	return true
}
