package main

import (
	"slices"
	"testing"
)

// TestMainArgs: installed as ratelimit (the reference's binary name), the
// binary runs the ratelimit command (serve, ignoring the arguments it does
// not know), unless its first argument names a subcommand or asks for
// help; as sluice, nothing changes.
func TestMainArgs(t *testing.T) {
	cases := []struct {
		argv, want []string
	}{
		{[]string{"/bin/ratelimit"}, []string{"ratelimit"}},
		{[]string{"ratelimit"}, []string{"ratelimit"}},
		{[]string{"/usr/local/bin/ratelimit", "--log-level", "debug"}, []string{"ratelimit", "--log-level", "debug"}},
		{[]string{"/bin/ratelimit", "--quotaRateLimitServiceHost=h"}, []string{"ratelimit", "--quotaRateLimitServiceHost=h"}},
		{[]string{"/bin/ratelimit", "whatever", "-x"}, []string{"ratelimit", "whatever", "-x"}},
		{[]string{"/bin/ratelimit", "check", "--config", "x"}, []string{"check", "--config", "x"}},
		{[]string{"/bin/ratelimit", "serve", "--x"}, []string{"serve", "--x"}},
		{[]string{"/bin/ratelimit", "-h"}, []string{"-h"}},
		{[]string{"/bin/ratelimit", "--help"}, []string{"--help"}},
		{[]string{"/bin/sluice"}, []string{}},
		{[]string{"/bin/sluice", "serve"}, []string{"serve"}},
		{[]string{"/bin/ratelimit-old"}, []string{}},
		{nil, nil},
	}
	for _, c := range cases {
		if got := mainArgs(c.argv); !slices.Equal(got, c.want) {
			t.Errorf("mainArgs(%q) = %q, want %q", c.argv, got, c.want)
		}
	}
}
