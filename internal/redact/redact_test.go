package redact

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestAddr(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"redis://user:hunter2@redis:6379/0", "redis://user:xxxxx@redis:6379/0"},
		{"rediss://:hunter2@redis:6379", "rediss://:xxxxx@redis:6379"},
		{"redis://hunter2@redis:6379", "redis://xxxxx@redis:6379"},
		{"redis://redis:6379", "redis://redis:6379"},
		{"unix:///run/redis.sock?db=2", "unix:///run/redis.sock?db=2"},
		{"redis:6379", "redis:6379"},
		{"user:hunter2@redis:6379", "user:xxxxx@redis:6379"},
		// Malformed: a password with '/', '@' or a bad escape in it.
		{"redis://u:hun/ter@2@redis:6379", "redis://u:xxxxx@redis:6379"},
		{"redis://u:pa%zzss@redis:6379", "redis://u:xxxxx@redis:6379"},
		{"dns:///xds.example:18000", "dns:///xds.example:18000"},
		{"", ""},
	} {
		if got := Addr(tc.in); got != tc.want {
			t.Errorf("Addr(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	if got := Addrs("a:1,u:secret@b:2, c:3"); got != "a:1,u:xxxxx@b:2, c:3" {
		t.Errorf("Addrs = %q", got)
	}
}

func TestArgs(t *testing.T) {
	kind := func(name string) Kind {
		switch name {
		case "redis-password", "xds-headers":
			return Secret
		case "redis-url", "redis-cluster":
			return Address
		}
		return Plain
	}
	in := []string{"/bin/sluice", "serve", "--redis-password", "hunter2", "-redis-password=hunter3",
		"--redis-url=redis://u:hunter4@r:6379", "-redis-cluster", "a:1,u:hunter5@b:2", "--xds-headers=authorization:Bearer hunter6",
		"--config", "limits/", "--", "--redis-password", "positional"}
	want := []string{"/bin/sluice", "serve", "--redis-password", "xxxxx", "-redis-password=xxxxx",
		"--redis-url=redis://u:xxxxx@r:6379", "-redis-cluster", "a:1,u:xxxxx@b:2", "--xds-headers=xxxxx",
		"--config", "limits/", "--", "--redis-password", "positional"}
	got := Args(in, kind)
	if !slices.Equal(got, want) {
		t.Errorf("Args =\n%q\nwant\n%q", got, want)
	}
	if strings.Contains(in[3], "x") {
		t.Error("Args changed its input")
	}
	// A secret flag last, without its value: nothing to hide, no panic.
	if got := Args([]string{"p", "--redis-password"}, kind); !slices.Equal(got, []string{"p", "--redis-password"}) {
		t.Errorf("Args = %q", got)
	}
}

func FuzzAddr(f *testing.F) {
	for _, s := range []string{"redis://u:p@h:1", "u:p@h", "a@b@c", "://@", "@"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := Addr(s)
		at := strings.LastIndexByte(s, '@')
		if at < 0 {
			if got != s {
				t.Errorf("Addr(%q) = %q, want it unchanged", s, got)
			}
			return
		}
		// What precedes the user information and what follows it stay;
		// the user information becomes user:Mask, or Mask.
		start := userStart(s, at)
		if !strings.HasPrefix(got, s[:start]) || !strings.HasSuffix(got, s[at:]) || len(got) < start+len(s)-at {
			t.Fatalf("Addr(%q) = %q changed more than the user information", s, got)
		}
		user, _, hasPass := strings.Cut(s[start:at], ":")
		want := Mask
		if hasPass {
			want = user + ":" + Mask
		}
		if mid := got[start : len(got)-(len(s)-at)]; mid != want {
			t.Errorf("Addr(%q) = %q: user information %q, want %q", s, got, mid, want)
		}
	})
}

func TestError(t *testing.T) {
	raw := "redis://u:hunter2@r:notaport"
	inner := &url.Error{Op: "parse", URL: raw, Err: errors.New("invalid port")}
	err := Error(fmt.Errorf("redis: url: %w", inner), raw)
	var ue *url.Error
	if strings.Contains(err.Error(), "hunter2") || !strings.Contains(err.Error(), "u:xxxxx@r:notaport") || !errors.As(err, &ue) {
		t.Errorf("Error = %q (unwraps to *url.Error: %v)", err, errors.As(err, &ue))
	}
	if e := errors.New("x"); Error(e, "r:6379") != e || Error(nil, raw) != nil {
		t.Error("Error wrapped an error with nothing to hide")
	}
}

// TestError_EscapedPasswords: a URL whose password a parser's error
// quotes escaped (url.Error quotes with %q: '"' becomes \", '\' becomes
// \\) is described without the password in any form, as is an error that
// quotes the URL some other way; errors.As still finds the *url.Error.
func TestError_EscapedPasswords(t *testing.T) {
	for _, raw := range []string{
		`redis://:pa"ss@r:6379`,
		`redis://:pa\ss@r:6379`,
		`rediss://u:p"w\d@r:6380/0`,
		`redis://u:hunter2@r:notaport`,
		`redis://hunter"2@r:6379`,
		`https://user:s"ecret@collector:4318/v1/traces`,
		`pa"ss@sentinel:26379`,
	} {
		at := strings.LastIndexByte(raw, '@')
		info := raw[userStart(raw, at):at]
		if _, p, ok := strings.Cut(info, ":"); ok {
			info = p
		}
		q := strconv.Quote(info)
		secretForms := []string{info, q[1 : len(q)-1]}
		errs := []error{fmt.Errorf("dial %q: connection refused", raw), fmt.Errorf("dial %s: connection refused", raw)}
		if _, perr := url.Parse(raw); perr != nil {
			errs = append(errs, perr, fmt.Errorf("redis: url: %w", perr))
		}
		for _, err := range errs {
			got := Error(err, raw)
			for _, f := range secretForms {
				if strings.Contains(got.Error(), f) {
					t.Errorf("Error(%q, %q) = %q: holds %q", err, raw, got, f)
				}
			}
			if !strings.Contains(got.Error(), Addr(raw)) && !strings.Contains(got.Error(), strconv.Quote(Addr(raw))) {
				t.Errorf("Error(%q, %q) = %q: does not name %q", err, raw, got, Addr(raw))
			}
			var ue *url.Error
			if errors.As(err, &ue) && !errors.As(got, &ue) {
				t.Errorf("Error(%q) unwraps to no *url.Error", err)
			}
		}
	}
}
