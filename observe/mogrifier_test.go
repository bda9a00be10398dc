package observe

import (
	"slices"
	"strings"
	"testing"
)

const refPattern = `^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.(.*)$`

// TestDogName_ReferenceCases: the examples of envoyproxy/ratelimit's
// src/godogstats tests (TestMogrify, TestLoadMogrifiersFromEnv,
// TestSeparateExtraTags, TestSinkMogrify), tags sorted by key within a
// mogrifier where the reference's order is a map's.
func TestDogName_ReferenceCases(t *testing.T) {
	const within = "ratelimit.service.rate_limit.mongo_cps.database_users.within_limit"
	const hits = "ratelimit.service.rate_limit.mongo_cps.database_users.total_hits"
	tag := "ratelimit.service.rate_limit.$3|domain:$1,descriptor:$2|" + refPattern
	custom := `custom.$1|tag1:value1,tag2:value2|^ratelimit\.(.*)$`
	for _, c := range []struct {
		name       string
		mogrifiers []string // NAME|TAGS|PATTERN
		stat       string
		want       string
		wantTags   []string
	}{
		{"simple replacement", []string{tag}, within, "ratelimit.service.rate_limit.within_limit", []string{"descriptor:database_users", "domain:mongo_cps"}},
		{"out of bounds index", []string{"ratelimit.service.rate_limit.$3|domain:$1,descriptor:$5|" + refPattern}, within,
			"ratelimit.service.rate_limit.within_limit", []string{"descriptor:$5", "domain:mongo_cps"}},
		{"no placeholders in tags", []string{"ratelimit.service.rate_limit.$3|domain:mongo_cps,descriptor:database_users|" + refPattern}, within,
			"ratelimit.service.rate_limit.within_limit", []string{"descriptor:database_users", "domain:mongo_cps"}},
		{"no matches", []string{"ratelimit.service.rate_limit.$3|domain:$1,descriptor:$4|" + refPattern}, "some.unmatched.metric", "some.unmatched.metric", nil},
		{"two mogrifiers: first match", []string{`custom.foo|domain:$1,descriptor:$2|^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.foo$`, tag},
			"ratelimit.service.rate_limit.mongo_cps.database_users.foo", "custom.foo", []string{"descriptor:database_users", "domain:mongo_cps"}},
		{"two mogrifiers: second match", []string{`custom.foo|domain:$1,descriptor:$2|^ratelimit\.service\.rate_limit\.(.*)\.(.*)\.foo$`, tag},
			within, "ratelimit.service.rate_limit.within_limit", []string{"descriptor:database_users", "domain:mongo_cps"}},
		{"none", nil, within, within, nil},
		{"no extra tags", nil, hits, hits, nil},
		{"one extra tag", nil, hits + ".__COMMIT=12345", hits, []string{"COMMIT:12345"}},
		{"two extra tags", nil, hits + ".__COMMIT=12345.__DEPLOY=6890", hits, []string{"COMMIT:12345", "DEPLOY:6890"}},
		{"extra tag without a value", nil, hits + ".__COMMIT", hits, nil},
		{"match and extra tags", []string{custom}, hits + ".__COMMIT=12345.__DEPLOY=67890",
			"custom.service.rate_limit.mongo_cps.database_users.total_hits", []string{"COMMIT:12345", "DEPLOY:67890", "tag1:value1", "tag2:value2"}},
		{"match without extra tags", []string{custom}, hits, "custom.service.rate_limit.mongo_cps.database_users.total_hits", []string{"tag1:value1", "tag2:value2"}},
		{"extra tags with no match", []string{custom}, "foo.service.rate_limit.mongo_cps.database_users.total_hits.__COMMIT=12345.__DEPLOY=67890",
			"foo.service.rate_limit.mongo_cps.database_users.total_hits", []string{"COMMIT:12345", "DEPLOY:67890"}},
		{"no mogrification", []string{custom}, "other.metric.name", "other.metric.name", nil},
		// Sluice's own: a ',' caught into a tag value would split the tag.
		{"comma in a tag value", []string{"rl.$3|key:$2|" + refPattern}, "ratelimit.service.rate_limit.web.a,b.over_limit", "rl.over_limit", []string{"key:a_b"}},
	} {
		var ms []Mogrifier
		for _, s := range c.mogrifiers {
			m, err := ParseMogrifier(s)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			ms = append(ms, m)
		}
		name, tags := dogName(c.stat, ms)
		if name != c.want || !slices.Equal(tags, c.wantTags) {
			t.Errorf("%s: %q → %q %q, want %q %q", c.name, c.stat, name, tags, c.want, c.wantTags)
		}
	}
}

// TestNewMogrifier_Invalid: what the reference refuses at start
// (TestValidation), and the templates that would break a statsd line.
func TestNewMogrifier_Invalid(t *testing.T) {
	for _, c := range []struct{ pattern, name, tags, want string }{
		{"", "ratelimit.service.rate_limit.$3", "domain:$1,descriptor:$2", "no pattern"},
		{refPattern, "", "domain:$1,descriptor:$2", "no name"},
		{refPattern, "ratelimit.service.rate_limit.$3", ":5", "no key"},
		{refPattern, "ratelimit.service.rate_limit.$3", "domain:$1,descriptor:", "no value"},
		{refPattern, "ratelimit.service.rate_limit.$3", "domain:$1:x", "want key:value"},
		{refPattern, "ratelimit.service.rate_limit.$3", "domain", "want key:value"},
		{`(`, "n", "", "pattern"},
		{refPattern, "n:1", "", "name"},
		{refPattern, "n", "k:v#", "no |"},
	} {
		_, err := NewMogrifier(c.pattern, c.name, c.tags)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewMogrifier(%q, %q, %q): %v, want an error with %q", c.pattern, c.name, c.tags, err, c.want)
		}
	}
	if _, err := ParseMogrifier("name-only"); err == nil {
		t.Error("ParseMogrifier(name-only): no error")
	}
	m, err := ParseMogrifier("n||a|b")
	if err != nil || m.String() != "n||a|b" {
		t.Errorf("ParseMogrifier(n||a|b) = %v, %v: the pattern keeps its '|'", m, err)
	}
}

// FuzzMogrifier: a parsed mogrifier never panics, and from a stat name
// without '|' or a newline it makes a name and tags without them (a
// statsd line stays one line of the right shape).
func FuzzMogrifier(f *testing.F) {
	f.Add("ratelimit.service.rate_limit.$3|domain:$1,descriptor:$2|"+refPattern, "ratelimit.service.rate_limit.a.b.c.__X=1")
	f.Add(`custom.$1|tag1:value1|^ratelimit\.(.*)$`, "ratelimit.x")
	f.Add(`n.$0$9$10|k:$1$1|(a*)(b?)`, "aaab")
	f.Fuzz(func(t *testing.T, text, stat string) {
		m, err := ParseMogrifier(text)
		if err != nil {
			return
		}
		name, tags := dogName(stat, []Mogrifier{m})
		if strings.ContainsAny(stat, "|\n") {
			return
		}
		if strings.ContainsAny(name, "|\n") {
			t.Errorf("name %q from %q", name, stat)
		}
		for _, tag := range tags {
			if strings.ContainsAny(tag, "|\n") || strings.Count(tag, ":") == 0 {
				t.Errorf("tag %q from %q", tag, stat)
			}
		}
	})
}
