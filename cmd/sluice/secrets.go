package main

import "github.com/sluicehq/sluice/internal/redact"

// flagSecrecy says how the value of serve's flag name is shown wherever
// Sluice shows a command line or a setting (the debug port's
// /debug/pprof/cmdline, logs, the status page, error messages): passwords
// and the xDS stream's headers (which carry tokens) masked, addresses and
// URLs without their passwords.
func flagSecrecy(name string) redact.Kind {
	switch name {
	case "redis-password", "redis-sentinel-password", "redis-persecond-password", "redis-persecond-sentinel-password", "xds-headers":
		return redact.Secret
	case "redis-url", "redis-sentinel", "redis-cluster", "redis-persecond-url", "redis-persecond-sentinel", "redis-persecond-cluster", "xds-server":
		return redact.Address
	}
	return redact.Plain
}

// shownValue is value of flag name as Sluice may show it.
func shownValue(name, value string) string {
	return redact.Args([]string{"", "--" + name, value}, flagSecrecy)[2]
}
