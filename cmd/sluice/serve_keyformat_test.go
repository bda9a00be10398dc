package main

import (
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestServeRedis_ReferenceKeys: serve with the reference's environment
// (REDIS_URL, REDIS_PERSECOND, CACHE_KEY_PREFIX, its default jitter)
// counts in the reference's keys: a year's count the reference left in
// the main Redis carries on, a second's key goes to the per-second Redis;
// SLUICE_KEY_FORMAT=sluice opts out.
func TestServeRedis_ReferenceKeys(t *testing.T) {
	main, ps := redistest.Start(t), redistest.Start(t)
	cfg := writeConfig(t, `
domain: mig
descriptors:
  - {key: y, rate_limit: {unit: year, requests_per_unit: 10}}
  - {key: s, rate_limit: {unit: second, requests_per_unit: 10}}
`)
	env := serveEnv{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": main.Addr, "REDIS_PERSECOND": "true", "REDIS_PERSECOND_SOCKET_TYPE": "tcp",
		"REDIS_PERSECOND_URL": ps.Addr, "CACHE_KEY_PREFIX": "rl:"}
	const year = 365 * 86400
	yearKey := "rl:mig_y_x_" + strconv.FormatInt(time.Now().Unix()/year*year, 10)
	main.CLI("INCRBY", yearKey, "3")
	main.CLI("EXPIRE", yearKey, strconv.Itoa(year))

	addr, _, stop := startServe(t, env, "--config", cfg)
	rls, _ := dialRLS(t, addr)
	resp, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("mig", "y", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 6 {
		t.Errorf("remaining %d after the reference's 3 and this hit, want 6", got)
	}
	if got := main.CLI("GET", yearKey); got != "4" {
		t.Errorf("%s = %s, want 4", yearKey, got)
	}
	// (the reference's default jitter, 300 s: at most a year and 299 s)
	if ttl, err := strconv.Atoi(main.CLI("TTL", yearKey)); err != nil || ttl <= 0 || ttl > year+299 {
		t.Errorf("%s TTL %d (%v), want at most a year and 299 s", yearKey, ttl, err)
	}
	before := time.Now().Unix()
	if _, err := rls.ShouldRateLimit(testCtx(t), rlsRequest("mig", "s", "x")); err != nil {
		t.Fatal(err)
	}
	after := time.Now().Unix()
	keys := strings.Fields(ps.CLI("--scan", "--pattern", "rl:mig_s_x_*"))
	if len(keys) != 1 {
		t.Fatalf("per-second Redis holds %q, want one key rl:mig_s_x_<second>", keys)
	}
	if at, err := strconv.ParseInt(strings.TrimPrefix(keys[0], "rl:mig_s_x_"), 10, 64); err != nil || at < before-1 || at > after+1 {
		t.Errorf("per-second key %s, want the second of the request, %d to %d (a second either way: the limiter's clock)", keys[0], before, after)
	}
	if got := ps.CLI("GET", keys[0]); got != "1" {
		t.Errorf("%s = %s, want 1", keys[0], got)
	}
	if got := main.CLI("--scan", "--pattern", "rl:mig_s_*"); got != "" {
		t.Errorf("main Redis holds %q, want no per-second key", got)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	// Opting out: Sluice's keys, the reference's count left alone.
	env["SLUICE_KEY_FORMAT"] = "sluice"
	addr, _, _ = startServe(t, env, "--config", cfg)
	rls, _ = dialRLS(t, addr)
	if resp, err = rls.ShouldRateLimit(testCtx(t), rlsRequest("mig", "y", "x")); err != nil {
		t.Fatal(err)
	}
	if got := resp.Statuses[0].LimitRemaining; got != 9 {
		t.Errorf("with SLUICE_KEY_FORMAT=sluice: remaining %d, want 9 (a counter of Sluice's own)", got)
	}
	if got := main.CLI("GET", yearKey); got != "4" {
		t.Errorf("with SLUICE_KEY_FORMAT=sluice: %s = %s, want 4", yearKey, got)
	}
}

// --key-format reference applies to the shared stores only: the memory
// store shares nothing with the reference's pods, and a reference key,
// which leaves the unit and the window's start to the store, would mix a
// descriptor's rules there.
func TestKeyFormat_SharedStoresOnly(t *testing.T) {
	for store, want := range map[string]bool{"memory": false, "redis": true, "memcache": true} {
		c := newServeCmd(io.Discard)
		if err := c.fs.Parse([]string{"--key-format", "reference", "--store", store}); err != nil {
			t.Fatal(err)
		}
		lopts, _, err := c.flags.check()
		if err != nil {
			t.Fatalf("%s: %v", store, err)
		}
		if lopts.ReferenceKeys != want {
			t.Errorf("--store %s --key-format reference: reference keys %v, want %v", store, lopts.ReferenceKeys, want)
		}
	}
}
