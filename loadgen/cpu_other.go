//go:build !unix

package loadgen

import "time"

// cpuTime is unknown on this platform: the result reports zero.
func cpuTime() time.Duration { return 0 }
