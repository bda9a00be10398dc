package config

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
)

func TestLoad_Calendar(t *testing.T) {
	tbl := mustCompile(t, `
domain: b
descriptors:
  - key: berlin
    rate_limit: {unit: month, requests_per_unit: 1000000, calendar: true, time_zone: Europe/Berlin}
  - key: berlin_too
    rate_limit: {unit: month, requests_per_unit: 5, calendar: true, time_zone: Europe/Berlin}
  - key: quarter
    rate_limit: {unit: month, unit_multiplier: 3, requests_per_unit: 10, algorithm: sliding_window, calendar: true}
  - key: kolkata
    rate_limit: {unit: day, requests_per_unit: 7, calendar: true, time_zone: Asia/Kolkata}
  - key: week
    rate_limit: {unit: WEEK, requests_per_unit: 7, calendar: on}
  - key: thirty_days
    rate_limit: {unit: month, requests_per_unit: 1000000}
  - key: off
    rate_limit: {unit: month, requests_per_unit: 3, calendar: false}
`)
	cases := []struct {
		key    string
		alg    store.Algorithm
		zone   string
		suffix string
		str    string
	}{
		{"berlin", store.FixedWindow, "Europe/Berlin", "|fw:month@Europe/Berlin", "b.berlin: 1000000/calendar month (Europe/Berlin) fixed_window"},
		{"quarter", store.SlidingWindow, "UTC", "|sw:10/3month@UTC", "b.quarter: 10/3 calendar months (UTC) sliding_window"},
		{"kolkata", store.FixedWindow, "Asia/Kolkata", "|fw:day@Asia/Kolkata", "b.kolkata: 7/calendar day (Asia/Kolkata) fixed_window"},
		{"week", store.FixedWindow, "UTC", "|fw:week@UTC", "b.week: 7/calendar week (UTC) fixed_window"},
		{"thirty_days", store.FixedWindow, "", "|fw:2592000s", "b.thirty_days: 1000000/month fixed_window"},
		{"off", store.FixedWindow, "", "|fw:2592000s", "b.off: 3/month fixed_window"},
	}
	for _, c := range cases {
		r, key := tbl.Match("b", entries(c.key+"=x"), nil)
		if r == nil {
			t.Errorf("%s: no rule", c.key)
			continue
		}
		if r.Algorithm != c.alg || r.Limit.Algorithm() != c.alg || !strings.HasSuffix(string(key), c.suffix) || r.String() != c.str {
			t.Errorf("%s: %v, key %q, String %q; want %v, key ending %q, %q", c.key, r.Algorithm, key, r, c.alg, c.suffix, c.str)
		}
		cal := r.Limit.Calendar()
		switch {
		case c.zone == "" && (r.Calendar || r.TimeZone != nil || cal != nil):
			t.Errorf("%s: calendar %v %v %v, want none", c.key, r.Calendar, r.TimeZone, cal)
		case c.zone != "" && (!r.Calendar || r.TimeZone.String() != c.zone || cal == nil || cal.Location() != r.TimeZone):
			t.Errorf("%s: calendar %v %v %v, want one in %s", c.key, r.Calendar, r.TimeZone, cal, c.zone)
		}
		if r.Period() != r.Limit.Period() {
			t.Errorf("%s: period %v, store %v", c.key, r.Period(), r.Limit.Period())
		}
	}
	// Rules of one calendar share it (and what it remembers).
	a, _ := tbl.Match("b", entries("berlin=x"), nil)
	b, _ := tbl.Match("b", entries("berlin_too=x"), nil)
	if a.Limit.Calendar() != b.Limit.Calendar() {
		t.Error("two rules of the Berlin month have calendars of their own")
	}
	// The compiled rule counts calendar months: Feb 2024 in Berlin ends
	// on Mar 1 at 00:00 +01.
	now := time.Date(2024, 2, 29, 12, 0, 0, 0, time.UTC).UnixNano()
	if _, d := store.Take(store.State{}, a.Limit, now, 1); !d.Allowed || d.ResetAfter != 11*time.Hour {
		t.Errorf("Feb 29, 12:00 UTC in Berlin: %+v, want the window to end in 11 h", d)
	}
	want := "b.berlin: unit=MONTH requests_per_unit=1000000, shadow_mode: false, quota_mode: false, calendar: true, time_zone: Europe/Berlin\n" +
		"b.berlin_too: unit=MONTH requests_per_unit=5, shadow_mode: false, quota_mode: false, calendar: true, time_zone: Europe/Berlin\n" +
		"b.quarter: unit=MONTH requests_per_unit=10, shadow_mode: false, quota_mode: false, unit_multiplier: 3, calendar: true, time_zone: UTC, algorithm: sliding_window\n" +
		"b.kolkata: unit=DAY requests_per_unit=7, shadow_mode: false, quota_mode: false, calendar: true, time_zone: Asia/Kolkata\n" +
		"b.week: unit=WEEK requests_per_unit=7, shadow_mode: false, quota_mode: false, calendar: true, time_zone: UTC\n" +
		"b.thirty_days: unit=MONTH requests_per_unit=1000000, shadow_mode: false, quota_mode: false\n" +
		"b.off: unit=MONTH requests_per_unit=3, shadow_mode: false, quota_mode: false\n"
	if got := tbl.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
}

// TestLoad_CalendarKeysDiffer: turning calendar on or off, or moving it to
// another zone, never counts in the old counter.
func TestLoad_CalendarKeysDiffer(t *testing.T) {
	keys := map[string]string{}
	for _, limit := range []string{
		"{unit: month, requests_per_unit: 5}",
		"{unit: month, requests_per_unit: 5, calendar: true}",
		"{unit: month, requests_per_unit: 5, calendar: true, time_zone: Europe/Berlin}",
		"{unit: month, requests_per_unit: 5, calendar: true, time_zone: Europe/Paris}",
		"{unit: month, requests_per_unit: 5, calendar: true, unit_multiplier: 12}",
		"{unit: year, requests_per_unit: 5, calendar: true}",
		"{unit: day, requests_per_unit: 5, calendar: true}",
		"{unit: day, requests_per_unit: 5}",
		"{unit: month, requests_per_unit: 5, calendar: true, algorithm: sliding_window}",
	} {
		tbl := mustCompile(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: "+limit+"\n")
		_, key := tbl.Match("d", entries("k=v"), nil)
		if prev, dup := keys[string(key)]; dup {
			t.Errorf("%s and %s count in one key %q", prev, limit, key)
		}
		keys[string(key)] = limit
	}
}
