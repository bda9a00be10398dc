package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// heapGroup names the live heap allocated under code whose function
// names contain frame.
type heapGroup struct{ name, frame string }

// heapGroups attribute the live heap to the structures the soak watches.
// A record goes to the first group with a frame anywhere in its stack,
// so the order matters: the status page's traffic frames are filled by
// observe.(*Rules).Snapshot called from ui.(*Traffic).Sample (the status
// page's), and per-rule series are made from config reload callbacks
// (the metrics').
var heapGroups = []heapGroup{
	{"status page", "sluice/observe/ui."},
	{"metrics", "sluice/observe."},
	{"rlqs", "sluice/quota."},
	{"config", "sluice/config"},
}

// heapBy reads a Go heap profile in its text form
// (/debug/pprof/heap?debug=1) and returns the in-use bytes of each of
// groups (by name; the rest under ""), estimated as pprof estimates them
// from the sampled records: each record scaled by 1/(1−exp(−s/R)), s its
// mean object size and R the sampling rate (half the header's
// "heap/N", which the format doubles for history's sake).
func heapBy(r io.Reader, groups []heapGroup) (map[string]float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	if !sc.Scan() {
		return nil, fmt.Errorf("heap profile: empty: %v", sc.Err())
	}
	_, rateText, ok := strings.Cut(sc.Text(), " @ heap/")
	rate, err := strconv.ParseFloat(rateText, 64)
	if !strings.HasPrefix(sc.Text(), "heap profile: ") || !ok || err != nil {
		return nil, fmt.Errorf("heap profile: header %q", sc.Text())
	}
	rate /= 2
	out := map[string]float64{}
	var objects, bytes float64 // of the record being read
	group := ""
	inRecord := false
	flush := func() {
		if inRecord {
			out[group] += scaleHeap(objects, bytes, rate)
		}
		inRecord, group = false, ""
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "#") && inRecord:
			group = firstGroup(group, line, groups)
		case strings.Contains(line, " @ "):
			flush()
			if _, err := fmt.Sscanf(line, "%g: %g [", &objects, &bytes); err != nil {
				return nil, fmt.Errorf("heap profile: record %q: %w", line, err)
			}
			inRecord = true
		default: // a blank line, the MemStats comments
			flush()
		}
	}
	flush()
	return out, sc.Err()
}

// firstGroup returns the group of a frame line if it comes before cur in
// groups (cur "" comes after all).
func firstGroup(cur, line string, groups []heapGroup) string {
	for _, g := range groups {
		if g.name == cur {
			return cur
		}
		if strings.Contains(line, g.frame) {
			return g.name
		}
	}
	return cur
}

// scaleHeap estimates the bytes a sampled record stands for
// (runtime/pprof's scaleHeapSample).
func scaleHeap(objects, bytes, rate float64) float64 {
	if objects == 0 || bytes == 0 || rate <= 1 {
		return bytes
	}
	return bytes / (1 - math.Exp(-bytes/objects/rate))
}
