package main

import (
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	ratelimitv3pb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/store/memcache/memcachetest"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// Envoy Gateway's translation of a BackendTrafficPolicy rule with a cost
// (internal/xds/translator/ratelimit.go; its test
// testdata/out/xds-ir/ratelimit.routes.yaml): the route's generic_key,
// then the client's header (x-user-id, Distinct), in two rate_limits
// entries of the route: one on the request path with hitsAddend number
// 0 (a peek), one with apply_on_stream_done and the usage read from
// dynamic metadata (a charge).
const (
	egCostDomain = "default/eg/http"
	egCostRoute  = "httproute/default/llm/rule/0/match/0/example"
	egBigRoute   = "httproute/default/money/rule/0/match/0/example"
	// egCostRule is the budget rule's path, the label of its series.
	egCostRule = egCostRoute + "_" + egCostRoute + ".rule-0-match-0"
)

// egCostLimits is the RateLimitConfig Envoy Gateway pushes for the
// policy: a budget of perSecond tokens per user on one route, and on
// another Envoy Gateway's own test of the uint32 bound, 4294967295 per
// hour.
func egCostLimits(perSecond uint32) *ratelimitpb.RateLimitConfig {
	rule := func(route string, unit ratelimitpb.RateLimitUnit, n uint32) *ratelimitpb.RateLimitDescriptor {
		return &ratelimitpb.RateLimitDescriptor{Key: route, Value: route, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
			Key: "rule-0-match-0", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: unit, RequestsPerUnit: n},
		}}}
	}
	return &ratelimitpb.RateLimitConfig{Name: egCostDomain, Domain: egCostDomain, Descriptors: []*ratelimitpb.RateLimitDescriptor{
		rule(egCostRoute, ratelimitpb.RateLimitUnit_SECOND, perSecond),
		rule(egBigRoute, ratelimitpb.RateLimitUnit_HOUR, 4294967295),
	}}
}

// egCostCall is what Envoy sends for one of the route's two entries: the
// descriptor with its own hits_addend, 0 on the request path (a peek), the
// usage once the stream is done (a charge).
func egCostCall(route, user string, hits uint64) *rlspb.RateLimitRequest {
	return &rlspb.RateLimitRequest{Domain: egCostDomain, Descriptors: []*ratelimitv3pb.RateLimitDescriptor{{
		Entries: []*ratelimitv3pb.RateLimitDescriptor_Entry{{Key: route, Value: route}, {Key: "rule-0-match-0", Value: user}},
		// Envoy's HitsAddend{number: 0} and HitsAddend{format: ...}.
		HitsAddend: wrapperspb.UInt64(hits),
	}}}
}

// TestBinary_EnvoyGatewayCost is issue 22's "Done means": Envoy Gateway's
// cost translation replayed as Envoy sends it, to the real binary with
// Envoy Gateway's default environment (limits over xDS with mTLS, TLS on
// gRPC), on the memory store (its environment without the Redis
// variables: one instance), on Redis shared by three instances and on
// memcached shared by three (BACKEND_TYPE=memcache). A
// user's budget of 100 tokens per second: peeks and charges go to the
// instances in turn; once a charge overspends the budget, every peek is
// OVER_LIMIT until the window ends, and the overspend is counted in the
// per-rule metrics. 4294967295 per hour, pushed over xDS, is ACKed and
// counted exactly. (A window of one second: an attempt that crosses a
// second boundary on a loaded machine is done again with another user.)
func TestBinary_EnvoyGatewayCost(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis, an xDS server and four sluice processes")
	}
	dir, xs, clientTLS := egControlPlane(t)
	rdb := redistest.Start(t)
	mc := memcachetest.Start(t)
	bin := sluiceBinary(t)

	// Envoy Gateway's default Deployment, with the test's addresses.
	env := func(st string) []string {
		var env []string
		for _, kv := range egDeployments(t)["default"] {
			k, v := kv[0], kv[1]
			switch {
			case strings.HasPrefix(v, "/certs/"):
				v = dir + v
			case k == "CONFIG_GRPC_XDS_SERVER_URL":
				v = xs.Addr
			case k == "REDIS_URL" || k == "REDIS_SOCKET_TYPE":
				if st != "redis" {
					continue
				}
				if k == "REDIS_URL" {
					v = rdb.Addr
				}
			case k == "PROMETHEUS_ADDR":
				v = "127.0.0.1:0"
			}
			env = append(env, k+"="+v)
		}
		if st == "memcache" {
			env = append(env, "BACKEND_TYPE=memcache", "MEMCACHE_HOST_PORT="+mc.Addr, "SLUICE_MEMCACHE_TIMEOUT="+storeTimeout)
		}
		return append(env, "HOST=127.0.0.1", "PORT=0", "GRPC_HOST=127.0.0.1", "GRPC_PORT=0", "REDIS_TIMEOUT="+storeTimeout)
	}
	xs.Push(t, egNode, "1", egCostLimits(100))
	for _, c := range []struct {
		name string
		n    int
	}{{"memory", 1}, {"redis", 3}, {"memcache", 3}} {
		t.Run(c.name, func(t *testing.T) {
			procs := make([]*egProc, c.n)
			for i := range procs {
				cmd := exec.Command(bin, "serve")
				cmd.Env = env(c.name)
				procs[i] = &egProc{sluiceProc: startCmd(t, cmd), name: fmt.Sprintf("%s %d", c.name, i)}
				procs[i].rls, procs[i].health = dialRLS(t, procs[i].grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
			}
			for _, p := range procs {
				waitFor(t, func() bool { return strings.Contains(p.log(), "xds: config applied (ACK)") }, p.name+"'s ACK")
				if !strings.Contains(p.log(), "store="+c.name) {
					t.Fatalf("%s: not on the %s store:\n%s", p.name, c.name, p.log())
				}
			}
			ctx := testCtx(t)
			ask := func(i int, in *rlspb.RateLimitRequest) *rlspb.RateLimitResponse_DescriptorStatus {
				t.Helper()
				r, err := procs[i%len(procs)].rls.ShouldRateLimit(ctx, in)
				if err != nil {
					t.Fatalf("%s: %v", procs[i%len(procs)].name, err)
				}
				if r.OverallCode != r.Statuses[0].Code {
					t.Fatalf("overall %v, status %v", r.OverallCode, r.Statuses[0].Code)
				}
				return r.Statuses[0]
			}
			okCode, over := rlspb.RateLimitResponse_OK, rlspb.RateLimitResponse_OVER_LIMIT

			// 4294967295 per hour: ACKed, counted exactly. A peek at the
			// limit is OK, as the reference answers it; past it, over.
			for i, s := range []struct {
				hits      uint64
				code      rlspb.RateLimitResponse_Code
				remaining uint32
			}{{0, okCode, 4294967295}, {4294967294, okCode, 1}, {0, okCode, 1}, {1, okCode, 0}, {0, okCode, 0}, {1, over, 0}, {0, over, 0}} {
				st := ask(i, egCostCall(egBigRoute, c.name, s.hits))
				if st.Code != s.code || st.LimitRemaining != s.remaining || st.GetCurrentLimit().GetRequestsPerUnit() != 4294967295 {
					t.Fatalf("4294967295 per hour, step %d (hits %d): %v, want %v with %d left", i, s.hits, st, s.code, s.remaining)
				}
			}

			// The budget, in one second, on the instances in turn.
			type step struct {
				hits      uint64
				code      rlspb.RateLimitResponse_Code
				remaining uint32
			}
			steps := []step{
				{0, okCode, 100}, // peek before request 1
				{80, okCode, 20}, // its usage, after the response
				{0, okCode, 20},  // peek before request 2
				{150, over, 0},   // its usage overspends: recorded whole
				{0, over, 0},     // every peek is over...
				{0, over, 0},
				{0, over, 0},
				{1, over, 0}, // (a charge adds, never frees)
				{0, over, 0},
			}
			done := false
			for attempt := 0; attempt < 10 && !done; attempt++ {
				// Start just after a second boundary.
				now := time.Now()
				time.Sleep(now.Truncate(time.Second).Add(time.Second + 50*time.Millisecond).Sub(now))
				user, begin := fmt.Sprintf("user-%d", attempt), time.Now()
				got := make([]*rlspb.RateLimitResponse_DescriptorStatus, len(steps))
				for i, s := range steps {
					got[i] = ask(i, egCostCall(egCostRoute, user, s.hits))
				}
				if end := time.Now(); end.Unix() != begin.Unix() || end.Sub(end.Truncate(time.Second)) > 900*time.Millisecond {
					t.Logf("attempt %d crossed a second boundary (%v to %v): again", attempt, begin, end)
					continue
				}
				for i, s := range steps {
					if st := got[i]; st.Code != s.code || st.LimitRemaining != s.remaining || st.GetCurrentLimit().GetRequestsPerUnit() != 100 {
						t.Errorf("%s: step %d (hits %d): %v, want %v with %d left", user, i, s.hits, st, s.code, s.remaining)
					}
				}
				// The window ends: the budget is whole again.
				now = time.Now()
				time.Sleep(now.Truncate(time.Second).Add(time.Second + 50*time.Millisecond).Sub(now))
				for i := range procs {
					if st := ask(i, egCostCall(egCostRoute, user, 0)); st.Code != okCode || st.LimitRemaining != 100 {
						t.Errorf("%s: peek in the next window on %s: %v, want OK with 100 left", user, procs[i].name, st)
					}
				}
				done = true
			}
			if !done {
				t.Fatal("no attempt fitted in one second")
			}

			// The overspend is in the metrics, summed over the instances:
			// at least the 150 of the successful attempt.
			var charged, chargedOver float64
			for _, p := range procs {
				charged += ruleMetric(t, p, "sluice_rule_charged_total", egCostRule)
				chargedOver += ruleMetric(t, p, "sluice_rule_charged_over_limit_total", egCostRule)
			}
			if charged < 231 || chargedOver < 150 {
				t.Errorf("charged %v, charged over the limit %v; want at least 231 and 150", charged, chargedOver)
			}
		})
	}
}

// ruleMetric is the value of a per-rule series on p's /metrics.
func ruleMetric(t *testing.T, p *egProc, name, rule string) float64 {
	t.Helper()
	res, err := http.Get("http://" + p.httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range fams[name].GetMetric() {
		if slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "rule" && l.GetValue() == rule }) {
			return m.GetCounter().GetValue()
		}
	}
	t.Fatalf("%s: no %s{rule=%q}", p.name, name, rule)
	return 0
}
