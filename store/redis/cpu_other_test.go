//go:build !unix

package redis

import "time"

// cpuTime is unknown on this platform: cpu-µs/op reports zero.
func cpuTime() time.Duration { return 0 }
