package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// perSecondConfig has limits of unit second (tb: a token bucket that
// refills one token per 50 s, so that its count holds still for a test;
// fw: a plain per-second window, the reference's kind) and limits of an
// hour.
const perSecondConfig = `domain: ps
descriptors:
  - key: tb
    rate_limit: {unit: second, unit_multiplier: 50, requests_per_unit: 1, algorithm: token_bucket, burst: 3}
  - key: fw
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: hour
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: hour5
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// psAsk sends one request of descriptors (each a key and its value) and
// returns the overall code and each descriptor's remaining.
func psAsk(t *testing.T, rls rlspb.RateLimitServiceClient, kv ...string) (rlspb.RateLimitResponse_Code, []uint32) {
	t.Helper()
	req := &rlspb.RateLimitRequest{Domain: "ps"}
	for i := 0; i+1 < len(kv); i += 2 {
		req.Descriptors = append(req.Descriptors, desc(kv[i], kv[i+1]))
	}
	resp, err := rls.ShouldRateLimit(testCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	var rem []uint32
	for _, s := range resp.Statuses {
		rem = append(rem, s.LimitRemaining)
	}
	return resp.OverallCode, rem
}

// metricValue is the value of the series line (name and labels) in a
// /metrics page, -1 when it is missing.
func metricValue(page, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(page)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestServeRedis_PerSecond: with --redis-persecond-url, the limits of unit
// second live in the second Redis only, the others in the first; a
// request on both is all-or-nothing across them; the second Redis down
// answers by the failure mode the requests that need it, and only those.
func TestServeRedis_PerSecond(t *testing.T) {
	main, ps := redistest.Start(t), redistest.Start(t)
	grpcAddr, httpAddr, _ := startServe(t, nil, "--config", writeConfig(t, perSecondConfig), "--store", "redis", "--rlqs=false",
		"--redis-url", "redis://"+main.Addr, "--redis-persecond-url", "redis://"+ps.Addr, "--redis-key-prefix", "p:",
		"--redis-failure-mode", "deny", "--redis-health", "--redis-timeout", storeTimeout, "--redis-persecond-timeout", storeTimeout)
	rls, hc := dialRLS(t, grpcAddr)
	calls := func() (mainCalls, psCalls float64) {
		page := httpGet(t, "http://"+httpAddr+"/metrics")
		return metricValue(page, `sluice_redis_call_duration_seconds_count{result="ok"}`),
			metricValue(page, `sluice_redis_persecond_call_duration_seconds_count{result="ok"}`)
	}
	step := func(name string, wantCode rlspb.RateLimitResponse_Code, wantRem []uint32, kv ...string) {
		t.Helper()
		code, rem := psAsk(t, rls, kv...)
		if code != wantCode || !slices.Equal(rem, wantRem) {
			t.Fatalf("%s: %v %v, want %v %v", name, code, rem, wantCode, wantRem)
		}
	}

	// Each request goes to the Redis of its limit's unit.
	step("fw", rlspb.RateLimitResponse_OK, []uint32{99}, "fw", "a")
	if m, p := calls(); m > 0 || p != 1 {
		t.Errorf("after a per-second request: %v calls to the main Redis, %v to the per-second one; want 0 and 1", m, p)
	}
	step("tb", rlspb.RateLimitResponse_OK, []uint32{2}, "tb", "a")
	step("hour", rlspb.RateLimitResponse_OK, []uint32{0}, "hour", "a")
	if m, p := calls(); m != 1 || p != 2 {
		t.Errorf("%v calls to the main Redis, %v to the per-second one; want 1 and 2", m, p)
	}
	if got := main.CLI("keys", "*"); got != "p:ps|hour=a|fw:3600s" {
		t.Errorf("main Redis's keys: %q, want the hour's alone", got)
	}
	// The per-second window's key may have expired already.
	if got := ps.CLI("keys", "p:ps|tb*"); got != "p:ps|tb=a|tb:1/50s:3" {
		t.Errorf("per-second Redis's keys: %q, want the token bucket's", got)
	}
	if got := ps.CLI("keys", "p:ps|hour*"); got != "" {
		t.Errorf("per-second Redis holds %q", got)
	}

	// All-or-nothing across the two: the hour (main) denies, the token
	// bucket's take (per-second) is given back; then the token bucket
	// denies and the take of hour5 is given back.
	step("tb with a spent hour", rlspb.RateLimitResponse_OVER_LIMIT, []uint32{2, 0}, "tb", "a", "hour", "a")
	step("tb alone", rlspb.RateLimitResponse_OK, []uint32{1}, "tb", "a")
	step("tb alone", rlspb.RateLimitResponse_OK, []uint32{0}, "tb", "a")
	step("hour5 with a spent tb", rlspb.RateLimitResponse_OVER_LIMIT, []uint32{0, 5}, "tb", "a", "hour5", "a")
	step("hour5 alone", rlspb.RateLimitResponse_OK, []uint32{4}, "hour5", "a")

	// The per-second Redis down: its requests get the failure mode
	// (deny), the others are served, and a request on both takes nothing
	// from the main Redis.
	ps.Kill()
	for i := range 3 {
		step("tb with the per-second Redis down "+strconv.Itoa(i), rlspb.RateLimitResponse_OVER_LIMIT, []uint32{0}, "tb", "b")
		step("tb and hour5 with the per-second Redis down "+strconv.Itoa(i), rlspb.RateLimitResponse_OVER_LIMIT, []uint32{0, 0}, "tb", "b", "hour5", "a")
	}
	step("hour5 with the per-second Redis down", rlspb.RateLimitResponse_OK, []uint32{3}, "hour5", "a")
	serving := func() bool {
		r, err := hc.Check(testCtx(t), &healthpb.HealthCheckRequest{})
		return err == nil && r.Status == healthpb.HealthCheckResponse_SERVING
	}
	waitUntil(t, mustWithin, "NOT_SERVING with the per-second Redis down", func() bool { return !serving() })
	page := httpGet(t, "http://"+httpAddr+"/metrics")
	if up, psUp := metricValue(page, "sluice_redis_up"), metricValue(page, "sluice_redis_persecond_up"); up != 1 || psUp != 0 {
		t.Errorf("sluice_redis_up %v, sluice_redis_persecond_up %v; want 1 and 0", up, psUp)
	}
	if f := metricValue(page, "sluice_redis_persecond_failed_takes_total"); f < 1 {
		t.Errorf("sluice_redis_persecond_failed_takes_total %v", f)
	}
	if f := metricValue(page, "sluice_redis_persecond_split_refund_failures_total"); f != 0 {
		t.Errorf("sluice_redis_persecond_split_refund_failures_total %v", f)
	}
	ov := httpGet(t, "http://"+httpAddr+"/ui/api/overview")
	for _, want := range []string{`"healthy":false`, `"per-second deployment"`, `"per-second state","value":"down"`, `"state","value":"up"`, ps.Addr} {
		if !strings.Contains(ov, want) {
			t.Errorf("status page's overview lacks %s:\n%s", want, ov)
		}
	}

	ps.Restart()
	waitUntil(t, mustWithin, "SERVING with the per-second Redis back", serving)
	step("tb after the per-second Redis is back", rlspb.RateLimitResponse_OK, []uint32{2}, "tb", "b")
}

// TestBinary_RedisPerSecondEnv starts the binary with the reference's
// REDIS_PERSECOND and each REDIS_PERSECOND_* variable (with a per-second
// Redis of each kind: TCP, unix socket, password, Sentinel, Cluster, TLS)
// and checks that a limit of unit second is counted in that Redis and one
// of an hour in the main one.
func TestBinary_RedisPerSecondEnv(t *testing.T) {
	main := redistest.Start(t)
	sockDir, err := os.MkdirTemp("", "ps") // a short path: a socket's is at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "ps.sock")

	ca, certDir := testcert.NewCA(t), t.TempDir()
	caFile := ca.WriteFile(t, certDir)
	clientCert, clientKey := ca.Client(t).WriteFiles(t, certDir, "client")
	// A certificate for another name than the address Sluice dials.
	otherCert, otherKey := ca.Server(t, "redis.elsewhere.example").WriteFiles(t, certDir, "other")

	cases := []struct {
		name  string
		start func(t *testing.T) (env map[string]string, keys func() string)
	}{
		{"single", func(t *testing.T) (map[string]string, func() string) {
			ps := redistest.Start(t)
			return map[string]string{"REDIS_PERSECOND_URL": ps.Addr, "REDIS_PERSECOND_SOCKET_TYPE": "tcp", "REDIS_PERSECOND_TYPE": "single",
				"REDIS_PERSECOND_POOL_SIZE": "5", "REDIS_PERSECOND_TIMEOUT": "3s", "REDIS_PERSECOND_PIPELINE_WINDOW": "100us",
				"REDIS_PERSECOND_PIPELINE_LIMIT": "8", "REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM": "2",
				"REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR": "ERROR"}, func() string { return ps.CLI("keys", "*") }
		}},
		{"unix", func(t *testing.T) (map[string]string, func() string) {
			ps := redistest.Start(t, "--unixsocket", sock, "--unixsocketperm", "700")
			return map[string]string{"REDIS_PERSECOND_SOCKET_TYPE": "unix", "REDIS_PERSECOND_URL": sock}, func() string { return ps.CLI("keys", "*") }
		}},
		{"auth", func(t *testing.T) (map[string]string, func() string) {
			ps := redistest.Start(t, "--requirepass", "ps-secret")
			return map[string]string{"REDIS_PERSECOND_URL": ps.Addr, "REDIS_PERSECOND_AUTH": "ps-secret"},
				func() string { return ps.CLI("--no-auth-warning", "-a", "ps-secret", "keys", "*") }
		}},
		{"sentinel", func(t *testing.T) (map[string]string, func() string) {
			s := redistest.StartSentinel(t)
			s.Sentinel.CLI("acl", "setuser", "default", "on", ">sentinel-secret")
			return map[string]string{"REDIS_PERSECOND_TYPE": "SENTINEL", "REDIS_PERSECOND_URL": s.MasterSet + "," + s.Sentinel.Addr,
				"REDIS_PERSECOND_SENTINEL_AUTH": "sentinel-secret"}, func() string { return s.Master.CLI("keys", "*") }
		}},
		{"cluster", func(t *testing.T) (map[string]string, func() string) {
			c := redistest.StartCluster(t, 3)
			return map[string]string{"REDIS_PERSECOND_TYPE": "CLUSTER", "REDIS_PERSECOND_URL": strings.Join(c.Seeds(), ",")},
				func() string {
					var keys []string
					for _, n := range c.Nodes {
						if k := n.CLI("keys", "*"); k != "" {
							keys = append(keys, k)
						}
					}
					return strings.Join(keys, "\n")
				}
		}},
		// The reference's one set of TLS files serves its per-second Redis
		// too; REDIS_TLS_SKIP_HOSTNAME_VERIFICATION accepts a certificate
		// of another name.
		{"tls", func(t *testing.T) (map[string]string, func() string) {
			ps := redistest.StartTLS(t, otherCert, otherKey, caFile)
			return map[string]string{"REDIS_PERSECOND_URL": ps.Addr, "REDIS_PERSECOND_TLS": "true", "REDIS_TLS_CACERT": caFile,
				"REDIS_TLS_CLIENT_CERT": clientCert, "REDIS_TLS_CLIENT_KEY": clientKey, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}, nil
		}},
	}
	config := writeConfig(t, perSecondConfig)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env, keys := c.start(t)
			env["REDIS_URL"], env["REDIS_PERSECOND"], env["REDIS_TIMEOUT"] = main.Addr, "true", storeTimeout
			if env["REDIS_PERSECOND_TIMEOUT"] == "" {
				env["REDIS_PERSECOND_TIMEOUT"] = storeTimeout
			}
			env["CACHE_KEY_PREFIX"] = c.name + ":"
			p := startRefEnv(t, env, "--config", config)
			rls, _ := dialRLS(t, p.grpcAddr)
			if code, rem := psAsk(t, rls, "tb", "x", "hour", "x"); code != rlspb.RateLimitResponse_OK || !slices.Equal(rem, []uint32{2, 0}) {
				t.Fatalf("first request: %v %v", code, rem)
			}
			page := httpGet(t, "http://"+p.httpAddr+"/metrics")
			if n := metricValue(page, `sluice_redis_persecond_call_duration_seconds_count{result="ok"}`); n != 1 {
				t.Errorf("%v calls to the per-second Redis, want 1", n)
			}
			if keys != nil {
				if got, want := keys(), c.name+":ps|tb=x|tb:1/50s:3"; got != want {
					t.Errorf("per-second Redis's keys: %q, want %q", got, want)
				}
			}
			// The reference's environment counts its fixed windows in its
			// keys (docs/MIGRATION.md): prefix, domain_key_value_, the
			// window's start; the token bucket above keeps Sluice's.
			got := main.CLI("keys", c.name+":ps*")
			start, err := strconv.ParseInt(strings.TrimPrefix(got, c.name+":ps_hour_x_"), 10, 64)
			if !strings.HasPrefix(got, c.name+":ps_hour_x_") || err != nil || start%3600 != 0 {
				t.Errorf("main Redis's keys: %q, want %q and the hour's start", got, c.name+":ps_hour_x_")
			}
			if c.name == "tls" && !strings.Contains(p.log(), "tls-skip-hostname-verification") {
				t.Errorf("no warning about the skipped hostname check:\n%s", p.log())
			}
			if c.name == "single" && !strings.Contains(p.log(), `msg="redis store (per-second limits)" deployment=single timeout=3s`) {
				t.Errorf("REDIS_PERSECOND_TIMEOUT not in force:\n%s", p.log())
			}
		})
	}
}

// startRefEnv starts the binary with the reference's environment env (and
// no SLUICE_* but the log's) and args.
func startRefEnv(t *testing.T, env map[string]string, args ...string) *sluiceProc {
	t.Helper()
	args = append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...)
	cmd := redistest.Command(sluiceBinary(t), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "SLUICE_LOG_LEVEL=info", "SLUICE_LOG_FORMAT=text"}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return startCmd(t, cmd)
}

// TestBinary_RedisTLSSkipHostnameVerification: REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true
// accepts a Redis certificate of another name than the address, signed by
// REDIS_TLS_CACERT, with a warning; without it that certificate is
// refused, and with it a certificate of another CA still is.
func TestBinary_RedisTLSSkipHostnameVerification(t *testing.T) {
	ca, dir := testcert.NewCA(t), t.TempDir()
	caFile := ca.WriteFile(t, dir)
	clientCert, clientKey := ca.Client(t).WriteFiles(t, dir, "client")
	otherName, otherNameKey := ca.Server(t, "redis.elsewhere.example").WriteFiles(t, dir, "other-name")
	stranger := testcert.NewCA(t)
	strangerCert, strangerKey := stranger.Server(t).WriteFiles(t, t.TempDir(), "stranger")
	misnamed := redistest.StartTLS(t, otherName, otherNameKey, caFile)
	foreign := redistest.StartTLS(t, strangerCert, strangerKey, caFile)
	config := writeConfig(t, perSecondConfig)
	env := func(addr, skip string) map[string]string {
		e := map[string]string{"REDIS_URL": addr, "REDIS_TLS": "true", "REDIS_TLS_CACERT": caFile,
			"REDIS_TLS_CLIENT_CERT": clientCert, "REDIS_TLS_CLIENT_KEY": clientKey, "REDIS_TIMEOUT": storeTimeout}
		if skip != "" {
			e["REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"] = skip
		}
		return e
	}

	p := startRefEnv(t, env(misnamed.Addr, "true"), "--config", config)
	rls, _ := dialRLS(t, p.grpcAddr)
	if code, rem := psAsk(t, rls, "hour", "x"); code != rlspb.RateLimitResponse_OK || !slices.Equal(rem, []uint32{0}) {
		t.Fatalf("request over TLS to a Redis of another name: %v %v", code, rem)
	}
	if !strings.Contains(p.log(), "level=WARN") || !strings.Contains(p.log(), "--redis-tls-skip-hostname-verification") {
		t.Errorf("no warning at startup:\n%s", p.log())
	}

	for _, c := range []struct {
		name, addr, skip, want string
	}{
		{"name checked by default", misnamed.Addr, "", "cannot validate certificate for 127.0.0.1"},
		{"chain checked when the name is not", foreign.Addr, "true", "certificate signed by unknown authority"},
	} {
		cmd := redistest.Command(sluiceBinary(t), "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--config", config)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for k, v := range env(c.addr, c.skip) {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: exit %v, want a failure about %q:\n%s", c.name, err, c.want, out)
		}
	}
}
