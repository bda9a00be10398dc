package main

import (
	"slices"
	"testing"
)

// TestMainArgs: installed as ratelimit (the reference's binary name), no
// arguments or flags only mean serve; as sluice, nothing changes.
func TestMainArgs(t *testing.T) {
	cases := []struct {
		argv, want []string
	}{
		{[]string{"/bin/ratelimit"}, []string{"serve"}},
		{[]string{"ratelimit"}, []string{"serve"}},
		{[]string{"/usr/local/bin/ratelimit", "--log-level", "debug"}, []string{"serve", "--log-level", "debug"}},
		{[]string{"/bin/ratelimit", "check", "--config", "x"}, []string{"check", "--config", "x"}},
		{[]string{"/bin/ratelimit", "-h"}, []string{"-h"}},
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
