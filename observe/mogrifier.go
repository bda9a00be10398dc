package observe

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Mogrifier turns a stat name that its pattern matches into a shorter
// name and DogStatsD tags, as envoyproxy/ratelimit's
// DOG_STATSD_MOGRIFIER_* do: in the name and in the tags' values, $N
// stands for the pattern's Nth submatch ($0 the whole match), and stays
// as written when the pattern has no such group. Immutable.
type Mogrifier struct {
	pattern *regexp.Regexp
	name    string
	tags    [][2]string // key, value template; by key
	text    string
}

// dollarN finds the $N placeholders of a template.
var dollarN = regexp.MustCompile(`\$\d+`)

// ParseMogrifier reads a mogrifier written "NAME|TAGS|PATTERN": NAME the
// name template, TAGS "key:value,..." (may be empty), PATTERN a Go
// regular expression (RE2), the rest of the text, so it may hold '|'.
// Neither NAME nor TAGS can hold '|', which ends a statsd field.
func ParseMogrifier(s string) (Mogrifier, error) {
	name, rest, ok1 := strings.Cut(s, "|")
	tags, pattern, ok2 := strings.Cut(rest, "|")
	if !ok1 || !ok2 {
		return Mogrifier{}, fmt.Errorf("observe: mogrifier %q: want NAME|TAGS|PATTERN", s)
	}
	return NewMogrifier(pattern, name, tags)
}

// NewMogrifier makes a mogrifier of a pattern, a name template and tags
// written "key:value,key:value" as the reference's
// DOG_STATSD_MOGRIFIER_*_TAGS (no ':' in keys or values; a key given
// twice keeps its last value).
func NewMogrifier(pattern, name, tags string) (Mogrifier, error) {
	m := Mogrifier{name: name, text: name + "|" + tags + "|" + pattern}
	var err error
	switch {
	case pattern == "":
		return m, errors.New("observe: mogrifier: no pattern")
	case name == "":
		return m, errors.New("observe: mogrifier: no name")
	case strings.ContainsAny(name, ":|#, ") || strings.ContainsFunc(name, isControl):
		return m, fmt.Errorf("observe: mogrifier: name %q: no : | # , spaces or control characters", name)
	}
	if m.pattern, err = regexp.Compile(pattern); err != nil {
		return m, fmt.Errorf("observe: mogrifier: pattern: %w", err)
	}
	byKey := map[string]string{}
	if strings.TrimSpace(tags) != "" {
		for _, kv := range strings.Split(tags, ",") {
			parts := strings.Split(kv, ":")
			switch {
			case len(parts) != 2:
				return m, fmt.Errorf("observe: mogrifier: tag %q: want key:value", kv)
			case parts[0] == "":
				return m, fmt.Errorf("observe: mogrifier: tag %q: no key", kv)
			case parts[1] == "":
				return m, fmt.Errorf("observe: mogrifier: tag %q: no value", kv)
			case strings.ContainsAny(kv, "|#") || strings.ContainsFunc(kv, isControl):
				return m, fmt.Errorf("observe: mogrifier: tag %q: no | # or control characters", kv)
			}
			byKey[parts[0]] = parts[1]
		}
	}
	for k, v := range byKey {
		m.tags = append(m.tags, [2]string{k, v})
	}
	slices.SortFunc(m.tags, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	return m, nil
}

func isControl(r rune) bool { return r < ' ' || r == 0x7f }

// String returns the mogrifier as ParseMogrifier reads it.
func (m Mogrifier) String() string { return m.text }

// apply returns the name and tags ("key:value", by key) of stat, and
// whether the pattern matched it. A submatch put into a tag value has
// its ',' made '_', since ',' separates DogStatsD tags.
func (m Mogrifier) apply(stat string) (string, []string, bool) {
	match := m.pattern.FindStringSubmatch(stat)
	if match == nil {
		return stat, nil, false
	}
	fill := func(tmpl string, repl func(string) string) string {
		return dollarN.ReplaceAllStringFunc(tmpl, func(p string) string {
			i, err := strconv.Atoi(p[1:])
			if err != nil || i >= len(match) {
				return p
			}
			return repl(match[i])
		})
	}
	tags := make([]string, len(m.tags))
	for i, t := range m.tags {
		tags[i] = t[0] + ":" + fill(t[1], noComma)
	}
	return fill(m.name, func(s string) string { return s }), tags, true
}

func noComma(s string) string { return strings.ReplaceAll(s, ",", "_") }

// dogName is what DogStatsD is sent for a stat name: envoyproxy/
// ratelimit's godogstats sink. Tags gostats serialised into the name
// (".__KEY=VALUE", the reference's EXTRA_TAGS) are cut off and become
// tags "KEY:VALUE" (a part without '=' is dropped); then the first
// mogrifier whose pattern matches what is left renames it and adds its
// tags after those.
func dogName(stat string, mogrifiers []Mogrifier) (string, []string) {
	name, serialized, hasTags := strings.Cut(stat, ".__")
	var tags []string
	if hasTags {
		for _, kv := range strings.Split(serialized, ".__") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				tags = append(tags, k+":"+v)
			}
		}
	}
	for _, m := range mogrifiers {
		if short, more, ok := m.apply(name); ok {
			return short, append(tags, more...)
		}
	}
	return name, tags
}
