package config

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/errors")

// TestLoad_ErrorsGolden loads each testdata/errors/*.yaml and compares the
// error text with the .golden file next to it.
func TestLoad_ErrorsGolden(t *testing.T) {
	files, err := filepath.Glob("testdata/errors/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files: %v", err)
	}
	files = append(files, "testdata/dupdomain")
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			tbl, err := Load(file, Options{})
			if err == nil {
				t.Fatalf("Load(%s) = %v, want an error", file, tbl)
			}
			var es *Errors
			if !errors.As(err, &es) {
				t.Fatalf("Load(%s) error %T %v, want Errors", file, err, err)
			}
			matchGolden(t, file, err.Error()+"\n", "TestLoad_ErrorsGolden")
		})
	}
}

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, text := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const apiYAML = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`

func TestLoad_ReadsOnlyLimitsFilesOfTheDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"api.yaml":           apiYAML,
		"web.yml":            "domain: web\ndescriptors: [{key: ip, rate_limit: {unit: second, requests_per_unit: 5}}]\n",
		".hidden.yaml":       "not: [valid",
		"notes.txt":          "not: [valid",
		"sub/deeper.yaml":    "not: [valid",
		"..2026/inner.yaml":  "not: [valid",
		"dir.yaml/inner.txt": "a directory named like a limits file",
	})
	if err := os.Symlink(filepath.Join(dir, "missing.yaml"), filepath.Join(dir, "dangling.yaml")); err != nil {
		t.Fatal(err)
	}
	tbl, err := Load(dir, Options{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got := strings.Join(tbl.Domains(), ","); got != "api,web" {
		t.Errorf("Domains() = %s, want api,web", got)
	}
	if len(tbl.Rules()) != 2 || !tbl.HasDomain("web") || tbl.HasDomain("sub") {
		t.Errorf("Rules() = %v, HasDomain(web) = %t, HasDomain(sub) = %t", tbl.Rules(), tbl.HasDomain("web"), tbl.HasDomain("sub"))
	}
	r := tbl.Rules()[0]
	if r.File != filepath.Join(dir, "api.yaml") || r.Line != 4 || r.Domain != "api" || r.Path != "user" {
		t.Errorf("rule %v defined at %s:%d, want %s:4", r, r.File, r.Line, filepath.Join(dir, "api.yaml"))
	}
}

func TestLoad_EmptyDirectory(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"README.md": "no limits here", "sub/x.yaml": apiYAML})
	_, err := Load(dir, Options{})
	if !errors.Is(err, ErrEmpty) {
		t.Fatalf("Load(empty dir) = %v, want ErrEmpty", err)
	}
	if _, err := Load(filepath.Join(dir, "nope"), Options{}); err == nil || errors.Is(err, ErrEmpty) {
		t.Errorf("Load(missing path) = %v, want a not-exist error", err)
	}
}

func TestLoad_SingleFile(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{"limits.conf": apiYAML})
	tbl, err := Load(filepath.Join(dir, "limits.conf"), Options{})
	if err != nil || !tbl.HasDomain("api") {
		t.Fatalf("Load(file) = %v, %v; want domain api", tbl, err)
	}
}

func TestLoad_MergeDomains(t *testing.T) {
	dir := t.TempDir()
	writeFiles(t, dir, map[string]string{
		"a.yaml": apiYAML,
		"b.yaml": "domain: api\ndescriptors: [{key: team, rate_limit: {unit: hour, requests_per_unit: 3}}]\n",
	})
	if _, err := Load(dir, Options{}); err == nil || !strings.Contains(err.Error(), "--merge-domains") {
		t.Fatalf("Load without merging = %v, want a duplicate-domain error", err)
	}
	tbl, err := Load(dir, Options{MergeDomains: true})
	if err != nil {
		t.Fatalf("Load with merging: %v", err)
	}
	if tbl.Files() != 2 {
		t.Errorf("Files() = %d, want 2", tbl.Files())
	}
	if r, _ := tbl.Match("api", entries("team=x"), nil); r == nil || r.RequestsPerUnit != 3 {
		t.Errorf("merged rule team = %v, want 3/hour", r)
	}
	if r, _ := tbl.Match("api", entries("user=x"), nil); r == nil || r.RequestsPerUnit != 10 {
		t.Errorf("merged rule user = %v, want 10/minute", r)
	}
	// The same descriptor in two merged files is a duplicate.
	writeFiles(t, dir, map[string]string{"c.yaml": apiYAML})
	_, err = Load(dir, Options{MergeDomains: true})
	if err == nil || !strings.Contains(err.Error(), "c.yaml:4: descriptors[0]: duplicate descriptor") {
		t.Errorf("Load with a duplicate across merged files = %v", err)
	}
}

func TestLoad_CompatibleSyntax(t *testing.T) {
	tbl := mustCompile(t, `
domain: compat
descriptors:
  - key: status
    value: 404           # a number is a string value, as with yaml.v2
    shadow_mode: yes     # YAML 1.1 booleans, as with yaml.v2
    quota_mode: on
    value_to_metric: true
    metadata: {owner: team-a}
    rate_limit: &per_second
      unit: SECOND       # units ignore case
      requests_per_unit: 1_000
  - key: hex
    rate_limit:
      <<: *per_second
      requests_per_unit: 0x10
  - key: weekly
    rate_limit: {unit: week, requests_per_unit: 7}
  - key: empty
    value:
    rate_limit:
`)
	cases := []struct {
		e     Entry
		rpu   uint64
		unit  Unit
		flags [3]bool // shadow, quota, value_to_metric
	}{
		{Entry{"status", "404"}, 1000, Second, [3]bool{true, true, true}},
		{Entry{"hex", "x"}, 16, Second, [3]bool{}},
		{Entry{"weekly", "x"}, 7, Week, [3]bool{}},
	}
	for _, c := range cases {
		r, _ := tbl.Match("compat", []Entry{c.e}, nil)
		if r == nil {
			t.Errorf("%v: no rule", c.e)
			continue
		}
		if r.RequestsPerUnit != c.rpu || r.Unit != c.unit || [3]bool{r.ShadowMode, r.QuotaMode, r.ValueToMetric} != c.flags {
			t.Errorf("%v: rule %v, want %d/%s flags %v", c.e, r, c.rpu, c.unit, c.flags)
		}
	}
	// A descriptor with a null rate_limit has no rule, as in the reference.
	if r, _ := tbl.Match("compat", entries("empty=x"), nil); r != nil {
		t.Errorf("empty: rule %v, want none", r)
	}
}

func TestTable_HashStringRules(t *testing.T) {
	a := mustCompile(t, apiYAML)
	b := mustCompile(t, apiYAML)
	c := mustCompile(t, strings.Replace(apiYAML, "10", "11", 1))
	if a.Hash() != b.Hash() || a.Hash() == c.Hash() || len(a.Hash()) != 64 {
		t.Errorf("hashes %s %s %s: want equal for equal files, different otherwise", a.Hash(), b.Hash(), c.Hash())
	}
	tbl := mustCompile(t, `
domain: s
descriptors:
  - key: a
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unlimited: true}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 5, algorithm: token_bucket, burst: 9}
`)
	want := "s.a: unit=MINUTE requests_per_unit=10, shadow_mode: true, quota_mode: false\n" +
		"s.b: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false, unlimited: true\n" +
		"s.c: unit=SECOND requests_per_unit=5, shadow_mode: false, quota_mode: false, algorithm: token_bucket, burst: 9\n"
	if got := tbl.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
	rules := tbl.Rules()
	rules[0] = nil // Rules returns a copy
	if tbl.Rules()[0] == nil {
		t.Error("Rules() exposes the table's own slice")
	}
}

// TestLoad_AliasBombIsBounded: aliases that double at every level would
// expand to 2^40 descriptors; Load stops at its budget with one error.
func TestLoad_AliasBombIsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: bomb\ndescriptors:\n  - key: k0\n    descriptors: &l0 [{key: leaf}]\n")
	for i := 1; i <= 40; i++ {
		fmt.Fprintf(&b, "  - key: k%d\n    descriptors: &l%d [{key: a, descriptors: *l%d}, {key: b, descriptors: *l%d}]\n", i, i, i-1, i-1)
	}
	_, err := compile([]source{{name: "bomb.yaml", data: []byte(b.String())}}, Options{}, nil)
	var es *Errors
	if !errors.As(err, &es) || len(es.List) != 1 || !strings.Contains(es.List[0].Msg, "aliases expand to too many descriptors") {
		t.Fatalf("Load(alias bomb) = %v, want one budget error", err)
	}
}

func TestLoad_SlidingWindowAndUnitMultiplier(t *testing.T) {
	tbl := mustCompile(t, `
domain: m
descriptors:
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 100, algorithm: sliding_window}
  - key: half_minute
    rate_limit: {unit: second, requests_per_unit: 10, unit_multiplier: 30}
  - key: sliding_5m
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: sliding_window, unit_multiplier: 5}
  - key: bucket
    rate_limit: {unit: minute, requests_per_unit: 3, algorithm: token_bucket, burst: 6, unit_multiplier: 10}
`)
	cases := []struct {
		key    string
		alg    store.Algorithm
		period time.Duration
		suffix string
		str    string
	}{
		{"sliding", store.SlidingWindow, time.Minute, "|sw:100/60s", "m.sliding: 100/minute sliding_window"},
		{"half_minute", store.FixedWindow, 30 * time.Second, "|fw:30s", "m.half_minute: 10/30*second fixed_window"},
		{"sliding_5m", store.SlidingWindow, 5 * time.Minute, "|sw:7/300s", "m.sliding_5m: 7/5*minute sliding_window"},
		{"bucket", store.TokenBucket, 10 * time.Minute, "|tb:3/600s:6", "m.bucket: 3/10*minute token_bucket burst 6"},
	}
	for _, c := range cases {
		r, key := tbl.Match("m", entries(c.key+"=x"), nil)
		if r == nil {
			t.Errorf("%s: no rule", c.key)
			continue
		}
		if r.Algorithm != c.alg || r.Limit.Algorithm() != c.alg || r.Period() != c.period || r.Limit.Period() != c.period {
			t.Errorf("%s: %v, period %v (store %v %v), want %v %v", c.key, r.Algorithm, r.Period(), r.Limit.Algorithm(), r.Limit.Period(), c.alg, c.period)
		}
		if !strings.HasSuffix(string(key), c.suffix) || r.String() != c.str {
			t.Errorf("%s: key %q, String %q; want key ending %q, %q", c.key, key, r, c.suffix, c.str)
		}
	}
	want := "m.sliding: unit=MINUTE requests_per_unit=100, shadow_mode: false, quota_mode: false, algorithm: sliding_window\n" +
		"m.half_minute: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false, unit_multiplier: 30\n" +
		"m.sliding_5m: unit=MINUTE requests_per_unit=7, shadow_mode: false, quota_mode: false, unit_multiplier: 5, algorithm: sliding_window\n" +
		"m.bucket: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false, unit_multiplier: 10, algorithm: token_bucket, burst: 6\n"
	if got := tbl.String(); got != want {
		t.Errorf("String() =\n%s\nwant\n%s", got, want)
	}
}

// Limits past 32 bits load from files up to 2^53, exactly.
func TestLoad_BigLimits(t *testing.T) {
	tbl := mustCompile(t, `
domain: budgets
descriptors:
  - key: dollars
    rate_limit: {unit: month, requests_per_unit: 100_000_000_000}
  - key: max
    rate_limit: {unit: year, requests_per_unit: 9007199254740992, algorithm: token_bucket, burst: 9007199254740992}
`)
	for _, c := range []struct {
		entry        Entry
		limit, burst uint64
	}{{Entry{"dollars", "a"}, 100_000_000_000, 100_000_000_000}, {Entry{"max", "a"}, 1 << 53, 1 << 53}} {
		r, _ := tbl.Match("budgets", []Entry{c.entry}, nil)
		if r == nil || r.RequestsPerUnit != c.limit || r.Burst != c.burst || r.Limit.Limit() != c.limit || r.Limit.Burst() != c.burst {
			t.Errorf("%v: rule %v, want %d burst %d", c.entry, r, c.limit, c.burst)
		}
	}
}

// matchGolden fails t unless got, the errors loading file answered, is
// the .golden file beside it (which -update rewrites); test names the
// test to run with -update.
func matchGolden(t *testing.T, file, got, test string) {
	t.Helper()
	golden := strings.TrimSuffix(file, ".yaml") + ".golden"
	if *update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test -run %s -update)", err, test)
	}
	if got != string(want) {
		t.Errorf("%s errors:\n%s\nwant:\n%s", file, got, want)
	}
}
