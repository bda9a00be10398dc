package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVersionName names builds by what `sluice version` printed.
func TestVersionName(t *testing.T) {
	for _, tc := range []struct {
		line, want string
		ok         bool
	}{
		{"sluice 9e766e9 (commit 9e766e983c1af48990a915723ce6c8059d2410f6, go1.26.8)\n", "commit 9e766e9", true},
		{"sluice d75c127-dirty (commit d75c127f00d, go1.26.8)\n", "commit d75c127-dirty", true},
		{"sluice v1.2.0-3-g9e766e9 (commit 9e766e983c1a, go1.26.8)\n", "v1.2.0-3-g9e766e9", true},
		{"sluice v1.2.3 (commit 9e766e983c1a, go1.26.8)\n", "v1.2.3 (commit 9e766e9)", true},
		{"sluice v1.2.3 (commit unknown, go1.26.8)\n", "v1.2.3", true},
		{"sluice dev (commit 9e766e983c1a, go1.26.8)\n", "commit 9e766e9", true},
		{"sluice dev (commit abc, go1.26.8)", "commit abc", true},
		{"sluice dev (commit unknown, go1.26.8)\n", "", false},
		{"ratelimit 1.0\n", "", false},
		{"sluice v1 (commit", "", false},
		{"", "", false},
	} {
		got, ok := versionName(tc.line)
		if got != tc.want || ok != tc.ok {
			t.Errorf("versionName(%q) = %q, %v; want %q, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}

// FuzzVersionName: any output is either refused or named in one line
// that shows at most 7 digits of the commit.
func FuzzVersionName(f *testing.F) {
	f.Add("sluice 9e766e9 (commit 9e766e983c1af48990a915723ce6c8059d2410f6, go1.26.8)\n")
	f.Add("sluice v1.2.3 (commit unknown, go1.26.8)")
	f.Add("sluice dev (commit , go)")
	f.Add("sluice  (commit x, y)")
	f.Fuzz(func(t *testing.T, line string) {
		got, ok := versionName(line)
		if !ok {
			if got != "" {
				t.Errorf("versionName(%q) = %q, false; want no name", line, got)
			}
			return
		}
		if got == "" || strings.Contains(got, "\n") {
			t.Errorf("versionName(%q) = %q; want one non-empty line", line, got)
		}
	})
}

// TestBuildName names a binary whose `version` fails by its file.
func TestBuildName(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "sluice-before")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\nexit 2\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, want := buildName(bin), "`sluice-before`"; got != want {
		t.Errorf("buildName of a failing binary = %q, want %q", got, want)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho 'sluice 9e766e9 (commit 9e766e983c1a, go1.26.8)'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, want := buildName(bin), "commit 9e766e9"; got != want {
		t.Errorf("buildName = %q, want %q", got, want)
	}
}
