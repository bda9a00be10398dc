package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3pb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	ratelimitpb "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/config/xds/xdstest"
	"github.com/sluicehq/sluice/internal/logbuf"
	"github.com/sluicehq/sluice/observe/ui"
	"github.com/sluicehq/sluice/store/redis/redistest"
)

// egRulesLimits is what Envoy Gateway pushes for a BackendTrafficPolicy
// on HTTPRoute default/<route> with two rules, each per client address
// (Distinct): perHour for rule 0, perSecond for rule 1, under the
// route's descriptor on listener default/eg/http.
func egRulesLimits(route string, perHour, perSecond uint32) *ratelimitpb.RateLimitConfig {
	const domain = "default/eg/http"
	key := egRouteKey(route)
	return &ratelimitpb.RateLimitConfig{Name: domain, Domain: domain, Descriptors: []*ratelimitpb.RateLimitDescriptor{{
		Key: key, Value: key,
		Descriptors: []*ratelimitpb.RateLimitDescriptor{
			{Key: "rule-0-match-0", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_HOUR, RequestsPerUnit: perHour}},
			{Key: "rule-1-match-0", RateLimit: &ratelimitpb.RateLimitPolicy{Unit: ratelimitpb.RateLimitUnit_SECOND, RequestsPerUnit: perSecond}},
		},
	}}}
}

func egRouteKey(route string) string { return "httproute/default/" + route + "/rule/0/match/0/example" }

// egRuleRequest is what Envoy asks for rule of egRulesLimits(route) for a
// client address.
func egRuleRequest(route, rule, client string) *rlspb.RateLimitRequest {
	key := egRouteKey(route)
	return &rlspb.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3pb.RateLimitDescriptor{{
		Entries: []*ratelimitv3pb.RateLimitDescriptor_Entry{{Key: key, Value: key}, {Key: rule, Value: client}},
	}}}
}

// egOverlayYAML is the overlay of the test (as examples/overlay has it):
// rule 0 of route backend a token bucket of 3, rule 1 a sliding window of
// 30 seconds, on any listener of Gateway default/eg.
const egOverlayYAML = `domain: default/eg/*
descriptors:
  - key: httproute/default/backend/rule/0/match/0/*
    value: "*"
    descriptors:
      - key: rule-0-match-0
        rate_limit: {algorithm: token_bucket, burst: 3}
      - key: rule-1-match-0
        rate_limit: {algorithm: sliding_window, unit_multiplier: 30}
`

// TestServe_EnvoyGatewayOverlay is issue 33's "Done means": serve runs
// with Envoy Gateway's default environment (limits over xDS with mTLS,
// TLS on gRPC) plus SLUICE_XDS_OVERLAY, on memory and on Redis, and takes
// Envoy Gateway's push for two per-client rules. The overlay turns the
// 60-per-hour rule into a token bucket of 3 (3 quick requests pass, the
// 4th is denied) and the 10-per-second rule into a sliding window of 30
// seconds (10 pass, the 11th is denied, the limit reported with its
// multiplier), as files saying so would; the status page shows what the
// overlay changed and from where. A bad overlay keeps the last good one;
// a fixed one applies to the limits in force without a push.
// A push that renames the route drops the overlay's effect (the renamed
// rule is a fixed window again: 60 pass) and the entries are reported as
// unmatched in the log, on the status page and in
// sluice_xds_overlay_unmatched.
//
// serve runs on the wall clock: the counts are checked only when no
// period that could change them ended during the requests (a token
// refills every minute, a sliding window turns every 30 s, the fixed
// window every hour).
func TestServe_EnvoyGatewayOverlay(t *testing.T) {
	for _, backend := range []string{"memory", "redis"} {
		t.Run(backend, func(t *testing.T) {
			dir, xs, clientTLS := egControlPlane(t)
			overlayDir := t.TempDir()
			overlay := filepath.Join(overlayDir, "eg.yaml")
			writeFile(t, overlay, egOverlayYAML)
			env := serveEnv{}
			for _, kv := range egDeployments(t)["default"] {
				v := kv[1]
				if strings.HasPrefix(v, "/certs/") {
					v = dir + v
				}
				env[kv[0]] = v
			}
			env["CONFIG_GRPC_XDS_SERVER_URL"] = xs.Addr
			env["PROMETHEUS_ADDR"] = "127.0.0.1:0"
			env["SLUICE_XDS_OVERLAY"] = overlayDir
			if backend == "redis" {
				env["REDIS_URL"] = redistest.Start(t).Addr
				env["REDIS_TIMEOUT"] = storeTimeout
			} else {
				env["SLUICE_STORE"] = "memory"
			}
			logs := &logbuf.Buffer{}
			grpcAddr, httpAddr := startServeLogged(t, env, logs, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0")
			rls, _ := dialRLS(t, grpcAddr, grpc.WithTransportCredentials(credentials.NewTLS(clientTLS)))
			base := "http://" + httpAddr
			limits := func() ui.LimitsView {
				t.Helper()
				var v ui.LimitsView
				if err := json.Unmarshal([]byte(httpGet(t, base+"/ui/api/limits")), &v); err != nil {
					t.Fatal(err)
				}
				return v
			}
			rule := func(v ui.LimitsView, route, key string) *ui.RuleInfo {
				for i, r := range v.Rules {
					if r.Path == egRouteKey(route)+"_"+egRouteKey(route)+"."+key {
						return &v.Rules[i]
					}
				}
				return nil
			}
			overlayStatus := func() *ui.OverlayStatus {
				t.Helper()
				var o ui.Overview
				if err := json.Unmarshal([]byte(httpGet(t, base+"/ui/api/overview")), &o); err != nil {
					t.Fatal(err)
				}
				if o.Config.Overlay == nil {
					t.Fatal("the overview has no overlay")
				}
				return o.Config.Overlay
			}
			ctx := testCtx(t)
			ask := func(route, key, client string) *rlspb.RateLimitResponse {
				t.Helper()
				r, err := rls.ShouldRateLimit(ctx, egRuleRequest(route, key, client))
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			codes := func(route, key, client string, n int) (got []rlspb.RateLimitResponse_Code, last *rlspb.RateLimitResponse) {
				for range n {
					last = ask(route, key, client)
					got = append(got, last.OverallCode)
				}
				return got, last
			}
			// want is n-1 OKs then OVER_LIMIT.
			want := func(n int) string {
				return strings.Repeat("OK ", n-1) + "OVER_LIMIT"
			}
			spell := func(cs []rlspb.RateLimitResponse_Code) string {
				s := make([]string, len(cs))
				for i, c := range cs {
					s[i] = c.String()
				}
				return strings.Join(s, " ")
			}

			xs.Push(t, egNode, "1", egRulesLimits("backend", 60, 10))
			waitFor(t, func() bool { return rule(limits(), "backend", "rule-0-match-0") != nil }, "the push on /ui/api/limits")
			v := limits()
			bucket, window := rule(v, "backend", "rule-0-match-0"), rule(v, "backend", "rule-1-match-0")
			if bucket.Algorithm != "token_bucket" || bucket.Burst != 3 || bucket.RequestsPerUnit != 60 || bucket.Overlay == nil ||
				bucket.Overlay.File != overlay || bucket.Overlay.Line != 6 || strings.Join(bucket.Overlay.Fields, ", ") != "algorithm: token_bucket, burst: 3" {
				t.Errorf("rule 0 on /ui/api/limits: %+v %+v, want a token bucket of 3 set by %s:6", bucket, bucket.Overlay, overlay)
			}
			if window.Algorithm != "sliding_window" || window.UnitMultiplier != 30 || window.Overlay == nil || window.Overlay.Line != 8 {
				t.Errorf("rule 1 on /ui/api/limits: %+v %+v, want a sliding window of 30 s set by %s:8", window, window.Overlay, overlay)
			}

			// The token bucket: 3 quick requests, then none until a token
			// refills (one a minute).
			begin := time.Now()
			got, last := codes("backend", "rule-0-match-0", backend, 4)
			if time.Since(begin) < time.Minute {
				if spell(got) != want(4) {
					t.Errorf("rule 0 (60 an hour as a token bucket of 3), 4 quick requests: %s, want %s", spell(got), want(4))
				}
			} else {
				t.Logf("a minute passed during the requests (%s): their codes are not checked", spell(got))
			}
			if l := last.Statuses[0].GetCurrentLimit(); l.GetRequestsPerUnit() != 60 || l.GetUnit() != rlspb.RateLimitResponse_RateLimit_HOUR {
				t.Errorf("rule 0's limit: %v, want 60 an hour", l)
			}

			// The sliding window of 30 s: 10 pass, the 11th is denied.
			window30 := time.Now().Unix() / 30
			got, last = codes("backend", "rule-1-match-0", backend, 11)
			if time.Now().Unix()/30 == window30 {
				if spell(got) != want(11) {
					t.Errorf("rule 1 (10 per 30 s, sliding), 11 requests: %s, want %s", spell(got), want(11))
				}
			} else {
				t.Logf("a 30 s window ended during the requests (%s): their codes are not checked", spell(got))
			}
			if l := last.Statuses[0].GetCurrentLimit(); l.GetRequestsPerUnit() != 10 || l.GetUnit() != rlspb.RateLimitResponse_RateLimit_SECOND ||
				l.GetUnitMultiplier().GetValue() != 30 {
				t.Errorf("rule 1's limit: %v, want 10 per 30 seconds", l)
			}
			if o := overlayStatus(); !o.LastOK || o.Files != 1 || o.Entries != 2 || len(o.Unmatched) != 0 {
				t.Errorf("overlay status: %+v, want 2 entries, all applied", o)
			}

			// A bad overlay keeps the last good one, with its file:line.
			writeFile(t, overlay, strings.Replace(egOverlayYAML, "burst: 3", "burst: 3, unit: minute", 1))
			waitFor(t, func() bool {
				return strings.Contains(httpGet(t, base+"/metrics"), "sluice_xds_overlay_last_reload_successful 0")
			},
				"sluice_xds_overlay_last_reload_successful 0")
			if o := overlayStatus(); o.LastError == nil || len(o.LastError.Problems) != 1 || o.LastError.Problems[0].File != overlay ||
				o.LastError.Problems[0].Line != 7 || !strings.Contains(o.LastError.Problems[0].Msg, "unit in rate_limit cannot be set in an overlay") {
				t.Errorf("overlay status after a bad overlay: %+v", o.LastError)
			}
			if r := rule(limits(), "backend", "rule-0-match-0"); r.Algorithm != "token_bucket" {
				t.Errorf("after a bad overlay, rule 0 is %+v, want the last good overlay's token bucket", r)
			}
			if !strings.Contains(logs.String(), "overlay not reloaded; the previous overlay stays in force") {
				t.Error("the bad overlay is not logged")
			}

			// A fixed overlay applies to the limits in force, without a
			// new push.
			writeFile(t, overlay, strings.Replace(egOverlayYAML, "burst: 3", "burst: 5", 1))
			waitFor(t, func() bool {
				r := rule(limits(), "backend", "rule-0-match-0")
				return r.Burst == 5 && r.Overlay != nil
			}, "the fixed overlay's burst of 5 on /ui/api/limits")
			if m := httpGet(t, base+"/metrics"); !strings.Contains(m, "sluice_xds_overlay_last_reload_successful 1") ||
				!strings.Contains(m, `sluice_xds_overlay_reloads_total{result="failure"} 1`) {
				t.Error("/metrics lacks the overlay's reloads: a success last, one failure")
			}

			// A push that renames the route: its rules are as pushed, and
			// the overlay's entries match nothing.
			xs.Push(t, egNode, "2", egRulesLimits("renamed", 60, 10))
			waitFor(t, func() bool { return rule(limits(), "renamed", "rule-0-match-0") != nil }, "the renaming push on /ui/api/limits")
			if r := rule(limits(), "renamed", "rule-0-match-0"); r.Algorithm != "fixed_window" || r.Overlay != nil {
				t.Errorf("the renamed rule 0: %+v, want the pushed fixed window", r)
			}
			hour := time.Now().Truncate(time.Hour)
			got, _ = codes("renamed", "rule-0-match-0", backend, 61)
			if time.Now().Truncate(time.Hour).Equal(hour) {
				if spell(got) != want(61) {
					t.Errorf("the renamed rule 0 (60 an hour, a fixed window), 61 requests: %s, want %s", spell(got), want(61))
				}
			} else {
				t.Logf("an hour ended during the requests: their codes are not checked")
			}
			o := overlayStatus()
			if len(o.Unmatched) != 2 || o.Unmatched[0].File != overlay || o.Unmatched[0].Line != 6 || o.Unmatched[1].Line != 8 ||
				!strings.Contains(o.Unmatched[0].Reason, "matches no rate_limit") {
				t.Errorf("unmatched entries on the status page: %+v, want %s:6 and :8", o.Unmatched, overlay)
			}
			if m := httpGet(t, base+"/metrics"); !strings.Contains(m, "sluice_xds_overlay_unmatched 2") {
				t.Error("/metrics lacks sluice_xds_overlay_unmatched 2")
			}
			waitFor(t, func() bool { return strings.Count(logs.String(), `msg="overlay entry matches no rule"`) >= 2 }, "the unmatched entries logged")
		})
	}
}

// TestServe_DefaultAlgorithm: with --default-algorithm token_bucket
// (SLUICE_DEFAULT_ALGORITHM) a pushed 10 per second is a bucket of 10
// that refills 10 a second: 10 quick requests pass, the 11th is denied
// (a fixed window would admit it in the next second; a bucket refills one
// token per 100 ms, so the check needs the 11 requests within 100 ms,
// and is skipped otherwise); the status page shows the bucket.
func TestServe_DefaultAlgorithm(t *testing.T) {
	xs := xdstest.Start(t, "127.0.0.1:0", nil)
	grpcAddr, httpAddr, _ := startServe(t, serveEnv{"SLUICE_DEFAULT_ALGORITHM": "token_bucket"},
		"--config-source", "xds", "--xds-server", xs.Addr, "--xds-node-id", egNode)
	rls, _ := dialRLS(t, grpcAddr)
	xs.Push(t, egNode, "1", egRulesLimits("backend", 60, 10))
	var v ui.LimitsView
	waitFor(t, func() bool {
		if err := json.Unmarshal([]byte(httpGet(t, "http://"+httpAddr+"/ui/api/limits")), &v); err != nil {
			t.Fatal(err)
		}
		return len(v.Rules) == 2
	}, "the push on /ui/api/limits")
	if r := v.Rules[1]; r.Algorithm != "token_bucket" || r.Burst != 10 || r.RequestsPerUnit != 10 || r.Unit != "second" {
		t.Errorf("the pushed 10 per second: %+v, want a token bucket of 10 refilling 10/s", r)
	}
	ctx := testCtx(t)
	var got []rlspb.RateLimitResponse_Code
	begin := time.Now()
	for range 11 {
		r, err := rls.ShouldRateLimit(ctx, egRuleRequest("backend", "rule-1-match-0", "client"))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.OverallCode)
	}
	if time.Since(begin) < 100*time.Millisecond {
		if got[9] != rlspb.RateLimitResponse_OK || got[10] != rlspb.RateLimitResponse_OVER_LIMIT {
			t.Errorf("11 quick requests: %v, want 10 OK, then OVER_LIMIT", got)
		}
	} else {
		t.Logf("the requests took %v: their codes are not checked", time.Since(begin))
	}
	for i, c := range got[:10] {
		if c != rlspb.RateLimitResponse_OK {
			t.Errorf("request %d: %v, want OK (the bucket holds 10)", i+1, c)
		}
	}
}

// writeFile replaces file name's content at once (a temporary file
// renamed over it; its name ends in .tmp, which no config reads).
func writeFile(t *testing.T, name, text string) {
	t.Helper()
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, name); err != nil {
		t.Fatal(err)
	}
}
