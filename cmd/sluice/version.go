package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version and commit are set at build time:
// -ldflags "-X main.version=v1.2.3 -X main.commit=abc123".
var (
	version = "dev"
	commit  = ""
)

func init() {
	register(command{name: "version", summary: "print version, commit and Go version", run: runVersion})
}

// buildCommit returns the commit set at link time, else the VCS revision
// the Go toolchain stamped, else "unknown".
func buildCommit() string {
	if commit != "" {
		return commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	fmt.Fprintf(stdout, "sluice %s (commit %s, %s)\n", version, buildCommit(), runtime.Version())
	return 0
}
