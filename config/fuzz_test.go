package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// FuzzLoad checks that any file either compiles into a usable table or
// fails with errors that name the file and, except for YAML the parser
// cannot place and empty files, a line.
func FuzzLoad(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/errors/*.yaml")
	seeds = append(seeds, "../examples/bench.yaml")
	for _, s := range seeds {
		if data, err := os.ReadFile(s); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(apiYAML))
	f.Add([]byte(severalYAML))
	f.Fuzz(func(t *testing.T, data []byte) {
		tbl, err := compile([]source{{name: "f.yaml", data: data}}, Options{}, nil)
		if err != nil {
			checkPlaced(t, err, "f.yaml")
			return
		}
		_ = tbl.String()
		for _, r := range tbl.Rules() {
			if r.Limit == nil != r.Unlimited || r.suffix == "" || r.Line <= 0 || !tbl.HasDomain(r.Domain) {
				t.Errorf("rule %v: Limit %v, suffix %q, line %d", r, r.Limit, r.suffix, r.Line)
			}
			// The limits of one descriptor never share a counter.
			seen := map[string]bool{}
			for _, g := range r.Limits() {
				if seen[g.suffix] {
					t.Errorf("rule %v: two limits with key suffix %q", r, g.suffix)
				}
				seen[g.suffix] = true
			}
			if !seen[r.suffix] {
				t.Errorf("rule %v is not among its own Limits()", r)
			}
		}
	})
}

// spec is a descriptor of the fixture FuzzMatch checks Match against.
type spec struct {
	key, value string
	limit      int // 0: no rate_limit
	share      bool
	children   []spec
}

var fuzzSpecs = []spec{
	{key: "a", limit: 1},
	{key: "a", value: "x", limit: 2},
	{key: "a", value: "x*", limit: 3},
	{key: "a", value: "*y", limit: 4, share: true},
	{key: "a", value: "p*q*r", limit: 5},
	{key: "b", value: "*", children: []spec{
		{key: "c", limit: 6},
		{key: "c", value: "z", limit: 7, children: []spec{{key: "d", value: "*", limit: 8}}},
	}},
	{key: "b", limit: 9, children: []spec{{key: "e", limit: 10}}},
	{key: "s", value: "f/*", share: true, children: []spec{{key: "u", limit: 11}}},
	{key: "|=%#", value: "v|=%#*", limit: 12},
}

func specYAML(b *strings.Builder, specs []spec, indent string) {
	for _, s := range specs {
		fmt.Fprintf(b, "%s- key: %q\n", indent, s.key)
		if s.value != "" {
			fmt.Fprintf(b, "%s  value: %q\n", indent, s.value)
		}
		if s.share {
			fmt.Fprintf(b, "%s  share_threshold: true\n", indent)
		}
		if s.limit > 0 {
			fmt.Fprintf(b, "%s  rate_limit: {unit: second, requests_per_unit: %d}\n", indent, s.limit)
		}
		if len(s.children) > 0 {
			fmt.Fprintf(b, "%s  descriptors:\n", indent)
			specYAML(b, s.children, indent+"    ")
		}
	}
}

// naiveMatch is the matching rule written as directly as possible, with
// regular expressions for wildcards. It returns the limit (0 for no rule)
// and the values that go into the counter key.
func naiveMatch(specs []spec, es []Entry) (int, []string) {
	var values []string
	for i, e := range es {
		var pick *spec
		for j := range specs {
			if s := &specs[j]; s.key == e.Key && s.value != "" && s.value == e.Value {
				pick = s
				break
			}
		}
		for j := range specs {
			s := &specs[j]
			if pick != nil {
				break
			}
			if s.key == e.Key && strings.Contains(s.value, "*") {
				parts := strings.Split(s.value, "*")
				for k := range parts {
					parts[k] = regexp.QuoteMeta(parts[k])
				}
				if regexp.MustCompile(`(?s)^` + strings.Join(parts, ".*") + `$`).MatchString(e.Value) {
					pick = s
				}
			}
		}
		for j := range specs {
			if s := &specs[j]; pick == nil && s.key == e.Key && s.value == "" {
				pick = s
			}
		}
		if pick == nil {
			return 0, nil
		}
		if pick.share {
			values = append(values, pick.value)
		} else {
			values = append(values, e.Value)
		}
		if i == len(es)-1 {
			return pick.limit, values
		}
		specs = pick.children
	}
	return 0, nil
}

// FuzzMatch checks Match against naiveMatch on a fixture with exact,
// wildcard, key-only and share_threshold descriptors at three levels.
func FuzzMatch(f *testing.F) {
	var b strings.Builder
	b.WriteString("domain: fz\ndescriptors:\n")
	specYAML(&b, fuzzSpecs, "  ")
	tbl := mustCompile(f, b.String())
	f.Add(uint8(1), "a", "x", "", "", "", "")
	f.Add(uint8(1), "a", "xyz", "", "", "", "")
	f.Add(uint8(1), "a", "zzy", "", "", "", "")
	f.Add(uint8(1), "a", "pqr", "", "", "", "")
	f.Add(uint8(2), "b", "", "c", "1", "", "")
	f.Add(uint8(3), "b", "q", "c", "z", "d", "")
	f.Add(uint8(2), "b", "q", "e", "1", "", "")
	f.Add(uint8(2), "s", "f/1", "u", "me", "", "")
	f.Add(uint8(1), "|=%#", "v|=%#\n", "", "", "", "")
	f.Fuzz(func(t *testing.T, n uint8, k1, v1, k2, v2, k3, v3 string) {
		es := []Entry{{k1, v1}, {k2, v2}, {k3, v3}}[:n%4]
		wantLimit, values := naiveMatch(fuzzSpecs, es)
		rule, key := tbl.Match("fz", es, []byte("pre"))
		if rule == nil {
			if wantLimit != 0 || string(key) != "pre" {
				t.Fatalf("Match(%q) = nil, key %q; want limit %d", es, key, wantLimit)
			}
			return
		}
		if int(rule.RequestsPerUnit) != wantLimit {
			t.Fatalf("Match(%q) limit %d, want %d", es, rule.RequestsPerUnit, wantLimit)
		}
		want := "prefz"
		for i, e := range es {
			want += "|" + escapePart(e.Key, DefaultMaxValueBytes) + "=" + escapePart(values[i], DefaultMaxValueBytes)
		}
		want += "|fw:1s"
		if string(key) != want {
			t.Fatalf("Match(%q) key %q, want %q", es, key, want)
		}
	})
}

// checkPlaced fails t unless err is *Errors whose every problem names file
// and a line (but that the file is not YAML or is empty) and says what.
func checkPlaced(t *testing.T, err error, file string) {
	t.Helper()
	var es *Errors
	if !errors.As(err, &es) || len(es.List) == 0 {
		t.Fatalf("error %T %v, want *Errors", err, err)
	}
	for _, e := range es.List {
		unplaced := strings.HasPrefix(e.Msg, "invalid YAML") || strings.HasPrefix(e.Msg, "file is empty")
		if e.File != file || e.Line <= 0 && !unplaced || e.Msg == "" {
			t.Errorf("error %+v names no file or line", e)
		}
	}
}
