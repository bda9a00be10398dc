package main

import (
	"bytes"
	"context"
	"runtime"
	"runtime/debug"
	"testing"
)

// TestStamp: the values set at link time win; without them, the module
// version of `go install ...@v1.2.3` and the VCS revision of a build in a
// checkout; else dev and unknown.
func TestStamp(t *testing.T) {
	vcs := []debug.BuildSetting{{Key: "-trimpath", Value: "true"}, {Key: "vcs.revision", Value: "0123abcd"}}
	cases := []struct {
		name                    string
		linkVersion, linkCommit string
		bi                      *debug.BuildInfo
		wantVersion, wantCommit string
	}{
		{"link time", "v1.2.3", "feedface", &debug.BuildInfo{Main: debug.Module{Version: "v9.9.9"}, Settings: vcs}, "v1.2.3", "feedface"},
		{"go install", "", "", &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}}, "v1.4.0", "unknown"},
		{"checkout", "", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs}, "dev", "0123abcd"},
		{"version only at link time", "v1.2.3", "", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs}, "v1.2.3", "0123abcd"},
		{"no build info", "", "", nil, "dev", "unknown"},
	}
	for _, c := range cases {
		v, cm := stamp(c.linkVersion, c.linkCommit, c.bi)
		if v != c.wantVersion || cm != c.wantCommit {
			t.Errorf("%s: stamp = %q, %q, want %q, %q", c.name, v, cm, c.wantVersion, c.wantCommit)
		}
	}
}

// TestVersionCommand: `sluice version` prints one line, "sluice VERSION
// (commit COMMIT, GOVERSION)", which the release check and users parse.
func TestVersionCommand(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	version, commit = "v1.2.3", "0123456789abcdef0123456789abcdef01234567"
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"version"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	want := "sluice v1.2.3 (commit 0123456789abcdef0123456789abcdef01234567, " + runtime.Version() + ")\n"
	if stdout.String() != want {
		t.Errorf("stdout %q, want %q", stdout.String(), want)
	}
}
