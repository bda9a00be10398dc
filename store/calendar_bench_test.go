package store

import "testing"

var benchSink uint64

// BenchmarkCalendar measures what a calendar costs a take: a fixed
// window's fresh state (the window's end is looked up: epoch arithmetic,
// or the period the calendar remembers), a sliding window's take (its
// bucket is looked up on every take), and the lookup of a period the
// calendar does not remember (alternating between two months: the
// time-zone arithmetic itself).
func BenchmarkCalendar(b *testing.B) {
	berlin := mustCalendar(b, CalendarMonth, 1, "Europe/Berlin")
	now := at(b, "2024-03-15T12:00:00Z")
	for _, c := range []struct {
		name string
		r    *Rule
	}{
		{"fixed_window/epoch", mustWindow(b, MaxFixedWindowLimit, 30*day)},
		{"fixed_window/calendar", mustCalendarWindow(b, MaxFixedWindowLimit, berlin)},
	} {
		b.Run(c.name+"/fresh", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s, _ := TakeWindow(State{}, c.r, now, 1)
				benchSink += s.Word
			}
		})
	}
	for _, c := range []struct {
		name string
		r    *Rule
	}{
		{"sliding_window/epoch", mustSliding(b, 7, 30*day)},
		{"sliding_window/calendar", mustCalendarSliding(b, 7, berlin)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			var s State
			for b.Loop() {
				s, _ = TakeSliding(s, c.r, now, 1)
				s = Rollback(s, s, c.r, now, 1)
			}
			benchSink += s.Word
		})
	}
	b.Run("period_lookup", func(b *testing.B) {
		c := mustCalendar(b, CalendarMonth, 1, "Europe/Berlin")
		nows := [2]int64{now, at(b, "2024-04-15T12:00:00Z")}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			s, _ := c.Period(nows[i&1])
			benchSink += uint64(s)
			i++
		}
	})
}
