package store

import (
	"os/exec"
	"strings"
	"testing"
)

// module is this module's path.
const module = "github.com/sluicehq/sluice"

// TestImports_NothingAbove: store/ stays below every other package of
// Sluice. The packages under store/, their tests included, depend on no
// package of this module but store/ and internal/ ones, directly or
// through another: not config, quota, limiter, server, observe or cmd,
// nor a package added later above them. The graph is go list's for this
// platform, test files included.
func TestImports_NothingAbove(t *testing.T) {
	// Each package in the closure, then the packages it imports.
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", "{{.ImportPath}}{{range .Imports}}\t{{.}}{{end}}", "./...").Output()
	if err != nil {
		msg := err.Error()
		if e, ok := err.(*exec.ExitError); ok {
			msg += "\n" + string(e.Stderr)
		}
		t.Fatalf("go list: %s", msg)
	}
	seen, reported := 0, map[string]bool{}
	for line := range strings.Lines(string(out)) {
		ps := strings.Split(strings.TrimSuffix(line, "\n"), "\t")
		from := pkgPath(ps[0])
		if !mayBeImported(from) {
			continue // its importer is reported
		}
		if strings.HasPrefix(from, module+"/store") {
			seen++
		}
		if ps[0] != from {
			from += " (with its tests)"
		}
		for _, p := range ps[1:] {
			if to := pkgPath(p); !mayBeImported(to) && !reported[from+to] {
				reported[from+to] = true
				t.Errorf("%s imports %s: store/ and what it uses import nothing of this module but store/ and internal/", from, to)
			}
		}
	}
	if seen == 0 {
		t.Fatalf("go list listed no package of %s:\n%s", module, out)
	}
}

// pkgPath is a package's import path as go list -test prints it, without
// the test binary it is compiled for ("p [p.test]") and without the test
// suffixes (p.test, p_test).
func pkgPath(p string) string {
	p, _, _ = strings.Cut(p, " ")
	p = strings.TrimSuffix(p, ".test")
	return strings.TrimSuffix(p, "_test")
}

// mayBeImported reports whether a store package may depend on p: any
// package outside this module, or one under store/ or internal/.
func mayBeImported(p string) bool {
	rest, ok := strings.CutPrefix(p, module+"/")
	if !ok {
		return p != module
	}
	top, _, _ := strings.Cut(rest, "/")
	return top == "store" || top == "internal"
}
