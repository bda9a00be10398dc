package sparse

import (
	"testing"
	"time"
)

// TestLog_Due walks lines through a step table of instants: one line per
// interval gets through, with the count of those held back since.
func TestLog_Due(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	l := Log{Every: 10 * time.Second}
	steps := []struct {
		at        time.Duration
		ok        bool
		wantQuiet int
	}{
		{0, true, 0}, // the first line
		{time.Second, false, 0},
		{9 * time.Second, false, 0},
		{10 * time.Second, true, 2}, // an interval after the last: the 2 held back
		{19*time.Second + 999*time.Millisecond, false, 0},
		{time.Minute, true, 1},
		{time.Minute - time.Second, false, 0}, // the clock went back: within the interval
	}
	for i, s := range steps {
		quiet, ok := l.Due(t0.Add(s.at))
		if ok != s.ok || quiet != s.wantQuiet {
			t.Errorf("step %d: Due(t0+%v) = %d, %v; want %d, %v", i, s.at, quiet, ok, s.wantQuiet, s.ok)
		}
	}
}
