package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	ratelimitv3pb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/store"
	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// The reference's integration test of quota mode: its Envoy
// (examples/envoy/proxy.yaml) sends domain "rl"; the route /tokenquota
// peeks at service=service_2 (hits_addend 0) on the request path and
// charges it 1 when the stream is done; /multiservice-tokenquota peeks at
// service_1 and service_2 and charges the service that served the
// request, which Envoy picks by the response's dynamic metadata
// (service_with_quota.name, RESPONSE_DYNAMIC_METADATA=true). Its limits
// (examples/ratelimit/config/example.yaml), pushed here over xDS as Envoy
// AI Gateway's controller pushes them, with quota_mode and metadata.
const (
	tqDomain = "rl"
	tqNode   = "envoy-ai-gateway-ratelimit"
)

func tqLimits(t *testing.T) *ratelimitpb.RateLimitConfig {
	t.Helper()
	service := func(name string, perMinute uint32) *ratelimitpb.RateLimitDescriptor {
		md, err := structpb.NewStruct(map[string]any{"service_with_quota": map[string]any{"name": name}})
		if err != nil {
			t.Fatal(err)
		}
		return &ratelimitpb.RateLimitDescriptor{Key: "service", Value: name, QuotaMode: true, Metadata: md,
			RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute}}
	}
	return &ratelimitpb.RateLimitConfig{Name: tqDomain, Domain: tqDomain, Descriptors: []*ratelimitpb.RateLimitDescriptor{
		service("service_1", 1), service("service_2", 2)}}
}

// tqCall is one call of Envoy's filter: a descriptor service=s for each of
// services, each with its own hits_addend (0 on the request path, 1 once
// the stream is done).
func tqCall(hits uint64, services ...string) *rlspb.RateLimitRequest {
	r := &rlspb.RateLimitRequest{Domain: tqDomain}
	for _, s := range services {
		r.Descriptors = append(r.Descriptors, &ratelimitv3pb.RateLimitDescriptor{
			Entries:    []*ratelimitv3pb.RateLimitDescriptor_Entry{{Key: "service", Value: s}},
			HitsAddend: wrapperspb.UInt64(hits)})
	}
	return r
}

// tqStep is one curl of a script: the request path's peek and what the
// reference answers to it, then (if it passed) the charge of the service
// that served it.
type tqStep struct {
	newWindow bool // the script's "sleep 60" before it
	peek      []string
	code      rlspb.RateLimitResponse_Code
	statuses  []rlspb.RateLimitResponse_Code
	remaining []uint32 // the statuses' limit_remaining
	quota     string   // service_with_quota.name in the dynamic metadata; "" none
	charge    string   // the service charged after the response; "" when refused
}

var (
	tqOK   = rlspb.RateLimitResponse_OK
	tqOver = rlspb.RateLimitResponse_OVER_LIMIT
)

// tqScripts are the two scripts' curls and the reference's answers.
var tqScripts = []struct {
	name  string
	steps []tqStep
}{
	// token-quota.sh: service_2 has 2 a minute, charged after the
	// response: requests 1-3 pass (the third peeks at 2 used of 2), the
	// 4th is refused; a minute later the bucket is whole again.
	{"token-quota.sh", []tqStep{
		{peek: []string{"service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOK}, remaining: []uint32{2}, quota: "service_2", charge: "service_2"},
		{peek: []string{"service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOK}, remaining: []uint32{1}, quota: "service_2", charge: "service_2"},
		{peek: []string{"service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOK}, remaining: []uint32{0}, quota: "service_2", charge: "service_2"},
		{peek: []string{"service_2"}, code: tqOver, statuses: []rlspb.RateLimitResponse_Code{tqOver}, remaining: []uint32{0}},
		{newWindow: true, peek: []string{"service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOK}, remaining: []uint32{2}, quota: "service_2", charge: "service_2"},
	}},
	// multiservice-tokenquota.sh: service_1 has 1 a minute, service_2 2;
	// charged after the response, service_1 serves 2 requests, then
	// service_2 3, then the 6th is refused; a minute later service_1
	// serves again.
	{"multiservice-tokenquota.sh", []tqStep{
		{peek: []string{"service_1", "service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOK, tqOK}, remaining: []uint32{1, 2}, quota: "service_1", charge: "service_1"},
		{peek: []string{"service_1", "service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOK, tqOK}, remaining: []uint32{0, 2}, quota: "service_1", charge: "service_1"},
		{peek: []string{"service_1", "service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOver, tqOK}, remaining: []uint32{0, 2}, quota: "service_2", charge: "service_2"},
		{peek: []string{"service_1", "service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOver, tqOK}, remaining: []uint32{0, 1}, quota: "service_2", charge: "service_2"},
		{peek: []string{"service_1", "service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOver, tqOK}, remaining: []uint32{0, 0}, quota: "service_2", charge: "service_2"},
		{peek: []string{"service_1", "service_2"}, code: tqOver, statuses: []rlspb.RateLimitResponse_Code{tqOver, tqOver}, remaining: []uint32{0, 0}},
		{newWindow: true, peek: []string{"service_1", "service_2"}, code: tqOK, statuses: []rlspb.RateLimitResponse_Code{tqOK, tqOK}, remaining: []uint32{1, 2}, quota: "service_1", charge: "service_1"},
	}},
}

// quotaName is service_with_quota.name in a response's dynamic metadata,
// where Envoy's header mutation reads it
// (%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%).
func quotaName(r *rlspb.RateLimitResponse) string {
	return r.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].
		GetStructValue().GetFields()["name"].GetStringValue()
}

// TestServe_ReferenceTokenQuota replays the reference's
// integration-test/scripts/token-quota.sh and multiservice-tokenquota.sh
// (issue 31) as Envoy sends them, to serve started in process with the
// reference's environment (CONFIG_TYPE=GRPC_XDS_SOTW,
// RESPONSE_DYNAMIC_METADATA=true), its limits pushed by an xDS server
// with quota_mode and metadata, on the memory store, on Redis shared by
// three instances and on memcached shared by three: calls go to the
// instances in turn. Every answer is the reference's, and the dynamic
// metadata names the service that still has quota. The instances share
// a clock, moved forward to begin each script on a minute and to end the
// minute where the scripts sleep.
func TestServe_ReferenceTokenQuota(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, memcached, an xDS server and seven serves")
	}
	xs := xdstest.Start(t, "127.0.0.1:0", nil)
	xs.Push(t, tqNode, "1", tqLimits(t))
	rdb := redistest.Start(t)
	mc := memcachetest.Start(t)
	for _, c := range []struct {
		name string
		n    int
		env  serveEnv
	}{
		{"memory", 1, serveEnv{}},
		{"redis", 3, serveEnv{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rdb.Addr, "REDIS_TIMEOUT": storeTimeout}},
		{"memcache", 3, serveEnv{"BACKEND_TYPE": "memcache", "MEMCACHE_HOST_PORT": mc.Addr, "SLUICE_MEMCACHE_TIMEOUT": storeTimeout}},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := serveEnv{"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": xs.Addr, "CONFIG_GRPC_XDS_NODE_ID": tqNode,
				"RESPONSE_DYNAMIC_METADATA": "true", "USE_STATSD": "false", "LOG_LEVEL": "info",
				"HOST": "127.0.0.1", "PORT": "0", "GRPC_HOST": "127.0.0.1", "GRPC_PORT": "0"}
			for k, v := range c.env {
				env[k] = v
			}
			clock := store.NewWallClock()
			rls := make([]rlspb.RateLimitServiceClient, c.n)
			for i := range rls {
				logs := &logbuf.Buffer{}
				addr := startServeClock(t, env, clock, logs)
				rls[i], _ = dialRLS(t, addr)
				waitFor(t, func() bool { return strings.Contains(logs.String(), "xds: config applied (ACK)") }, "the ACK")
				if !strings.Contains(logs.String(), "store="+c.name) {
					t.Fatalf("not on the %s store:\n%s", c.name, logs)
				}
			}
			ctx := testCtx(t)
			calls := 0
			call := func(in *rlspb.RateLimitRequest) *rlspb.RateLimitResponse {
				t.Helper()
				i := calls % len(rls)
				calls++
				r, err := rls[i].ShouldRateLimit(ctx, in)
				if err != nil {
					t.Fatalf("instance %d: %v", i, err)
				}
				return r
			}
			for _, script := range tqScripts {
				// Each script on a minute of its own (the reference
				// runs them a minute apart or more).
				minute := nextMinute(clock)
				for i, s := range script.steps {
					if s.newWindow {
						minute = nextMinute(clock)
					}
					r := call(tqCall(0, s.peek...))
					var got []rlspb.RateLimitResponse_Code
					var left []uint32
					for _, st := range r.GetStatuses() {
						got = append(got, st.GetCode())
						left = append(left, st.GetLimitRemaining())
					}
					if r.GetOverallCode() != s.code || fmt.Sprint(got) != fmt.Sprint(s.statuses) || fmt.Sprint(left) != fmt.Sprint(s.remaining) || quotaName(r) != s.quota {
						t.Fatalf("%s: request-no %d: %v %v remaining %v, service_with_quota %q; the reference answers %v %v remaining %v, %q\n%v",
							script.name, i+1, r.GetOverallCode(), got, left, quotaName(r), s.code, s.statuses, s.remaining, s.quota, r)
					}
					if s.charge != "" {
						// Envoy routes by the metadata and charges the
						// service that served the request.
						call(tqCall(1, quotaName(r)))
					}
				}
				if now := clock.Now(); now >= minute+int64(time.Minute) {
					t.Fatalf("%s: the clock crossed a minute (began %d, now %d); the verdicts are not the script's", script.name, minute, now)
				}
			}
		})
	}
}

// nextMinute moves clock forward to the next whole minute and returns it.
func nextMinute(clock *store.WallClock) int64 {
	m := (clock.Now()/int64(time.Minute) + 1) * int64(time.Minute)
	clock.AtLeast(m)
	return m
}

// startServeClock starts serve in process with env and no arguments, as
// the reference's image runs, counting with clock; its log goes to logs.
// It returns the gRPC address.
func startServeClock(t *testing.T, env serveEnv, clock *store.WallClock, logs io.Writer) string {
	t.Helper()
	c := newServeCmd(logs)
	logger, err := c.parse(nil, env.get, logs)
	if err != nil {
		t.Fatal(err)
	}
	c.clock = clock
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- c.run(ctx, logger, func(g, _ net.Addr) { ready <- g.String() }) }()
	select {
	case a := <-ready:
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
		})
		return a
	case err := <-done:
		cancel()
		t.Fatalf("serve: %v\n%s", err, logs)
	case <-time.After(mustWithin):
		cancel()
		t.Fatal("serve did not start")
	}
	return ""
}

// TestServe_IgnoredFields: a field of a newer control plane's
// RateLimitConfig and one of a newer Envoy's request, which Sluice
// cannot use, are named in a WARN and counted in
// sluice_config_ignored_fields_total and sluice_rls_ignored_fields_total;
// the config applies and the request is answered without them.
func TestServe_IgnoredFields(t *testing.T) {
	xs := xdstest.Start(t, "127.0.0.1:0", nil)
	cfg := tqLimits(t)
	cfg.Descriptors[0].ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1))
	xs.Push(t, tqNode, "1", cfg)
	logs := &logbuf.Buffer{}
	grpcAddr, httpAddr := startServeLogged(t, nil, logs, "--config-source", "xds", "--xds-server", xs.Addr, "--xds-node-id", tqNode,
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
	waitFor(t, func() bool { return strings.Contains(logs.String(), "xds: config applied (ACK)") }, "the ACK")
	rls, _ := dialRLS(t, grpcAddr)
	in := tqCall(0, "service_1")
	in.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 7, protowire.VarintType), 1))
	for range 2 {
		if r, err := rls.ShouldRateLimit(testCtx(t), in); err != nil || r.GetOverallCode() != tqOK || len(r.GetStatuses()) != 1 {
			t.Fatalf("%v %v, want OK", r, err)
		}
	}
	metrics := httpGet(t, "http://"+httpAddr+"/metrics")
	for _, want := range []string{
		`sluice_config_ignored_fields_total{field="ratelimit.config.ratelimit.v3.RateLimitDescriptor.9"} 1`,
		`sluice_rls_ignored_fields_total{field="envoy.service.ratelimit.v3.RateLimitRequest.7"} 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("no %s in /metrics:\n%s", want, metrics)
		}
	}
	for _, want := range []string{
		`msg="xds: the pushed config has fields Sluice does not use; they are ignored" version=1 fields=[ratelimit.config.ratelimit.v3.RateLimitDescriptor.9]`,
		`field=envoy.service.ratelimit.v3.RateLimitRequest.7`,
	} {
		if strings.Count(logs.String(), want) != 1 {
			t.Errorf("want one log line with %s:\n%s", want, logs)
		}
	}
}
