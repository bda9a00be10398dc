package config

import (
	"fmt"
	"strings"
	"time"
)

// Unit is a rate limit's time unit. Its numbering equals Envoy's
// envoy.type.v3.RateLimitUnit and RateLimitResponse.RateLimit.Unit, so
// protocol code converts with a cast.
type Unit int32

// The units of the limits file format.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var unitNames = [...]string{"unknown", "second", "minute", "hour", "day", "month", "year", "week"}

var unitSeconds = [...]int64{0, 1, 60, 3600, 86400, 30 * 86400, 365 * 86400, 7 * 86400}

// Duration is the unit's window: a month is 30 days, a year 365 days and a
// week 7 days, as in envoyproxy/ratelimit. It is 0 for UnitUnknown and
// for values outside the enumeration.
func (u Unit) Duration() time.Duration {
	if u < 0 || int(u) >= len(unitSeconds) {
		return 0
	}
	return time.Duration(unitSeconds[u]) * time.Second
}

// String returns the unit as limits files spell it: "second", "minute", ...
func (u Unit) String() string {
	if u < 0 || int(u) >= len(unitNames) {
		return fmt.Sprintf("Unit(%d)", int32(u))
	}
	return unitNames[u]
}

// ParseUnit parses a unit name, ignoring case as envoyproxy/ratelimit does.
// "unknown" is not a unit.
func ParseUnit(s string) (Unit, error) {
	for u := Second; int(u) < len(unitNames); u++ {
		if strings.EqualFold(s, unitNames[u]) {
			return u, nil
		}
	}
	return UnitUnknown, fmt.Errorf("unknown unit %q (want second, minute, hour, day, week, month or year)", s)
}
