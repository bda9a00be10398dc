package main

import (
	"crypto/tls"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3pb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// egNode is the node id Envoy Gateway keeps the limits under.
const egNode = "envoy-ratelimit"

// egLimits is a RateLimitConfig as Envoy Gateway writes one for a
// BackendTrafficPolicy with a global limit of perMinute requests per
// client address on route rule 0 of an HTTPRoute: a level without a rate
// limit, then the rule.
func egLimits(perMinute uint32) *ratelimitpb.RateLimitConfig {
	const name = "default/eg/http"
	return &ratelimitpb.RateLimitConfig{Name: name, Domain: name, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: "httproute/default/backend/rule/0/match/0/example", Value: "httproute/default/backend/rule/0/match/0/example",
		Descriptors: []*ratelimitpb.RateLimitDescriptor{{
			Key:       "rule-0-match-0",
			RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute},
		}},
	}}}
}

// egRequest is what Envoy asks for egLimits: the route's entry, then the
// client's address.
func egRequest(client string) *rlspb.RateLimitRequest {
	const route = "httproute/default/backend/rule/0/match/0/example"
	return &rlspb.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3pb.RateLimitDescriptor{{
		Entries: []*ratelimitv3pb.RateLimitDescriptor_Entry{{Key: route, Value: route}, {Key: "rule-0-match-0", Value: client}},
	}}}
}

// TestBinary_EnvoyGateway runs the real binary twice with the environment
// Envoy Gateway's default Deployment gives envoyproxy/ratelimit (the
// second without FORCE_START_WITHOUT_INITIAL_CONFIG), its certificates
// written where the variables say, against a go-control-plane xDS server
// on loopback that requires client certificates and a Redis of its own.
// Only the listen addresses (free ports; the first also serves /rlconfig)
// and the Redis timeout (Sluice's 10 ms default fails on a loaded test
// machine) are given as flags.
func TestBinary_EnvoyGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, an xDS server and two sluice processes")
	}
	dir := t.TempDir()
	ca := testcert.NewCA(t)
	certFile, keyFile := ca.Peer(t).WriteFiles(t, dir, "tls")
	caFile := ca.WriteFile(t, dir)
	xs := xdstest.Start(t, "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{ca.Peer(t).TLS(t)},
		ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})
	rdb := redistest.Start(t)

	for k, v := range map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "true", "STATSD_PORT": "9125",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL": xs.Addr, "CONFIG_GRPC_XDS_NODE_ID": egNode,
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": certFile, "GRPC_SERVER_TLS_KEY": keyFile, "GRPC_SERVER_TLS_CA_CERT": caFile,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": certFile, "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": keyFile,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  caFile,
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": rdb.Addr,
	} {
		t.Setenv(k, v)
	}
	forced := startBinary(t, "--redis-timeout", "2s", "--debug-addr", "127.0.0.1:0")
	t.Setenv("FORCE_START_WITHOUT_INITIAL_CONFIG", "false") // the reference's default
	waiting := startBinary(t, "--redis-timeout", "2s")

	// Envoy's side: gRPC over TLS with its own certificate; the kubelet's
	// probe on /healthcheck.
	clientTLS := &tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{ca.Peer(t).TLS(t)}, MinVersion: tls.VersionTLS12}
	dial := func(p *sluiceProc) (rlspb.RateLimitServiceClient, healthpb.HealthClient) {
		return dialRLS(t, p.grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
	}
	probe := &http.Client{Transport: &http.Transport{TLSClientConfig: clientTLS}, Timeout: 10 * time.Second}
	healthcheck := func(p *sluiceProc) int {
		t.Helper()
		// The kubelet probes with plain HTTP, and the reference serves its
		// HTTP port without TLS. Sluice's GRPC_SERVER_USE_TLS mapping puts
		// the HTTP port on TLS too (a Go TLS server answers plain HTTP with
		// 400 "Client sent an HTTP request to an HTTPS server"); then the
		// probe asks over HTTPS.
		res, err := probe.Get("http://" + p.httpAddr + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode == http.StatusBadRequest && strings.Contains(string(body), "HTTPS server") {
			if res, err = probe.Get("https://" + p.httpAddr + "/healthcheck"); err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
		}
		return res.StatusCode
	}
	rlsF, hcF := dial(forced)
	rlsW, hcW := dial(waiting)
	ctx := testCtx(t)

	// Before the first push: with FORCE_START_WITHOUT_INITIAL_CONFIG,
	// healthy and no limits; without it, not serving.
	if r, err := hcF.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING || healthcheck(forced) != 200 {
		t.Errorf("forced start before the first push: %v %v, /healthcheck %d; want SERVING, 200", r, err, healthcheck(forced))
	}
	if r, err := rlsF.ShouldRateLimit(ctx, egRequest("10.0.0.1")); err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
		t.Errorf("forced start before the first push: %v %v, want OK without a limit", r, err)
	}
	if r, err := hcW.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_NOT_SERVING || healthcheck(waiting) != 503 {
		t.Errorf("no forced start, before the first push: %v %v, /healthcheck %d; want NOT_SERVING, 503", r, err, healthcheck(waiting))
	}

	rlconfig := func() string {
		t.Helper()
		m := regexp.MustCompile(`msg="debug endpoints" addr=(\S+)`).FindStringSubmatch(forced.log())
		if m == nil {
			t.Fatalf("no debug address in the log:\n%s", forced.log())
		}
		res, err := http.Get("http://" + m[1] + "/rlconfig")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("/rlconfig: %s", res.Status)
		}
		return string(body)
	}
	if got := rlconfig(); got != "" {
		t.Errorf("/rlconfig before the first push: %q, want no rule", got)
	}

	// The first push reaches both (their ACKs), and the limit holds across
	// them: they share Redis.
	xs.Push(t, egNode, "1", egLimits(3))
	acks := 0
	for acks < 2 {
		if r := xs.Reply(t); r.GetErrorDetail() == nil && r.GetVersionInfo() == "1" {
			acks++
		}
	}
	waitServing(t, hcW)
	for i, c := range []struct {
		rls  rlspb.RateLimitServiceClient
		want rlspb.RateLimitResponse_Code
	}{{rlsF, rlspb.RateLimitResponse_OK}, {rlsW, rlspb.RateLimitResponse_OK}, {rlsF, rlspb.RateLimitResponse_OK}, {rlsW, rlspb.RateLimitResponse_OVER_LIMIT}} {
		r, err := c.rls.ShouldRateLimit(ctx, egRequest("10.0.0.1"))
		if err != nil || r.OverallCode != c.want || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 3 {
			t.Fatalf("request %d: %v %v, want %v under the pushed limit of 3", i, r, err, c.want)
		}
	}
	const rule = "default/eg/http.httproute/default/backend/rule/0/match/0/example_httproute/default/backend/rule/0/match/0/example.rule-0-match-0: unit=MINUTE requests_per_unit=3, shadow_mode: false, quota_mode: false\n"
	if got := rlconfig(); got != rule {
		t.Errorf("/rlconfig after the push:\n%q\nwant\n%q", got, rule)
	}
	if keys := strings.TrimSpace(rdb.CLI("DBSIZE")); keys == "0" {
		t.Error("no counter in Redis")
	}

	// A live update: the new limit applies at once, the count goes on.
	xs.Push(t, egNode, "2", egLimits(10))
	for acks = 0; acks < 2; {
		if r := xs.Reply(t); r.GetErrorDetail() == nil && r.GetVersionInfo() == "2" {
			acks++
		}
	}
	r, err := rlsW.ShouldRateLimit(ctx, egRequest("10.0.0.1"))
	if err != nil || r.OverallCode != rlspb.RateLimitResponse_OK || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 10 || r.Statuses[0].LimitRemaining != 6 {
		t.Fatalf("after the update: %v %v, want OK with 6 of 10 left", r, err)
	}

	// A bad push is NACKed with the resource and field; the limit stays.
	bad := egLimits(1)
	bad.Descriptors[0].Descriptors[0].RateLimit.Unit = ratelimitpb.RateLimitUnit(42)
	xs.Push(t, egNode, "3", bad)
	want := `config: resource "default/eg/http": descriptors[0].descriptors[0]: unknown unit "42"`
	for _, p := range []*sluiceProc{forced, waiting} {
		for !strings.Contains(p.log(), "xds: config rejected (NACK)") {
			r := xs.Reply(t)
			if r.GetErrorDetail() != nil && (!strings.HasPrefix(r.GetErrorDetail().GetMessage(), want) || r.GetVersionInfo() != "2") {
				t.Fatalf("NACK %v, want version 2 and %q", r, want)
			}
		}
	}
	for _, rls := range []rlspb.RateLimitServiceClient{rlsF, rlsW} {
		r, err := rls.ShouldRateLimit(ctx, egRequest("10.0.0.2"))
		if err != nil || r.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 10 {
			t.Errorf("after the bad push: %v %v, want the limit of 10 still", r, err)
		}
	}
	for _, p := range []*sluiceProc{forced, waiting} {
		if code := healthcheck(p); code != 200 {
			t.Errorf("/healthcheck after the bad push: %d, want 200", code)
		}
		if log := p.log(); !strings.Contains(log, "xds: config applied (ACK)") {
			t.Errorf("log:\n%s", log)
		}
	}
}
