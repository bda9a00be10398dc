//go:build !unix

package cputime

import "time"

// Process is unknown on this platform: it reports zero.
func Process() time.Duration { return 0 }
