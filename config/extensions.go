package config

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/store"
)

// Sluice's own keys, which envoyproxy/ratelimit does not know (see "Sluice
// extensions" in docs/CONFIG.md): a descriptor's rate_limits, and a
// rate_limit's algorithm, unit_multiplier, burst, calendar and time_zone.
// rateLimitFrom (limit.go) reads a rate_limit's after the reference's
// fields, in the order of this file: each may depend on the ones before.

// rateLimits compiles a descriptor's rate_limits list: several limits
// that every request matching the descriptor consumes from at once. Their
// stats paths are stat[i]; a limit whose counter key would equal an
// earlier one's gets "|k" appended for its k-th occurrence, so no two
// limits share a counter. nil if the list is invalid.
func (l *loader) rateLimits(file, dname, path, stat string, line int, f field, fl flags) []*Rule {
	n := resolve(f.val)
	if n.Kind != yaml.SequenceNode {
		l.errorf(file, n.Line, path, "rate_limits: want a list of rate_limit mappings, got %s", describe(n))
		return nil
	}
	if len(n.Content) == 0 {
		l.errorf(file, n.Line, path, "rate_limits is empty; give at least one limit, or leave it out")
		return nil
	}
	nerr := len(l.errs)
	var group []*Rule
	seen := map[string]int{}
	for i, item := range n.Content {
		p := fmt.Sprintf("%s.rate_limits[%d]", path, i)
		item = resolve(item)
		if isNull(item) {
			l.errorf(file, item.Line, p, "want a rate_limit mapping, got null")
			continue
		}
		r := l.rateLimitFrom(file, dname, p, fmt.Sprintf("%s[%d]", stat, i), line, item, fl, true)
		if r == nil {
			continue
		}
		r.Index = i
		seen[r.suffix]++
		if k := seen[r.suffix]; k > 1 {
			r.suffix += "|" + strconv.Itoa(k)
		}
		group = append(group, r)
	}
	if len(l.errs) > nerr {
		return nil
	}
	for _, r := range group {
		r.group = group
	}
	return group
}

// algorithm reads rate_limit.algorithm into r: fixed_window (the
// default, the reference's), sliding_window or token_bucket.
func (l *loader) algorithm(file, path string, r *Rule, fields map[string]field) {
	f, ok := fields["algorithm"]
	if !ok {
		return
	}
	a, _ := l.str(file, path, "algorithm", f)
	switch {
	case r.Unlimited:
		l.errorf(file, f.key.Line, path, "an unlimited rate_limit takes no algorithm")
	case a == "fixed_window":
		r.Algorithm = store.FixedWindow
	case a == "token_bucket":
		r.Algorithm = store.TokenBucket
	case a == "sliding_window":
		r.Algorithm = store.SlidingWindow
	default:
		l.errorf(file, f.val.Line, path, "unknown algorithm %q (want fixed_window, sliding_window or token_bucket)", a)
	}
}

// unitMultiplier reads rate_limit.unit_multiplier into r, after its unit:
// 1 by default, and a window of at most 2^32-1 seconds.
func (l *loader) unitMultiplier(file, path string, r *Rule, fields map[string]field) {
	r.UnitMultiplier = 1
	f, ok := fields["unit_multiplier"]
	if !ok {
		return
	}
	switch v, ok := l.uint(file, path, "unit_multiplier", f); {
	case !ok:
	case r.Unlimited:
		l.errorf(file, f.key.Line, path, "an unlimited rate_limit takes no unit_multiplier")
	case v == 0 || v > math.MaxUint32:
		l.errorf(file, f.val.Line, path, "unit_multiplier: %d is not between 1 and %d", v, uint64(math.MaxUint32))
	case uint64(r.Unit.Duration()/time.Second)*v > math.MaxUint32:
		l.errorf(file, f.val.Line, path, "unit_multiplier: %d %ss is too long (at most %d seconds)", v, r.Unit, uint64(math.MaxUint32))
	default:
		r.UnitMultiplier = uint32(v)
	}
}

// burst reads rate_limit.burst into r, after its requests_per_unit (the
// default) and algorithm: only a token bucket takes one, up to 2^53.
func (l *loader) burst(file, path string, r *Rule, fields map[string]field) {
	r.Burst = r.RequestsPerUnit
	f, ok := fields["burst"]
	if !ok {
		return
	}
	switch v, ok := l.uint(file, path, "burst", f); {
	case !ok:
	case r.Algorithm != store.TokenBucket:
		l.errorf(file, f.key.Line, path, "burst needs algorithm: token_bucket")
	case v > store.MaxLimit:
		l.errorf(file, f.val.Line, path, "burst: %d exceeds %d (2^53)", v, uint64(store.MaxLimit))
	default:
		r.Burst = v
	}
}

// calendarUnits are the units a calendar counts in.
var calendarUnits = map[Unit]store.CalendarUnit{Day: store.CalendarDay, Week: store.CalendarWeek,
	Month: store.CalendarMonth, Year: store.CalendarYear}

// calendarFields reads rate_limit.calendar and rate_limit.time_zone into
// r, after its unit, algorithm and unit_multiplier: a calendar counts days,
// weeks, months or years (months also in runs that divide a year), with a
// fixed or a sliding window.
func (l *loader) calendarFields(file, path string, r *Rule, fields map[string]field) {
	f, ok := fields["calendar"]
	want := false
	if ok {
		want, ok = l.bool(file, path, "calendar", f)
	}
	if ok && want {
		_, unitOK := calendarUnits[r.Unit]
		switch {
		case r.Unlimited:
			l.errorf(file, f.key.Line, path, "an unlimited rate_limit takes no calendar")
		case r.Algorithm == store.TokenBucket:
			l.errorf(file, f.key.Line, path, "calendar needs algorithm fixed_window or sliding_window (a token bucket refills continuously: it has no periods)")
		case r.Unit == UnitUnknown:
		case !unitOK:
			l.errorf(file, f.key.Line, path, "calendar periods are days, weeks, months or years, not %ss (those windows are aligned to the clock already)", r.Unit)
		case r.UnitMultiplier > 1 && (r.Unit != Month || 12%r.UnitMultiplier != 0):
			l.errorf(file, fields["unit_multiplier"].val.Line, path, "unit_multiplier: %d calendar %ss: only months run in multiples, of 2, 3, 4, 6 or 12 (aligned to January)", r.UnitMultiplier, r.Unit)
		default:
			r.Calendar, r.TimeZone = true, time.UTC
		}
	}
	f, ok = fields["time_zone"]
	if !ok {
		return
	}
	name, ok := l.str(file, path, "time_zone", f)
	switch {
	case !ok:
	case !want:
		l.errorf(file, f.key.Line, path, "time_zone needs calendar: true")
	case name == "":
		l.errorf(file, f.val.Line, path, "time_zone is empty; leave it out for UTC")
	case name == "Local":
		l.errorf(file, f.val.Line, path, "time_zone: \"Local\" is this host's zone; name the zone (such as Europe/Berlin) so that every replica counts the same periods")
	default:
		loc, err := l.location(name)
		if err != nil {
			l.errorf(file, f.val.Line, path, "unknown time_zone %q (want an IANA time zone name such as Europe/Berlin or UTC)", name)
		} else if r.Calendar {
			r.TimeZone = loc
		}
	}
}

// location loads a time zone once per Load.
func (l *loader) location(name string) (*time.Location, error) {
	if loc, ok := l.zones[name]; ok {
		return loc, nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	if l.zones == nil {
		l.zones = map[string]*time.Location{}
	}
	l.zones[name] = loc
	return loc, nil
}

// calendarRule compiles calendar rule r. Its calendar is one per unit,
// run of months and zone per Load, so that rules of one calendar share
// what it remembers of the current period.
func (l *loader) calendarRule(r *Rule) (*store.Rule, error) {
	k := calendarKey{calendarUnits[r.Unit], max(r.UnitMultiplier, 1), r.TimeZone}
	c, ok := l.calendars[k]
	if !ok {
		var err error
		if c, err = store.NewCalendar(k.unit, int(k.months), k.loc); err != nil {
			return nil, err
		}
		if l.calendars == nil {
			l.calendars = map[calendarKey]*store.Calendar{}
		}
		l.calendars[k] = c
	}
	if r.Algorithm == store.SlidingWindow {
		return store.NewCalendarSliding(r.RequestsPerUnit, c)
	}
	return store.NewCalendarWindow(r.RequestsPerUnit, c)
}

type calendarKey struct {
	unit   store.CalendarUnit
	months uint32
	loc    *time.Location
}
