package main

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	ratelimitv3pb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// TestBinary_RedisLater is issue 31's Redis down at start, end to end:
// /bin/ratelimit (the binary under that name) with the argument and the
// environment of Envoy AI Gateway's QuotaPolicy Deployment (limits over
// xDS under the node id envoy-ai-gateway-ratelimit, Redis over TCP)
// starts before its Redis exists, serves with health NOT_SERVING (gRPC
// and /healthcheck) and answers by the failure mode (the reference's,
// UNAVAILABLE), logs the wait, and once Redis is started turns SERVING
// and counts in Redis, without a restart. Before, it exited: "store
// redis: redis: connect: ... connection refused".
func TestBinary_RedisLater(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, an xDS server and a sluice process")
	}
	const node = "envoy-ai-gateway-ratelimit"
	xs := xdstest.Start(t, "127.0.0.1:0", nil)
	rdb := redistest.Start(t)
	rdb.Kill() // its port is free again: nothing listens there yet

	bin, err := filepath.Abs(sluiceBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	ratelimit := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(bin, ratelimit); err != nil {
		t.Fatal(err)
	}
	// The Deployment's argument, which the reference ignores.
	cmd := exec.Command(ratelimit, "--quotaRateLimitServiceHost=envoy-ai-gateway-ratelimit.envoy-gateway-system")
	cmd.Env = []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID=" + node, "CONFIG_GRPC_XDS_SERVER_URL=" + xs.Addr,
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=127.0.0.1:" + strconv.Itoa(rdb.Port), "BACKEND_TYPE=redis",
		// The test's own: loopback, any free port.
		"HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=0",
		"REDIS_TIMEOUT=" + storeTimeout}
	p := startCmd(t, cmd)
	rls, hc := dialRLS(t, p.grpcAddr)
	ctx := testCtx(t)

	// (An hour: the counts must not meet a window's end.)
	xs.Push(t, node, "1", &ratelimitpb.RateLimitConfig{Name: "quota", Domain: "ai-gateway", Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "backend", Value: "openai", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: 2}}}})
	if r := xs.Reply(t); r.GetErrorDetail() != nil || r.GetVersionInfo() != "1" {
		t.Fatalf("xDS reply %v, want the ACK of version 1", r)
	}
	healthcheck := func() int {
		t.Helper()
		res, err := http.Get("http://" + p.httpAddr + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	req := &rlspb.RateLimitRequest{Domain: "ai-gateway", Descriptors: []*ratelimitv3pb.RateLimitDescriptor{{
		Entries: []*ratelimitv3pb.RateLimitDescriptor_Entry{{Key: "backend", Value: "openai"}}}}}

	// Redis is not up: limits loaded, yet NOT_SERVING, and calls fail by
	// the failure mode.
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health before Redis: %v %v, want NOT_SERVING", r, err)
	}
	if code := healthcheck(); code != http.StatusServiceUnavailable {
		t.Errorf("/healthcheck before Redis: %d, want 503", code)
	}
	if _, err := rls.ShouldRateLimit(ctx, req); status.Code(err) != codes.Unavailable {
		t.Errorf("ShouldRateLimit before Redis: %v, want UNAVAILABLE (the failure mode)", err)
	}
	if !strings.Contains(p.log(), `msg="redis not reachable yet: answering by the failure mode and retrying"`) {
		t.Errorf("no WARN of the wait in the log:\n%s", p.log())
	}

	rdb.Restart()
	waitServing(t, hc)
	if code := healthcheck(); code != http.StatusOK {
		t.Errorf("/healthcheck once Redis is up: %d, want 200", code)
	}
	for i, want := range []rlspb.RateLimitResponse_Code{rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT} {
		r, err := rls.ShouldRateLimit(ctx, req)
		if err != nil || r.OverallCode != want {
			t.Fatalf("request %d once Redis is up: %v %v, want %v", i, r, err, want)
		}
	}
	if keys := rdb.CLI("dbsize"); strings.TrimSpace(keys) == "0" {
		t.Errorf("no key in Redis after the requests: %q", keys)
	}
	if !strings.Contains(p.log(), `msg="redis reachable: connected"`) {
		t.Errorf("no INFO of the connection in the log:\n%s", p.log())
	}
}

// TestServe_StoresLater: `sluice serve` with a per-second Redis, and with
// memcached, not up at startup: NOT_SERVING until each store first
// answers (the main Redis is up: health waits for the per-second one
// too), answers by the failure mode meanwhile, then SERVING and counting
// without a restart.
func TestServe_StoresLater(t *testing.T) {
	main, ps, mc := redistest.Start(t), redistest.Start(t), memcachetest.Start(t)
	ps.Kill()
	mc.Kill()
	for _, c := range []struct {
		name    string
		args    []string
		restart func()
	}{
		{"per-second Redis", []string{"--store", "redis", "--redis-url", "redis://" + main.Addr, "--redis-persecond-url", "redis://" + ps.Addr,
			"--redis-timeout", storeTimeout, "--redis-persecond-timeout", storeTimeout}, ps.Restart},
		{"memcached", []string{"--store", "memcache", "--memcache-servers", mc.Addr, "--memcache-timeout", storeTimeout}, mc.Restart},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--config", writeConfig(t, perSecondConfig), "--rlqs=false", "--store-failure-mode", "deny"}, c.args...)
			grpcAddr, _, _ := startServe(t, nil, args...)
			rls, hc := dialRLS(t, grpcAddr)
			ctx := testCtx(t)
			if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING {
				t.Errorf("health before the store is up: %v %v, want NOT_SERVING", r, err)
			}
			if code, _ := psAsk(t, rls, "tb", "a"); code != rlspb.RateLimitResponse_OVER_LIMIT {
				t.Errorf("before the store is up: %v, want OVER_LIMIT (the failure mode deny)", code)
			}
			c.restart()
			waitServing(t, hc)
			if code, rem := psAsk(t, rls, "tb", "a"); code != rlspb.RateLimitResponse_OK || !slices.Equal(rem, []uint32{2}) {
				t.Errorf("once the store is up: %v %v, want OK [2]", code, rem)
			}
		})
	}
}
