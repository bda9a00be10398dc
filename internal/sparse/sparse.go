package sparse

import "time"

// Log lets a line through at most once per Every and counts the lines it
// holds back. Its zero value with Every set is ready. Not safe for
// concurrent use: callers that share one lock it.
type Log struct {
	Every time.Duration
	last  time.Time // of the last line let through
	quiet int       // lines held back since
}

// Due reports whether to log a line at now and, if so, how many lines
// were held back since the last one.
func (l *Log) Due(now time.Time) (quiet int, ok bool) {
	if !l.last.IsZero() && now.Sub(l.last) < l.Every {
		l.quiet++
		return 0, false
	}
	quiet = l.quiet
	l.last, l.quiet = now, 0
	return quiet, true
}
