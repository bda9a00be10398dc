package observe

import (
	"strings"
	"testing"
)

func TestSanitizeStatName(t *testing.T) {
	for in, want := range map[string]string{
		"web.remote_address_10.0.0.1":  "web.remote_address_10_0_0_1",
		"web.path_/a:b|c":              "web.path_/a_b_c",
		"web.user_a\nevil.x:1|c":       "web.user_a_evil.x_1_c",
		"web.version_1.2.3":            "web.version_1.2.3",
		"web.ip_1.2.3.4.ip2_5.6.7.8":   "web.ip_1_2_3_4.ip2_5_6_7_8",
		"web.header_x-user-id.user_42": "web.header_x-user-id.user_42",
	} {
		if got := sanitizeStatName(in); got != want {
			t.Errorf("sanitizeStatName(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzStatNames: whatever a request's values or the operator's tags
// hold, a stat's name is one statsd name: no line break, no ':' or '|'
// that would start a value or a type.
func FuzzStatNames(f *testing.F) {
	for _, s := range []string{"web.k", "web.remote_address_10.0.0.1", "a\nb:1|c", "zone:eu.west,cluster:c1", "k:v|x", ":", ",,"} {
		f.Add(s, s)
	}
	f.Fuzz(func(t *testing.T, key, tags string) {
		name := sanitizeStatName(key)
		if parsed, err := ParseTags(tags); err == nil {
			name += serializeTags(parsed)
		}
		if strings.ContainsAny(name, ":|\n\r") {
			t.Fatalf("name %q (from key %q, tags %q) breaks a statsd line", name, key, tags)
		}
	})
}
