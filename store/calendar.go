package store

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// CalendarUnit is the length of a calendar period.
type CalendarUnit uint8

// The calendar units. A week is an ISO week: Monday to Sunday.
const (
	CalendarDay CalendarUnit = iota + 1
	CalendarWeek
	CalendarMonth
	CalendarYear
)

// String returns "day", "week", "month" or "year".
func (u CalendarUnit) String() string {
	switch u {
	case CalendarDay:
		return "day"
	case CalendarWeek:
		return "week"
	case CalendarMonth:
		return "month"
	case CalendarYear:
		return "year"
	}
	return fmt.Sprintf("CalendarUnit(%d)", uint8(u))
}

// nominal is the unit's length in envoyproxy/ratelimit (a month of 30
// days, a year of 365).
func (u CalendarUnit) nominal() time.Duration {
	switch u {
	case CalendarWeek:
		return 7 * 24 * time.Hour
	case CalendarMonth:
		return 30 * 24 * time.Hour
	case CalendarYear:
		return 365 * 24 * time.Hour
	}
	return 24 * time.Hour
}

// Calendar splits time into the days, ISO weeks, months (or runs of
// months) or years of a time zone. A period starts at the first instant
// whose local time reaches its first day's midnight: local midnight, or
// where a change of offset skips midnight, the first instant of that day
// (the end of the gap); where a change of offset repeats midnight, its
// first occurrence, and the local times repeated after it already belong
// to the new period. So the periods cover time without gaps or overlaps,
// each starts at a whole second, and a day is 23 or 25 hours long across
// a daylight-saving change (a day that a zone skips entirely is empty).
//
// A Calendar remembers the periods around the last instant asked, so that
// the instants of one period cost no time-zone arithmetic. Safe for
// concurrent use.
type Calendar struct {
	unit   CalendarUnit
	months int64 // months per period (CalendarMonth), else 1
	loc    *time.Location
	last   atomic.Pointer[span]
}

// span is a period k and the two after it: the Unix nanoseconds at which
// periods k, k+1 and k+2 start.
type span struct {
	k               int64
	b0, b1, b2      int64
	length, length1 int64 // b1-b0, b2-b1
}

// NewCalendar returns the calendar of unit periods in loc (UTC if nil).
// months is the number of months per period, aligned to January: 1, or
// for CalendarMonth 2, 3, 4, 6 or 12 (a divisor of a year).
func NewCalendar(unit CalendarUnit, months int, loc *time.Location) (*Calendar, error) {
	switch {
	case unit < CalendarDay || unit > CalendarYear:
		return nil, fmt.Errorf("store: unknown calendar unit %d", uint8(unit))
	case months < 1 || months > 1 && (unit != CalendarMonth || 12%months != 0):
		return nil, fmt.Errorf("store: calendar periods of %d %ss: only months come in runs, of 2, 3, 4, 6 or 12", months, unit)
	}
	if loc == nil {
		loc = time.UTC
	}
	return &Calendar{unit: unit, months: int64(months), loc: loc}, nil
}

// Unit is the calendar's unit.
func (c *Calendar) Unit() CalendarUnit { return c.unit }

// Months is the number of months per period: 1 unless the calendar counts
// in runs of months.
func (c *Calendar) Months() int { return int(c.months) }

// Location is the calendar's time zone.
func (c *Calendar) Location() *time.Location { return c.loc }

// Nominal is a period's length as envoyproxy/ratelimit counts the unit (a
// day of 24 hours, a week of 7 days, a month of 30 days, a year of 365
// days), times the months per period.
func (c *Calendar) Nominal() time.Duration { return c.unit.nominal() * time.Duration(c.months) }

// String describes the period: "calendar month (Europe/Berlin)", "3
// calendar months (UTC)".
func (c *Calendar) String() string {
	if c.months > 1 {
		return fmt.Sprintf("%d calendar %ss (%s)", c.months, c.unit, c.loc)
	}
	return fmt.Sprintf("calendar %s (%s)", c.unit, c.loc)
}

// Period returns the Unix nanoseconds at which the period holding t
// starts and ends.
func (c *Calendar) Period(t int64) (start, end int64) {
	s := c.span(t)
	return s.b0, s.b1
}

// span returns the periods from the one holding t (Unix nanoseconds).
func (c *Calendar) span(t int64) *span {
	if s := c.last.Load(); s != nil && s.b0 <= t && t < s.b1 {
		return s
	}
	k := c.find(t)
	s := &span{k: k, b0: c.start(k), b1: c.start(k + 1), b2: c.start(k + 2)}
	s.length, s.length1 = s.b1-s.b0, s.b2-s.b1
	c.last.Store(s)
	return s
}

// Days between 0001-01-01 (a Monday) and 1970-01-01.
const daysBefore1970 = 719162

// find returns the index of the period holding t: days or ISO weeks since
// 0001-01-01, runs of months since year 0, or the year.
func (c *Calendar) find(t int64) int64 {
	sec := t / int64(time.Second)
	if t < 0 && t%int64(time.Second) != 0 {
		sec--
	}
	y, m, d := time.Unix(sec, 0).In(c.loc).Date()
	var k int64
	switch c.unit {
	case CalendarDay, CalendarWeek:
		k = time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix()/86400 + daysBefore1970
		if c.unit == CalendarWeek {
			k /= 7
		}
	case CalendarMonth:
		k = (int64(y)*12 + int64(m) - 1) / c.months
	default:
		k = int64(y)
	}
	// The local date is before the period t is in only after a change
	// of offset repeated the period's first midnight.
	for next := c.start(k + 1); next <= t && next != math.MaxInt64; next = c.start(k + 1) {
		k++
	}
	return k
}

// start returns the Unix nanoseconds at which period k starts, or
// math.MaxInt64 for periods that start after 2262 (beyond int64
// nanoseconds).
func (c *Calendar) start(k int64) int64 {
	var wall int64 // the first day's midnight, in seconds as if in UTC
	switch c.unit {
	case CalendarDay:
		wall = (k - daysBefore1970) * 86400
	case CalendarWeek:
		wall = (k*7 - daysBefore1970) * 86400
	case CalendarMonth:
		m := k * c.months
		wall = time.Date(int(m/12), time.Month(m%12+1), 1, 0, 0, 0, 0, time.UTC).Unix()
	default:
		wall = time.Date(int(k), time.January, 1, 0, 0, 0, 0, time.UTC).Unix()
	}
	const last = math.MaxInt64 / int64(time.Second)
	if wall > last+maxOffset {
		return math.MaxInt64
	}
	if sec := c.reach(wall); sec <= last {
		return sec * int64(time.Second)
	}
	return math.MaxInt64
}

// maxOffset bounds a time zone's offset from UTC (they stay within ±26
// hours, local mean times of the past included).
const maxOffset = 26 * 3600

// changeStep is the spacing of the offsets reach samples. Zones change
// their offsets far less often: since 1970 never twice within 7 days.
const changeStep = 12 * 3600

// reach returns the first Unix second at which the local time is wall or
// later (wall in seconds, as if in UTC). From well before wall it walks
// the zone's stretches of one offset: in each, the first instant whose
// local time reaches wall is wall minus the offset, or the stretch's start
// if that is later; the first stretch that has one holds the answer.
//
// The changes of offset are found from the offsets alone, sampled every
// changeStep and bisected to the second where two samples differ
// (time.Time.ZoneBounds is not exact beyond the zone's table of
// transitions).
func (c *Calendar) reach(wall int64) int64 {
	t := wall - maxOffset
	o := c.offset(t)
	for {
		cand := max(t, wall-o)
		next, no, ok := c.nextChange(t, o, wall+maxOffset)
		if !ok || cand < next {
			return cand
		}
		t, o = next, no
	}
}

// nextChange returns the first second after t, up to until, whose offset
// is not o (the offset at t), and that offset; false if there is none.
func (c *Calendar) nextChange(t, o, until int64) (int64, int64, bool) {
	for lo := t; lo < until; lo += changeStep {
		hi := min(lo+changeStep, until)
		if c.offset(hi) == o {
			continue
		}
		for hi-lo > 1 {
			if m := lo + (hi-lo)/2; c.offset(m) == o {
				lo = m
			} else {
				hi = m
			}
		}
		return hi, c.offset(hi), true
	}
	return 0, 0, false
}

// offset is the zone's offset from UTC at Unix second t.
func (c *Calendar) offset(t int64) int64 {
	_, off := time.Unix(t, 0).In(c.loc).Zone()
	return int64(off)
}
