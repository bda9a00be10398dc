package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version and commit are set at link time; `make release` and `make
// image` stamp them:
// -ldflags "-X main.version=v1.2.3 -X main.commit=<full commit hash>".
var (
	version = ""
	commit  = ""
)

func init() {
	register(command{name: "version", summary: "print version, commit and Go version", run: runVersion})
}

// stamp returns the version and commit to report: the ones set at link
// time, else what the Go toolchain recorded in bi (the module version of
// `go install github.com/sluicehq/sluice/cmd/sluice@v1.2.3`; the tag or
// pseudo-version and the VCS revision of a build in a clone), else "dev"
// and "unknown".
func stamp(linkVersion, linkCommit string, bi *debug.BuildInfo) (v, c string) {
	v, c = linkVersion, linkCommit
	if bi != nil {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			if c == "" && s.Key == "vcs.revision" {
				c = s.Value
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if c == "" {
		c = "unknown"
	}
	return v, c
}

func buildStamp() (v, c string) {
	bi, _ := debug.ReadBuildInfo()
	return stamp(version, commit, bi)
}

// buildVersion returns the version this binary reports (see stamp).
func buildVersion() string {
	v, _ := buildStamp()
	return v
}

// buildCommit returns the commit this binary reports (see stamp).
func buildCommit() string {
	_, c := buildStamp()
	return c
}

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) int {
	v, c := buildStamp()
	fmt.Fprintf(stdout, "sluice %s (commit %s, %s)\n", v, c, runtime.Version())
	return 0
}
