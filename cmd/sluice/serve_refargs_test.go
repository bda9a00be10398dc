package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
)

// TestRefArgs: the flags serve knows are kept with their values; the
// others, their values and positional arguments are dropped, the flags
// named.
func TestRefArgs(t *testing.T) {
	for _, c := range []struct {
		args, kept, flags []string
		positional        int
	}{
		// Envoy AI Gateway's QuotaPolicy Deployment.
		{[]string{"--quotaRateLimitServiceHost=envoy-ai-gateway-ratelimit.envoy-gateway-system"}, nil, []string{"--quotaRateLimitServiceHost"}, 0},
		{[]string{"--log-level", "debug", "--strict-peeks", "--foo", "bar", "pos", "-config=x", "--", "a", "-b"},
			[]string{"--log-level", "debug", "--strict-peeks", "-config=x"}, []string{"--foo"}, 3},
		{[]string{"--unknown", "--log-level", "info", "-v"}, []string{"--log-level", "info"}, []string{"--unknown", "--v"}, 0},
		{[]string{"--strict-peeks=false", "positional", "-h"}, []string{"--strict-peeks=false", "-h"}, nil, 1},
		{[]string{"--help"}, []string{"--help"}, nil, 0},
		{nil, nil, nil, 0},
	} {
		kept, ignored := refArgs(newServeCmd(io.Discard).fs, c.args)
		if !slices.Equal(kept, c.kept) || !slices.Equal(ignored.flags, c.flags) || ignored.positional != c.positional {
			t.Errorf("refArgs(%q) = %q, flags %q, %d positional; want %q, %q, %d", c.args, kept, ignored.flags, ignored.positional, c.kept, c.flags, c.positional)
		}
	}
}

// TestServeRef_Args: as ratelimit, the flags serve knows apply, the rest
// is named in one warning that shows no value; serve itself stays strict.
func TestServeRef_Args(t *testing.T) {
	c := newServeCmd(io.Discard)
	var logs bytes.Buffer
	args, ignored := refArgs(c.fs, []string{"--quotaRateLimitServiceHost=secret-host", "--strict-peeks", "--grpc-addr", "127.0.0.1:0", "--token", "s3cret", "extra"})
	c.ignored = ignored
	if _, err := c.parse(args, serveEnv{}.get, &logs); err != nil {
		t.Fatal(err)
	}
	if flagValue(c.fs, "strict-peeks") != "true" || flagValue(c.fs, "grpc-addr") != "127.0.0.1:0" {
		t.Errorf("known flags: --strict-peeks %s --grpc-addr %s", flagValue(c.fs, "strict-peeks"), flagValue(c.fs, "grpc-addr"))
	}
	log := logs.String()
	if strings.Count(log, "level=WARN") != 1 || !strings.Contains(log, `flags="--quotaRateLimitServiceHost --token" positional=1`) {
		t.Errorf("want one warning naming the flags:\n%s", log)
	}
	for _, v := range []string{"secret-host", "s3cret", "extra"} {
		if strings.Contains(log, v) {
			t.Errorf("the warning shows the value %q:\n%s", v, log)
		}
	}

	// sluice serve refuses what ratelimit ignores.
	err := serve(context.Background(), []string{"--quotaRateLimitServiceHost=h"}, serveEnv{}.get, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "flag provided but not defined") {
		t.Errorf("serve with an unknown flag: %v", err)
	}
	// -h prints the flags and stops, as ratelimit too.
	var help bytes.Buffer
	if err := serveRef(context.Background(), []string{"--unknown", "-h"}, serveEnv{}.get, &help, nil); !errors.Is(err, flag.ErrHelp) || !strings.Contains(help.String(), "-strict-peeks") {
		t.Errorf("ratelimit -h: %v\n%s", err, help.String())
	}
}
