package config

import (
	"strings"
	"testing"
	"time"
)

func TestUnit(t *testing.T) {
	cases := []struct {
		s    string
		unit Unit
		d    time.Duration
	}{
		{"second", Second, time.Second},
		{"MINUTE", Minute, time.Minute},
		{"Hour", Hour, time.Hour},
		{"day", Day, 24 * time.Hour},
		{"week", Week, 7 * 24 * time.Hour},
		{"month", Month, 30 * 24 * time.Hour},
		{"year", Year, 365 * 24 * time.Hour},
	}
	for _, c := range cases {
		u, err := ParseUnit(c.s)
		if err != nil || u != c.unit || u.Duration() != c.d {
			t.Errorf("ParseUnit(%q) = %v (%v), %v; want %v (%v)", c.s, u, u.Duration(), err, c.unit, c.d)
		}
	}
	for _, bad := range []string{"", "unknown", "fortnight", "seconds"} {
		if u, err := ParseUnit(bad); err == nil {
			t.Errorf("ParseUnit(%q) = %v, want an error", bad, u)
		}
	}
	if Unit(99).Duration() != 0 || UnitUnknown.Duration() != 0 || Unit(99).String() != "Unit(99)" || Week.String() != "week" {
		t.Errorf("out-of-range units: %v %v %q %q", Unit(99).Duration(), UnitUnknown.Duration(), Unit(99).String(), Week.String())
	}
}

func TestOverrideKey(t *testing.T) {
	got := string((&Table{max: DefaultMaxValueBytes}).OverrideKey([]byte("x:"), "api", entries("user=bob", "path=/a|b"), Minute, false))
	if want := "x:api|user=bob|path=/a%7Cb|fw:60s"; got != want {
		t.Errorf("OverrideKey = %q, want %q", got, want)
	}
	// A rule that matches the same entries exactly with the same unit
	// shares the counter, as in envoyproxy/ratelimit.
	tbl := mustCompile(t, `
domain: api
descriptors:
  - key: user
    value: bob
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	_, key := tbl.Match("api", entries("user=bob"), nil)
	if ov := tbl.OverrideKey(nil, "api", entries("user=bob"), Minute, false); string(ov) != string(key) {
		t.Errorf("OverrideKey %q differs from the rule's key %q", ov, key)
	}
	if p := tbl.KeyPrefix("api"); !strings.HasPrefix(string(key), p) || p != "api|" {
		t.Errorf("KeyPrefix = %q, want the start of %q", p, key)
	}
}

// A fixed window past 2^32-3 is wide: its state takes two words, under a
// key of its own.
func TestKey_WideFixedWindow(t *testing.T) {
	tbl := mustCompile(t, `
domain: api
descriptors:
  - key: narrow
    rate_limit: {unit: minute, requests_per_unit: 4294967293}
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 4294967294}
`)
	for _, c := range []struct{ entry, want string }{{"narrow=a", "api|narrow=a|fw:60s"}, {"wide=a", "api|wide=a|fw64:60s"}} {
		if _, key := tbl.Match("api", entries(c.entry), nil); string(key) != c.want {
			t.Errorf("key of %s = %q, want %q", c.entry, key, c.want)
		}
	}
}

// Overrides hash long values at the table's limit, like rule keys.
func TestOverrideKey_MaxValueBytes(t *testing.T) {
	tbl, err := compile([]source{{name: "a.yaml", data: []byte("domain: api\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")}}, Options{MaxValueBytes: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	long := entries("user=" + strings.Repeat("x", 9))
	_, key := tbl.Match("api", long, nil)
	if ov := tbl.OverrideKey(nil, "api", long, Minute, false); string(ov) != string(key) || strings.Contains(string(ov), "xxxxxxxxx") {
		t.Errorf("override key %q, rule key %q: want the same, hashed", ov, key)
	}
}

func TestAppendPart_Unambiguous(t *testing.T) {
	// Distinct inputs never produce the same escaped text.
	seen := map[string]string{}
	for _, s := range []string{"a", "a|b", "a%7Cb", "a=b", "a%3Db", "#", "%23", "%", "%25", "", "|", "||", "{", "%7B", "}", "%7D", "{}"} {
		e := escapePart(s, DefaultMaxValueBytes)
		if prev, dup := seen[e]; dup {
			t.Errorf("%q and %q both escape to %q", prev, s, e)
		}
		seen[e] = s
	}
	if got := escapePart("abcd", 3); len(got) != 33 || got[0] != '#' {
		t.Errorf("escapePart of a long part = %q, want # and 32 hex digits", got)
	}
}

// TestKeys_NoHashTagFromValues: a value holding braces (a Redis Cluster
// hash tag, "{x}") is escaped in every key it reaches, rule and override
// keys alike, so that the slot of a counter is chosen by the whole key,
// not by a client's value.
func TestKeys_NoHashTagFromValues(t *testing.T) {
	tbl := mustCompile(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: "/v1/{id}*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	for _, v := range []string{"{x}", "a{x}b", "}{", "{", "}", "{{x}}"} {
		_, key := tbl.Match("api", entries("user="+v), nil)
		ov := tbl.OverrideKey(nil, "api", entries("user="+v), Minute, false)
		for _, k := range []string{string(key), string(ov)} {
			if strings.ContainsAny(k, "{}") {
				t.Errorf("value %q: key %q holds a brace", v, k)
			}
		}
	}
	if _, key := tbl.Match("api", entries("user={x}"), nil); string(key) != "api|user=%7Bx%7D|fw:60s" {
		t.Errorf("key %q", key)
	}
	// A pattern from the config is escaped too (share_threshold writes it
	// in the key).
	if _, key := tbl.Match("api", entries("path=/v1/{id}7"), nil); string(key) != "api|path=/v1/%7Bid%7D*|fw:60s" {
		t.Errorf("shared key %q", key)
	}
}

// TestSplitKey: every limit's counter key splits back into its domain's
// KeyPrefix and its KeySuffix, a rate_limits list's limits that share a
// window (suffix "|2", "|3") and values that look like a suffix included.
func TestSplitKey(t *testing.T) {
	tb, err := Parse("limits.yaml", []byte(`domain: d|1
descriptors:
  - key: k
    rate_limits:
      - {unit: minute, requests_per_unit: 100}
      - {unit: minute, requests_per_unit: 10}
      - {unit: minute, requests_per_unit: 1}
      - {unit: hour, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
      - {unit: hour, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
      - {unit: minute, requests_per_unit: 10, algorithm: sliding_window}
      - {unit: month, requests_per_unit: 1000, calendar: true, time_zone: Europe/Berlin}
      - {unit: day, requests_per_unit: 9007199254740992}
  - key: u
    rate_limit: {unlimited: true}
`), Options{MaxValueBytes: 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ key, value string }{
		{"k", "x"}, {"k", "2"}, {"k", "|2"}, {"k", "fw:60s"}, {"k", "a-value-longer-than-8"}, {"u", "12"},
	} {
		r, key := tb.Match("d|1", []Entry{{Key: c.key, Value: c.value}}, nil)
		if r == nil {
			t.Fatalf("%s=%s: no rule", c.key, c.value)
		}
		for _, l := range r.Limits() {
			k := strings.TrimSuffix(string(key), r.KeySuffix()) + l.KeySuffix()
			prefix, suffix, ok := SplitKey(k)
			if !ok || prefix != tb.KeyPrefix("d|1") || suffix != l.KeySuffix() {
				t.Errorf("SplitKey(%q) = %q, %q, %v; want %q, %q", k, prefix, suffix, ok, tb.KeyPrefix("d|1"), l.KeySuffix())
			}
		}
	}
	for _, k := range []string{"", "d", "d|", "d|2"} {
		if p, s, ok := SplitKey(k); ok {
			t.Errorf("SplitKey(%q) = %q, %q, true; want false", k, p, s)
		}
	}
}

// TestKeys_PartsBoundedEscaped: --max-value-bytes bounds a part of a
// counter key as written, escapes included: 256 '|' would be 768 bytes
// escaped, so they are hashed, as is a value just past the bound once
// escaped; one at the bound is written as is.
func TestKeys_PartsBoundedEscaped(t *testing.T) {
	tbl := mustCompile(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
	for _, c := range []struct {
		value  string
		hashed bool
	}{
		{strings.Repeat("|", 256), true},
		{strings.Repeat("x", 254) + "|", true},  // 257 bytes escaped
		{strings.Repeat("x", 253) + "|", false}, // 256
		{strings.Repeat("{", 85) + "x", false},  // 256
		{strings.Repeat("x", 256), false},
	} {
		_, key := tbl.Match("api", entries("user="+c.value), nil)
		ov := tbl.OverrideKey(nil, "api", entries("user="+c.value), Minute, false)
		for _, k := range []string{string(key), string(ov)} {
			part := strings.TrimPrefix(strings.Split(k, "|")[1], "user=")
			if hashed := strings.HasPrefix(part, "#"); hashed != c.hashed || len(part) > DefaultMaxValueBytes {
				t.Errorf("a value of %d bytes, %d escaped: part of %d bytes (hashed %v), want hashed %v and at most %d bytes",
					len(c.value), escapedLen(c.value), len(part), hashed, c.hashed, DefaultMaxValueBytes)
			}
		}
	}
}

// FuzzAppendPart: a part as written is at most max bytes, or '#' and 32
// hex digits.
func FuzzAppendPart(f *testing.F) {
	for _, s := range []string{"", "a", "||||", "{x}", "%25", strings.Repeat("=", 30)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		const max = 16
		got := escapePart(s, max)
		if len(got) > max && (len(got) != 33 || got[0] != '#') {
			t.Fatalf("escapePart(%q, %d) = %q: %d bytes", s, max, got, len(got))
		}
	})
}
