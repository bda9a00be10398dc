package config

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/store"
)

// mustCompile compiles one limits file given as text.
func mustCompile(t testing.TB, yamlText string) *Table {
	t.Helper()
	tbl, err := compile([]source{{name: "limits.yaml", data: []byte(yamlText)}}, Options{}, nil)
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	return tbl
}

// entries builds a descriptor from "k=v" pairs.
func entries(pairs ...string) []Entry {
	es := make([]Entry, len(pairs))
	for i, p := range pairs {
		k, v, _ := strings.Cut(p, "=")
		es[i] = Entry{Key: k, Value: v}
	}
	return es
}

type matchCase struct {
	domain  string
	entries []Entry
	path    string // the matched rule's Path; "" for no rule
	key     string // the counter key; checked when not ""
}

func runMatches(t *testing.T, tbl *Table, cases []matchCase) {
	t.Helper()
	for i, c := range cases {
		prefix := []byte("prefix:")
		rule, key := tbl.Match(c.domain, c.entries, prefix)
		got := ""
		if rule != nil {
			got = rule.Path
		}
		if got != c.path {
			t.Errorf("case %d: Match(%q, %v) rule %q, want %q", i, c.domain, c.entries, got, c.path)
			continue
		}
		if rule == nil {
			if string(key) != "prefix:" {
				t.Errorf("case %d: Match(%q, %v) with no rule changed dst to %q", i, c.domain, c.entries, key)
			}
			continue
		}
		if !strings.HasPrefix(string(key), "prefix:") {
			t.Errorf("case %d: key %q does not extend dst", i, key)
		}
		if c.key != "" && string(key[len(prefix):]) != c.key {
			t.Errorf("case %d: Match(%q, %v) key %q, want %q", i, c.domain, c.entries, key[len(prefix):], c.key)
		}
	}
}

// The examples of envoyproxy/ratelimit's README, "Configuration" section.

func TestMatch_ReadmeExample1_Values(t *testing.T) {
	tbl := mustCompile(t, `
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
`)
	runMatches(t, tbl, []matchCase{
		{"mongo_cps", entries("database=users"), "database_users", "mongo_cps|database=users|fw:1s"},
		{"mongo_cps", entries("database=default"), "database_default", "mongo_cps|database=default|fw:1s"},
		{"mongo_cps", entries("database=other"), "", ""},
		{"mongo_cps", entries("database="), "", ""},
		{"other", entries("database=users"), "", ""},
	})
	if r, _ := tbl.Match("mongo_cps", entries("database=users"), nil); r.RequestsPerUnit != 500 || r.Unit != Second || r.Limit.Limit() != 500 {
		t.Errorf("rule = %v, want 500 per second", r)
	}
}

func TestMatch_ReadmeExample2_NestedAndKeyOnly(t *testing.T) {
	tbl := mustCompile(t, `
domain: messaging
descriptors:
  # Only allow 5 marketing messages a day
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  # Only allow 100 messages a day to any unique phone number
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`)
	runMatches(t, tbl, []matchCase{
		{"messaging", entries("message_type=marketing", "to_number=2061111111"), "message_type_marketing.to_number",
			"messaging|message_type=marketing|to_number=2061111111|fw:86400s"},
		{"messaging", entries("message_type=marketing", "to_number=2062222222"), "message_type_marketing.to_number",
			"messaging|message_type=marketing|to_number=2062222222|fw:86400s"},
		{"messaging", entries("to_number=2061111111"), "to_number", "messaging|to_number=2061111111|fw:86400s"},
		{"messaging", entries("message_type=marketing"), "", ""}, // a placeholder, no rule
		{"messaging", entries("message_type=transactional", "to_number=1"), "", ""},
	})
}

func TestMatch_ReadmeExample3_ValueBeforeKey(t *testing.T) {
	tbl := mustCompile(t, `
domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`)
	runMatches(t, tbl, []matchCase{
		{"edge_proxy_per_ip", entries("remote_address=50.0.0.1"), "remote_address", "edge_proxy_per_ip|remote_address=50.0.0.1|fw:1s"},
		{"edge_proxy_per_ip", entries("remote_address=50.0.0.5"), "remote_address_50.0.0.5", "edge_proxy_per_ip|remote_address=50.0.0.5|fw:1s"},
		{"edge_proxy_per_ip", entries("remote_address="), "remote_address", "edge_proxy_per_ip|remote_address=|fw:1s"},
	})
	if r, _ := tbl.Match("edge_proxy_per_ip", entries("remote_address=50.0.0.5"), nil); r.RequestsPerUnit != 0 {
		t.Errorf("blacklisted IP: %d per unit, want 0", r.RequestsPerUnit)
	}
}

func TestMatch_ReadmeExample4_LevelRule(t *testing.T) {
	flat := mustCompile(t, `
domain: example4
descriptors:
  - key: key
    value: value
    rate_limit:
      requests_per_unit: 300
      unit: second
`)
	runMatches(t, flat, []matchCase{
		{"example4", entries("key=value", "subkey=subvalue"), "", ""}, // more entries than levels
		{"example4", entries("key=value"), "key_value", ""},
	})
	nested := mustCompile(t, `
domain: example4
descriptors:
  - key: key
    value: value
    descriptors:
      - key: subkey
        rate_limit:
          requests_per_unit: 300
          unit: second
`)
	runMatches(t, nested, []matchCase{
		{"example4", entries("key=value", "subkey=subvalue"), "key_value.subkey", "example4|key=value|subkey=subvalue|fw:1s"},
		{"example4", entries("key=value"), "", ""}, // fewer entries than levels
		{"example4", entries("key=value", "subkey=subvalue", "third=x"), "", ""},
	})
}

func TestMatch_ReadmeExample5_Unlimited(t *testing.T) {
	tbl := mustCompile(t, `
domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 100
`)
	runMatches(t, tbl, []matchCase{
		{"internal", entries("ldap=x"), "ldap", "internal|ldap=x|unlimited"},
		{"internal", entries("azure=y"), "azure", "internal|azure=y|fw:60s"},
	})
	r, _ := tbl.Match("internal", entries("ldap=x"), nil)
	if !r.Unlimited || r.Limit != nil {
		t.Errorf("ldap: Unlimited=%t Limit=%v, want an unlimited rule without a store rule", r.Unlimited, r.Limit)
	}
}

func TestMatch_ReadmeExample6_ShadowMode(t *testing.T) {
	tbl := mustCompile(t, `
domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: second
`)
	runMatches(t, tbl, []matchCase{
		{"example6", entries("service=auth-service", "user=user-a"), "service.user_user-a", "example6|service=auth-service|user=user-a|fw:1s"},
		{"example6", entries("service=auth-service", "user=user-b"), "service.user_user-b", ""},
		{"example6", entries("service=auth-service", "user=user-c"), "", ""},
	})
	a, _ := tbl.Match("example6", entries("service=s", "user=user-a"), nil)
	b, _ := tbl.Match("example6", entries("service=s", "user=user-b"), nil)
	if !a.ShadowMode || b.ShadowMode || b.RequestsPerUnit != 20 {
		t.Errorf("user-a shadow=%t, user-b shadow=%t limit %d; want true, false, 20", a.ShadowMode, b.ShadowMode, b.RequestsPerUnit)
	}
}

func TestMatch_ReadmeExample7_Replaces(t *testing.T) {
	tbl := mustCompile(t, `
domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
`)
	r1, _ := tbl.Match("example7", entries("key_1=value_1", "user=bkthomps"), nil)
	r2, _ := tbl.Match("example7", entries("key_2=value_2", "user=bkthomps"), nil)
	if r1 == nil || r1.Name != "specific_limit" || r1.RequestsPerUnit != 5 {
		t.Fatalf("key_1 rule = %v, want specific_limit 5/s", r1)
	}
	if r2 == nil || len(r2.Replaces) != 1 || r2.Replaces[0] != "specific_limit" || r2.RequestsPerUnit != 10 {
		t.Fatalf("key_2 rule = %v, want 10/s replacing specific_limit", r2)
	}
}

func TestMatch_ReadmeExample8_DetailedMetric(t *testing.T) {
	tbl := mustCompile(t, `
domain: example8
descriptors:
  - key: key1
    detailed_metric: true
    rate_limit:
      unit: minute
      requests_per_unit: 10
  - key: key1
    value: value1
    rate_limit:
      unit: minute
      requests_per_unit: 20
`)
	runMatches(t, tbl, []matchCase{
		{"example8", entries("key1=unspecified_value"), "key1", "example8|key1=unspecified_value|fw:60s"},
		{"example8", entries("key1=value1"), "key1_value1", ""},
	})
	d, _ := tbl.Match("example8", entries("key1=x"), nil)
	v, _ := tbl.Match("example8", entries("key1=value1"), nil)
	if !d.DetailedMetric || v.DetailedMetric {
		t.Errorf("detailed_metric: key1=%t key1_value1=%t, want true, false", d.DetailedMetric, v.DetailedMetric)
	}
}

func TestMatch_ReadmeExample9_Wildcard(t *testing.T) {
	tbl := mustCompile(t, `
domain: example9
descriptors:
  - key: key1
    value: value*
    rate_limit:
      unit: minute
      requests_per_unit: 20
`)
	runMatches(t, tbl, []matchCase{
		{"example9", entries("key1=value_1"), "key1_value*", "example9|key1=value_1|fw:60s"},
		{"example9", entries("key1=value_2"), "key1_value*", "example9|key1=value_2|fw:60s"},
		{"example9", entries("key1=value"), "key1_value*", "example9|key1=value|fw:60s"},
		{"example9", entries("key1=valu"), "", ""},
		{"example9", entries("key2=value_1"), "", ""},
	})
}

func TestMatch_ShareThreshold(t *testing.T) {
	tbl := mustCompile(t, `
domain: files
descriptors:
  - key: path
    value: files/*
    share_threshold: true
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: path
    value: models/*
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: route
    value: api/*
    share_threshold: true
    descriptors:
      - key: user
        rate_limit:
          unit: minute
          requests_per_unit: 5
`)
	runMatches(t, tbl, []matchCase{
		{"files", entries("path=files/a.pdf"), "path_files/*", "files|path=files/*|fw:3600s"},
		{"files", entries("path=files/b.csv"), "path_files/*", "files|path=files/*|fw:3600s"},
		{"files", entries("path=files/*"), "path_files/*", "files|path=files/*|fw:3600s"},
		// Without share_threshold each value counts on its own.
		{"files", entries("path=models/a"), "path_models/*", "files|path=models/a|fw:3600s"},
		// share_threshold on a level above the rule: the pattern stands in for that entry.
		{"files", entries("route=api/x", "user=bob"), "route_api/*.user", "files|route=api/*|user=bob|fw:60s"},
		{"files", entries("route=api/y", "user=bob"), "route_api/*.user", "files|route=api/*|user=bob|fw:60s"},
	})
}

func TestMatch_Order(t *testing.T) {
	tbl := mustCompile(t, `
domain: order
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: foob*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    value: foobar
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: k
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: k
    value: a*b*c
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 7}
`)
	runMatches(t, tbl, []matchCase{
		{"order", entries("k=foobar"), "k_foobar", ""},  // exact beats every wildcard, even one listed earlier
		{"order", entries("k=foobaz"), "k_foo*", ""},    // first wildcard in file order, not the longest
		{"order", entries("k=foo"), "k_foo*", ""},       // '*' matches nothing too
		{"order", entries("k=zzz"), "k_*", ""},          // a wildcard beats the key-only default
		{"order", entries("k="), "k_*", ""},             // '*' matches the empty value
		{"order", entries("k=foob*"), "k_foob*", ""},    // a literal pattern matches its own descriptor first
		{"order", entries("e="), "e", "order|e=|fw:1s"}, // an empty value falls back to the key-only default
	})
	// a*b*c is listed after "*", so "*" takes it; check the glob on its own.
	g := compileGlob("a*b*c")
	for s, want := range map[string]bool{"abc": true, "aXbYc": true, "abbc": true, "acb": false, "ab": false, "bc": false, "aXbYcZ": false, "abcbc": true} {
		if got := g.match(s); got != want {
			t.Errorf("glob a*b*c match %q = %t, want %t", s, got, want)
		}
	}
}

func TestMatch_NoBacktracking(t *testing.T) {
	tbl := mustCompile(t, `
domain: bt
descriptors:
  - key: a
    value: x
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: a
    descriptors:
      - key: c
        rate_limit: {unit: minute, requests_per_unit: 2}
`)
	runMatches(t, tbl, []matchCase{
		{"bt", entries("a=x", "b=1"), "a_x.b", ""},
		{"bt", entries("a=y", "c=1"), "a.c", ""},
		// a=x chose the a_x branch; its failure at c does not fall back to a.
		{"bt", entries("a=x", "c=1"), "", ""},
		{"bt", nil, "", ""},
	})
}

func TestMatch_TokenBucketKey(t *testing.T) {
	tbl := mustCompile(t, `
domain: tb
descriptors:
  - key: user
    rate_limit:
      unit: minute
      requests_per_unit: 10
      algorithm: token_bucket
      burst: 25
  - key: plain
    rate_limit:
      unit: minute
      requests_per_unit: 10
      algorithm: token_bucket
`)
	runMatches(t, tbl, []matchCase{
		{"tb", entries("user=bob"), "user", "tb|user=bob|tb:10/60s:25"},
		{"tb", entries("plain=x"), "plain", "tb|plain=x|tb:10/60s:10"},
	})
	r, _ := tbl.Match("tb", entries("user=bob"), nil)
	if r.Algorithm != store.TokenBucket || r.Burst != 25 || r.Limit.Burst() != 25 || r.Limit.Limit() != 10 {
		t.Errorf("rule = %v, want token bucket 10/minute burst 25", r)
	}
}

func TestMatch_EscapesAndHashesKeyParts(t *testing.T) {
	tbl := mustCompile(t, `
domain: "d|1"
descriptors:
  - key: "k=%"
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	long := strings.Repeat("v", DefaultMaxValueBytes+1)
	_, k1 := tbl.Match("d|1", []Entry{{"k=%", "a|b#c"}}, nil)
	if want := "d%7C1|k%3D%25=a%7Cb%23c|fw:1s"; string(k1) != want {
		t.Errorf("escaped key %q, want %q", k1, want)
	}
	_, k2 := tbl.Match("d|1", []Entry{{"k=%", long}}, nil)
	_, k3 := tbl.Match("d|1", []Entry{{"k=%", long + "w"}}, nil)
	if len(k2) != len("d%7C1|k%3D%25=#")+32+len("|fw:1s") || string(k2) == string(k3) {
		t.Errorf("long values: keys %q and %q, want distinct 32-hex-digit hashes", k2, k3)
	}
	_, k4 := tbl.Match("d|1", []Entry{{"k=%", long}}, nil)
	if string(k2) != string(k4) {
		t.Errorf("hash not deterministic: %q then %q", k2, k4)
	}
}

func TestMatch_AllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	tbl := mustCompile(t, `
domain: a
descriptors:
  - key: k
    value: "pre*post"
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: long
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	dst := make([]byte, 0, 1024)
	es := entries("k=pre-middle-post", "user=bob")
	longEs := []Entry{{"long", strings.Repeat("x", 1000)}}
	miss := entries("k=nomatch")
	allocs := testing.AllocsPerRun(100, func() {
		if r, _ := tbl.Match("a", es, dst); r == nil {
			t.Fatal("no match")
		}
		if r, _ := tbl.Match("a", longEs, dst); r == nil {
			t.Fatal("no match")
		}
		tbl.Match("a", miss, dst)
	})
	if allocs != 0 {
		t.Errorf("Match allocates %v times per run, want 0", allocs)
	}
}

// TestMatch_DeepDescriptor covers descriptors longer than the path Match
// remembers on its first walk.
func TestMatch_DeepDescriptor(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: deep\ndescriptors:\n")
	indent := "  "
	for i := range 12 {
		fmt.Fprintf(&b, "%s- key: l%d\n", indent, i)
		if i == 10 {
			fmt.Fprintf(&b, "%s  value: \"s*\"\n%s  share_threshold: true\n", indent, indent)
		}
		if i == 11 {
			fmt.Fprintf(&b, "%s  rate_limit: {unit: second, requests_per_unit: 12}\n", indent)
			break
		}
		fmt.Fprintf(&b, "%s  descriptors:\n", indent)
		indent += "    "
	}
	tbl := mustCompile(t, b.String())
	var es []Entry
	want := "deep"
	for i := range 12 {
		v := fmt.Sprintf("v%d", i)
		if i == 10 {
			v = "shared"
		}
		es = append(es, Entry{fmt.Sprintf("l%d", i), v})
		if i == 10 {
			v = "s*"
		}
		want += fmt.Sprintf("|l%d=%s", i, v)
	}
	want += "|fw:1s"
	r, key := tbl.Match("deep", es, nil)
	if r == nil || r.RequestsPerUnit != 12 || string(key) != want {
		t.Errorf("Match(12 entries) = %v, %q; want 12/s, %q", r, key, want)
	}
	if r, _ := tbl.Match("deep", es[:11], nil); r != nil {
		t.Errorf("Match(11 entries) = %v, want no rule", r)
	}
}
