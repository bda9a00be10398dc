package store

import (
	"io/fs"
	"math"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // the zones below, whatever the host has
)

func mustZone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

func mustCalendar(t testing.TB, u CalendarUnit, months int, zone string) *Calendar {
	t.Helper()
	c, err := NewCalendar(u, months, mustZone(t, zone))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// at parses an RFC 3339 instant into Unix nanoseconds.
func at(t testing.TB, s string) int64 {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return ts.UnixNano()
}

func TestCalendar_Periods(t *testing.T) {
	for _, c := range []struct {
		unit       CalendarUnit
		months     int
		zone       string
		at         string
		start, end string // RFC 3339 in the zone
		length     time.Duration
	}{
		{CalendarMonth, 1, "UTC", "2024-02-15T00:00:00Z", "2024-02-01T00:00:00Z", "2024-03-01T00:00:00Z", 29 * 24 * time.Hour},
		{CalendarMonth, 1, "UTC", "2023-02-28T23:59:59.999999999Z", "2023-02-01T00:00:00Z", "2023-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{CalendarMonth, 1, "UTC", "2100-02-10T00:00:00Z", "2100-02-01T00:00:00Z", "2100-03-01T00:00:00Z", 28 * 24 * time.Hour},
		{CalendarMonth, 1, "UTC", "2024-12-31T23:59:59Z", "2024-12-01T00:00:00Z", "2025-01-01T00:00:00Z", 31 * 24 * time.Hour},
		{CalendarMonth, 1, "Europe/Berlin", "2024-03-31T22:30:00Z", "2024-04-01T00:00:00+02:00", "2024-05-01T00:00:00+02:00", 30 * 24 * time.Hour},
		{CalendarMonth, 1, "Europe/Berlin", "2024-03-15T00:00:00Z", "2024-03-01T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 31*24*time.Hour - time.Hour},
		{CalendarMonth, 1, "America/New_York", "2024-11-30T12:00:00Z", "2024-11-01T00:00:00-04:00", "2024-12-01T00:00:00-05:00", 30*24*time.Hour + time.Hour},
		{CalendarMonth, 3, "UTC", "2024-05-10T12:00:00Z", "2024-04-01T00:00:00Z", "2024-07-01T00:00:00Z", 91 * 24 * time.Hour},
		{CalendarMonth, 6, "Asia/Tokyo", "2024-12-31T15:00:00Z", "2025-01-01T00:00:00+09:00", "2025-07-01T00:00:00+09:00", 181 * 24 * time.Hour},
		{CalendarDay, 1, "Europe/Berlin", "2024-03-31T12:00:00Z", "2024-03-31T00:00:00+01:00", "2024-04-01T00:00:00+02:00", 23 * time.Hour},
		{CalendarDay, 1, "Europe/Berlin", "2024-10-27T12:00:00Z", "2024-10-27T00:00:00+02:00", "2024-10-28T00:00:00+01:00", 25 * time.Hour},
		{CalendarDay, 1, "Asia/Kolkata", "2024-10-27T18:29:59Z", "2024-10-27T00:00:00+05:30", "2024-10-28T00:00:00+05:30", 24 * time.Hour},
		{CalendarDay, 1, "Asia/Kolkata", "2024-10-27T18:30:00Z", "2024-10-28T00:00:00+05:30", "2024-10-29T00:00:00+05:30", 24 * time.Hour},
		{CalendarWeek, 1, "UTC", "2024-12-31T12:00:00Z", "2024-12-30T00:00:00Z", "2025-01-06T00:00:00Z", 7 * 24 * time.Hour},
		{CalendarWeek, 1, "UTC", "2024-01-07T23:59:59Z", "2024-01-01T00:00:00Z", "2024-01-08T00:00:00Z", 7 * 24 * time.Hour},
		{CalendarWeek, 1, "UTC", "1970-01-01T00:00:00Z", "1969-12-29T00:00:00Z", "1970-01-05T00:00:00Z", 7 * 24 * time.Hour},
		{CalendarWeek, 1, "Europe/Berlin", "2026-03-29T12:00:00Z", "2026-03-23T00:00:00+01:00", "2026-03-30T00:00:00+02:00", 7*24*time.Hour - time.Hour},
		{CalendarWeek, 1, "America/New_York", "2026-11-02T04:59:59Z", "2026-10-26T00:00:00-04:00", "2026-11-02T00:00:00-05:00", 7*24*time.Hour + time.Hour},
		{CalendarYear, 1, "America/New_York", "2024-05-10T12:00:00Z", "2024-01-01T00:00:00-05:00", "2025-01-01T00:00:00-05:00", 366 * 24 * time.Hour},
		// Past the zone's table of transitions, where ZoneBounds ends
		// a leap year a day early.
		{CalendarDay, 1, "Europe/Berlin", "2040-12-31T12:00:00Z", "2040-12-31T00:00:00+01:00", "2041-01-01T00:00:00+01:00", 24 * time.Hour},
		{CalendarMonth, 1, "America/Los_Angeles", "1970-01-01T00:00:00Z", "1969-12-01T00:00:00-08:00", "1970-01-01T00:00:00-08:00", 31 * 24 * time.Hour},
		// Santiago moves to summer time at midnight: 2024-09-08 00:00
		// does not exist, the day starts at 01:00 and lasts 23 hours.
		{CalendarDay, 1, "America/Santiago", "2024-09-08T12:00:00Z", "2024-09-08T01:00:00-03:00", "2024-09-09T00:00:00-03:00", 23 * time.Hour},
		{CalendarDay, 1, "America/Santiago", "2024-09-08T03:59:59Z", "2024-09-07T00:00:00-04:00", "2024-09-08T01:00:00-03:00", 24 * time.Hour},
		{CalendarMonth, 1, "America/Santiago", "2024-09-08T12:00:00Z", "2024-09-01T00:00:00-04:00", "2024-10-01T00:00:00-03:00", 30*24*time.Hour - time.Hour},
		// And back at midnight: 2024-04-07 00:00 -03 becomes 2024-04-06
		// 23:00 -04, so the first local midnight of the 7th is at -04.
		{CalendarDay, 1, "America/Santiago", "2024-04-07T03:30:00Z", "2024-04-06T00:00:00-03:00", "2024-04-07T00:00:00-04:00", 25 * time.Hour},
		// Havana falls back from 01:00 to 00:00: midnight comes twice,
		// the day starts at the first.
		{CalendarDay, 1, "America/Havana", "2024-11-03T05:30:00Z", "2024-11-03T00:00:00-04:00", "2024-11-04T00:00:00-05:00", 25 * time.Hour},
		// Samoa skipped 2011-12-30: that day is empty, the 29th ends
		// where the 31st starts.
		{CalendarDay, 1, "Pacific/Apia", "2011-12-30T09:59:59Z", "2011-12-29T00:00:00-10:00", "2011-12-31T00:00:00+14:00", 24 * time.Hour},
		{CalendarDay, 1, "Pacific/Apia", "2011-12-30T10:00:00Z", "2011-12-31T00:00:00+14:00", "2012-01-01T00:00:00+14:00", 24 * time.Hour},
		{CalendarMonth, 1, "Pacific/Apia", "2011-12-30T10:00:00Z", "2011-12-01T00:00:00-10:00", "2012-01-01T00:00:00+14:00", 30 * 24 * time.Hour},
	} {
		cal := mustCalendar(t, c.unit, c.months, c.zone)
		start, end := cal.Period(at(t, c.at))
		if start != at(t, c.start) || end != at(t, c.end) || time.Duration(end-start) != c.length {
			loc := cal.Location()
			t.Errorf("%s at %s: [%s, %s) (%v), want [%s, %s) (%v)", cal, c.at,
				time.Unix(0, start).In(loc).Format(time.RFC3339), time.Unix(0, end).In(loc).Format(time.RFC3339), time.Duration(end-start),
				c.start, c.end, c.length)
		}
	}
}

func TestNewCalendar_Errors(t *testing.T) {
	for _, c := range []struct {
		unit   CalendarUnit
		months int
	}{{0, 1}, {CalendarYear + 1, 1}, {CalendarMonth, 0}, {CalendarMonth, 5}, {CalendarMonth, 24}, {CalendarDay, 2}, {CalendarYear, 2}} {
		if _, err := NewCalendar(c.unit, c.months, nil); err == nil {
			t.Errorf("NewCalendar(%v, %d) accepted", c.unit, c.months)
		}
	}
	c, err := NewCalendar(CalendarMonth, 4, nil)
	if err != nil || c.Location() != time.UTC || c.String() != "4 calendar months (UTC)" || c.Nominal() != 120*24*time.Hour {
		t.Fatalf("NewCalendar(month, 4, nil) = %v, %v", c, err)
	}
}

// oracle computes calendar periods with time.Date, independently of
// Calendar. It is right only in zones whose changes of offset never touch
// midnight.
type oracle struct {
	unit   CalendarUnit
	months int
	loc    *time.Location
}

var zeroDay = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC).Unix()

// index numbers the period holding t as Calendar does.
func (o oracle) index(t int64) int64 {
	lt := time.Unix(0, t).In(o.loc)
	y, m, d := lt.Date()
	days := (time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() - zeroDay) / 86400
	switch o.unit {
	case CalendarDay:
		return days
	case CalendarWeek:
		return days / 7
	case CalendarMonth:
		return (int64(y)*12 + int64(m) - 1) / int64(o.months)
	}
	return int64(y)
}

// start is when period k starts.
func (o oracle) start(k int64) int64 {
	switch o.unit {
	case CalendarDay:
		return time.Date(1, 1, 1+int(k), 0, 0, 0, 0, o.loc).UnixNano()
	case CalendarWeek:
		return time.Date(1, 1, 1+7*int(k), 0, 0, 0, 0, o.loc).UnixNano()
	case CalendarMonth:
		return time.Date(0, time.Month(1+int(k)*o.months), 1, 0, 0, 0, 0, o.loc).UnixNano()
	}
	return time.Date(int(k), 1, 1, 0, 0, 0, 0, o.loc).UnixNano()
}

// oracleZones change their offsets away from midnight (since 1970).
var oracleZones = []string{"UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe", "Pacific/Chatham", "Australia/Sydney"}

// TestCalendar_MatchesTimeDate compares Calendar with time.Date over
// random instants from 1970 to 2200, in zones where time.Date is exact.
func TestCalendar_MatchesTimeDate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, zone := range oracleZones {
		for _, u := range []struct {
			unit   CalendarUnit
			months int
		}{{CalendarDay, 1}, {CalendarWeek, 1}, {CalendarMonth, 1}, {CalendarMonth, 3}, {CalendarMonth, 12}, {CalendarYear, 1}} {
			c := mustCalendar(t, u.unit, u.months, zone)
			o := oracle{u.unit, u.months, c.Location()}
			for range 2000 {
				ts := rng.Int64N(at(t, "2200-01-01T00:00:00Z"))
				k := o.index(ts)
				start, end := c.Period(ts)
				if start != o.start(k) || end != o.start(k+1) || start > ts || ts >= end {
					t.Fatalf("%s at %s: [%d, %d), time.Date says [%d, %d)", c, time.Unix(0, ts).UTC(), start, end, o.start(k), o.start(k+1))
				}
			}
		}
	}
}

// TestCalendar_Concurrent: callers on both sides of period boundaries
// share one Calendar (whose remembered span flips between them) and all
// get the periods a fresh Calendar computes.
func TestCalendar_Concurrent(t *testing.T) {
	c := mustCalendar(t, CalendarDay, 1, "Europe/Berlin")
	var nows []int64
	for d := range 4 {
		b := at(t, "2024-03-30T23:00:00Z") + int64(d)*int64(23*time.Hour)
		nows = append(nows, b-1, b, b+1)
	}
	want := map[int64][2]int64{}
	for _, n := range nows {
		s, e := mustCalendar(t, CalendarDay, 1, "Europe/Berlin").Period(n)
		want[n] = [2]int64{s, e}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				n := nows[(g*7+i)%len(nows)]
				if s, e := c.Period(n); [2]int64{s, e} != want[n] {
					t.Errorf("Period(%d) = [%d, %d), want %v", n, s, e, want[n])
					return
				}
			}
		})
	}
	wg.Wait()
}

func mustCalendarWindow(t testing.TB, limit uint64, c *Calendar) *Rule {
	t.Helper()
	r, err := NewCalendarWindow(limit, c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func mustCalendarSliding(t testing.TB, limit uint64, c *Calendar) *Rule {
	t.Helper()
	r, err := NewCalendarSliding(limit, c)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A calendar month in Berlin: February 2024 has 29 days, March ends an
// hour early (summer time), the reset is exact to the nanosecond.
func TestCalendarWindow_FebToMarBerlin(t *testing.T) {
	r := mustCalendarWindow(t, 3, mustCalendar(t, CalendarMonth, 1, "Europe/Berlin"))
	if r.Period() != 30*24*time.Hour || r.String() != "fixed_window 3 per calendar month (Europe/Berlin)" {
		t.Fatalf("rule %v, period %v", r, r.Period())
	}
	t0 := at(t, "2024-02-01T00:00:00+01:00")
	const day = 24 * time.Hour
	runSteps(t, r, t0, []step{
		{"Feb 1, 00:00", 0, 2, ok(3, 1, 29*day)},
		{"Feb 29, 23:59:59", 29*day - time.Second, 1, ok(3, 0, time.Second)},
		{"Feb 29, last ns", 29*day - 1, 1, deny(3, 0, 1, 1)},
		{"Mar 1, 00:00 Berlin", 29 * day, 3, ok(3, 0, 31*day-time.Hour)},
		{"Mar 31, 23:59 (summer time)", 29*day + 31*day - time.Hour - time.Minute, 1, deny(3, 0, time.Minute, time.Minute)},
		{"Apr 1", 29*day + 31*day - time.Hour, 1, ok(3, 2, 30*day)},
		{"clock back to March counts in April", 40 * day, 0, ok(3, 2, 30*day+(29*day+31*day-time.Hour-40*day))},
	})
}

// The ISO week starts on Monday at local midnight, across a new year.
func TestCalendarWindow_ISOWeek(t *testing.T) {
	r := mustCalendarWindow(t, 1, mustCalendar(t, CalendarWeek, 1, "America/New_York"))
	mon := at(t, "2024-12-30T00:00:00-05:00")
	runSteps(t, r, mon, []step{
		{"Sunday's last second", -time.Second, 1, ok(1, 0, time.Second)},
		{"Monday 00:00 is a new week", 0, 1, ok(1, 0, 7*24*time.Hour)},
		{"Jan 1 is the same week", 2 * 24 * time.Hour, 1, deny(1, 0, 5*24*time.Hour, 5*24*time.Hour)},
	})
}

// A sliding window of 4 per calendar month in UTC counts in 8 buckets per
// month: of 3.5 days in February 2023, of 3.875 days in March.
func TestCalendarSliding_MonthBuckets(t *testing.T) {
	r := mustCalendarSliding(t, 4, mustCalendar(t, CalendarMonth, 1, "UTC"))
	if g, _, _ := r.Buckets(); g != 8 {
		t.Fatalf("G = %d, want 8", g)
	}
	feb := at(t, "2023-02-01T00:00:00Z")
	const day = 24 * time.Hour
	const fb, mb = 84 * time.Hour, 93 * time.Hour // February's and March's buckets
	runSteps(t, r, feb, []step{
		// Feb bucket 1 leaves when March's bucket 2 starts (9 later).
		{"Feb, bucket 1", fb, 1, ok(4, 3, 28*day+2*mb-fb)},
		{"Feb, bucket 7", 7 * fb, 3, ok(4, 0, 28*day+2*mb-7*fb)},
		{"Mar 1 still counts February", 28 * day, 1, deny(4, 0, 2*mb, 2*mb)},
		// Feb bucket 7 leaves when April starts.
		{"Mar bucket 2", 28*day + 2*mb, 1, ok(4, 0, 6*mb)},
		{"Mar 31, last ns", 59*day - 1, 1, deny(4, 0, 1, 1)},
		// Mar bucket 2 leaves when April's bucket 3 starts (90 h each).
		{"Apr 1", 59 * day, 3, ok(4, 0, 3*90*time.Hour)},
		{"clock back a day counts in April: one more does not fit", 58 * day, 1, deny(4, 0, 3*90*time.Hour+day, 3*90*time.Hour+day)},
		{"a check there: at the limit, allowed", 58 * day, 0, ok(4, 0, 3*90*time.Hour+day)},
	})
}

// The calendar fuzz targets count in the oracle's zones, from instants
// next to changes of offset and of month, with steps of calendar sizes.

var calendarUnits = [...]struct {
	unit   CalendarUnit
	months int
}{{CalendarDay, 1}, {CalendarWeek, 1}, {CalendarMonth, 1}, {CalendarMonth, 3}, {CalendarYear, 1}}

var calendarStarts = [...]string{"2024-03-30T22:00:00Z", "2024-10-26T12:00:00Z", "2024-02-28T12:00:00Z",
	"2023-12-31T12:00:00Z", "2026-11-01T05:59:59Z", "2024-04-06T14:00:00Z"}

const day = 24 * time.Hour

var calendarSteps = [...]time.Duration{0, 0, 1, time.Second, time.Minute, time.Hour, 6 * time.Hour, 23 * time.Hour,
	day, 25 * time.Hour, 3 * day, 7 * day, 29 * day, 31 * day, -time.Hour, -1}

// fuzzCalendar picks a calendar, its oracle and a start from fuzz bytes.
func fuzzCalendar(t *testing.T, unit, zone, start byte) (*Calendar, oracle, int64) {
	u := calendarUnits[int(unit)%len(calendarUnits)]
	c := mustCalendar(t, u.unit, u.months, oracleZones[int(zone)%len(oracleZones)])
	return c, oracle{u.unit, u.months, c.Location()}, at(t, calendarStarts[int(start)%len(calendarStarts)])
}

// FuzzCalendarWindow checks every decision of a calendar fixed window
// against a model that takes the window's end from time.Date: the reset
// is exact, a window never grants more than the limit.
func FuzzCalendarWindow(f *testing.F) {
	f.Add(uint64(3), byte(2), byte(1), byte(0), []byte{0, 1, 0, 8, 3, 0, 11, 1, 0, 15, 250, 1, 12, 2, 0})
	f.Add(uint64(1), byte(0), byte(2), byte(4), []byte{5, 1, 0, 5, 1, 0, 14, 1, 0, 7, 1, 0, 6, 0, 0})
	f.Add(uint64(0), byte(1), byte(0), byte(3), []byte{0, 0, 0, 10, 1, 0})
	f.Add(uint64(MaxFixedWindowLimit), byte(4), byte(6), byte(2), []byte{0, 250, 0, 13, 252, 1, 13, 254, 0})
	f.Fuzz(func(t *testing.T, limit uint64, unit, zone, start byte, prog []byte) {
		c, o, now := fuzzCalendar(t, unit, zone, start)
		r, err := NewCalendarWindow(limit, c)
		if err != nil {
			t.Skip()
		}
		var s State
		var mEnd, mCount uint64 // the model's window end (s) and count
		for i := 0; i+2 < len(prog); i += 3 {
			now += int64(calendarSteps[prog[i]%byte(len(calendarSteps))])
			cost := fuzzCost(prog[i+1], limit)
			end := max(uint64(o.start(o.index(now)+1))/nsPerSec, mEnd)
			count := uint64(0)
			if end == mEnd {
				count = mCount
			}
			want := Decision{Limit: limit, ResetAfter: time.Duration(end*nsPerSec - uint64(now))}
			switch {
			case count <= limit && cost <= limit-count:
				want.Allowed = true
				if cost > 0 {
					count += cost
					mEnd, mCount = end, count
				}
			case cost > limit:
				want.RetryAfter = Never
			default:
				want.RetryAfter = want.ResetAfter
			}
			if count < limit {
				want.Remaining = limit - count
			}
			s0 := s
			var d Decision
			s, d = TakeWindow(s, r, now, cost)
			if d != want {
				t.Fatalf("op %d: TakeWindow(%#x, %s, %d) = %+v, model %+v", i/3, s0, time.Unix(0, now).In(o.loc), cost, d, want)
			}
			if d.Allowed && cost > 0 && prog[i+2]&1 == 1 {
				s = Rollback(s, s, r, now, cost)
				mCount -= cost
			}
			if windowCount(s, mEnd) != mCount || mCount > limit {
				t.Fatalf("op %d: state %#x, model %d in the window ending %d", i/3, s, mCount, mEnd)
			}
		}
	})
}

// FuzzCalendarSliding checks every decision of a calendar sliding window
// against an unpacked model whose buckets come from time.Date, and the
// guarantee: at every admitted hit (placed at its instant, or at the start
// of the later bucket it counted in when the clock had stepped back),
// the hits since the same share of the previous period, and so the hits of
// the last span as long as the shorter of those two periods, are at most
// the limit.
func FuzzCalendarSliding(f *testing.F) {
	f.Add(uint64(4), byte(2), byte(1), byte(0), []byte{0, 1, 0, 8, 3, 0, 11, 1, 0, 12, 250, 1, 11, 2, 0})
	f.Add(uint64(10), byte(0), byte(2), byte(4), []byte{5, 4, 0, 5, 4, 0, 7, 5, 0, 6, 5, 0, 14, 1, 0, 9, 9, 0})
	f.Add(uint64(0), byte(1), byte(0), byte(3), []byte{0, 0, 0, 10, 1, 0})
	f.Add(uint64(MaxSlidingWindowLimit), byte(4), byte(6), byte(2), []byte{0, 250, 0, 13, 254, 1, 13, 252, 0})
	f.Add(uint64(100), byte(3), byte(3), byte(5), []byte{11, 60, 0, 12, 60, 0, 11, 40, 0, 15, 1, 0})
	f.Fuzz(func(t *testing.T, limit uint64, unit, zone, start byte, prog []byte) {
		c, o, now := fuzzCalendar(t, unit, zone, start)
		r, err := NewCalendarSliding(limit, c)
		if err != nil || len(prog) > 3*200 {
			t.Skip() // (the window check is cubic in the program's length)
		}
		m := &slidingModel{r: r, counts: map[uint64]uint64{}, cal: &o}
		bucketStart := func(i uint64) uint64 { at, _ := m.start(i); return at }
		var s State
		type hit struct {
			at   uint64
			cost uint64
		}
		var admitted []hit
		for i := 0; i+2 < len(prog); i += 3 {
			now += int64(calendarSteps[prog[i]%byte(len(calendarSteps))])
			cost := fuzzCost(prog[i+1], limit)
			s0 := s
			var d Decision
			s, d = TakeSliding(s, r, now, cost)
			if want := m.take(now, cost); d != want {
				t.Fatalf("op %d: TakeSliding(%#x, %s, %d) = %+v, model %+v", i/3, s0, time.Unix(0, now).In(o.loc), cost, d, want)
			}
			if !d.Allowed && s != s0 {
				t.Fatalf("op %d: a denial consumed", i/3)
			}
			if !d.Allowed || cost == 0 {
				continue
			}
			if prog[i+2]&1 == 1 {
				s = Rollback(s, s, r, now, cost)
				m.counts[m.n] -= cost
				continue
			}
			admitted = append(admitted, hit{max(uint64(now), bucketStart(m.n)), cost})
			for _, x := range admitted {
				k := o.index(int64(x.at))
				span := uint64(min(o.start(k)-o.start(k-1), o.start(k+1)-o.start(k)))
				from := bucketStart(m.bucket(x.at) - r.g)
				var since, last uint64
				for _, h := range admitted {
					if h.at <= x.at && h.at >= from {
						since += h.cost
					}
					if h.at <= x.at && h.at > x.at-span {
						last += h.cost
					}
				}
				if since > limit || last > limit {
					t.Fatalf("op %d: at %s, %d admitted since %s, %d in the last %v; limit %d", i/3,
						time.Unix(0, int64(x.at)).In(o.loc), since, time.Unix(0, int64(from)).In(o.loc), last, time.Duration(span), limit)
				}
			}
		}
	})
}

// TestCalendar_Allocations: once a calendar knows the period, takes on it
// allocate nothing.
func TestCalendar_Allocations(t *testing.T) {
	c := mustCalendar(t, CalendarMonth, 1, "Europe/Berlin")
	w, sw := mustCalendarWindow(t, 10, c), mustCalendarSliding(t, 10, c)
	now := at(t, "2024-03-15T12:00:00Z")
	var s State
	if n := testing.AllocsPerRun(100, func() {
		Take(State{}, w, now, 1) // a fresh key: the window's end is looked up
		s, _ = Take(s, sw, now, 1)
		s = Rollback(s, s, sw, now, 1)
	}); n != 0 {
		t.Fatalf("%v allocations per take", n)
	}
}

// TestCalendar_OffsetChangesApart pins what reach assumes: no zone of the
// host's database changes its offset twice within changeStep, from 1970
// to the end of the zones' tables (2037), where ZoneBounds is exact.
func TestCalendar_OffsetChangesApart(t *testing.T) {
	const dir = "/usr/share/zoneinfo"
	var zones []string
	filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		name, _ := filepath.Rel(dir, p)
		switch {
		case err != nil || e.IsDir() && (name == "posix" || name == "right"):
			return filepath.SkipDir
		case !e.IsDir() && !strings.Contains(name, "."):
			zones = append(zones, name)
		}
		return nil
	})
	if len(zones) == 0 {
		t.Skip("no zone database in " + dir)
	}
	from, until := at(t, "1970-01-01T00:00:00Z")/1e9, at(t, "2037-01-01T00:00:00Z")/1e9
	checked := 0
	for _, name := range zones {
		loc, err := time.LoadLocation(name)
		if err != nil {
			continue // not a zone file
		}
		checked++
		last := int64(math.MinInt64 / 2)
		_, off := time.Unix(from, 0).In(loc).Zone()
		for s := from; s < until; {
			_, end := time.Unix(s, 0).In(loc).ZoneBounds()
			if end.IsZero() {
				break
			}
			s = max(end.Unix(), s+1)
			if _, o := time.Unix(s, 0).In(loc).Zone(); o != off {
				if s-last < changeStep {
					t.Errorf("%s changes its offset at %v, %v after the last change", name, time.Unix(s, 0).UTC(), time.Duration(s-last)*time.Second)
				}
				last, off = s, o
			}
		}
	}
	if checked < 300 {
		t.Fatalf("only %d zones in %s", checked, dir)
	}
}
