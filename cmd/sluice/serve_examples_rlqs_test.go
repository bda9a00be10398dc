package main

import (
	"testing"

	bootstrappb "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	rlqsfilterpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmpb "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sluicehq/sluice/config"
)

// TestExamples_EnvoyRLQS checks examples/envoy/rlqs.yaml against Envoy's
// own API and validation rules, down to each bucket's settings, and that
// its static bucket matches a rule of examples/rlqs.yaml.
func TestExamples_EnvoyRLQS(t *testing.T) {
	var b bootstrappb.Bootstrap
	yamlProto(t, "examples/envoy/rlqs.yaml", readYAML(t, "../../examples/envoy/rlqs.yaml")[0], &b)
	unpack := func(what string, a *anypb.Any, m proto.Message) {
		t.Helper()
		if err := a.UnmarshalTo(m); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if err := m.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var hcm hcmpb.HttpConnectionManager
	unpack("http_connection_manager", b.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcm)
	var fc rlqsfilterpb.RateLimitQuotaFilterConfig
	if f := hcm.GetHttpFilters()[0]; f.GetName() != "envoy.filters.http.rate_limit_quota" {
		t.Fatalf("first filter %q", f.GetName())
	} else {
		unpack("rate_limit_quota", f.GetTypedConfig(), &fc)
	}
	if fc.GetDomain() != "rlqs" || fc.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "sluice" {
		t.Errorf("filter: domain %q, server %v; want rlqs on cluster sluice", fc.GetDomain(), fc.GetRlqsServer())
	}
	m := fc.GetBucketMatchers()
	actions := []*anypb.Any{m.GetOnNoMatch().GetAction().GetTypedConfig()}
	for _, fm := range m.GetMatcherList().GetMatchers() {
		actions = append(actions, fm.GetOnMatch().GetAction().GetTypedConfig())
	}
	table, err := config.Load("../../examples/rlqs.yaml", config.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range actions {
		var s rlqsfilterpb.RateLimitQuotaBucketSettings
		unpack("bucket settings", a, &s)
		if s.GetReportingInterval().AsDuration() <= 0 {
			t.Errorf("bucket %d: no reporting interval", i)
		}
		static := map[string]string{}
		for k, v := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			if sv := v.GetStringValue(); sv != "" {
				static[k] = sv
			} else {
				static[k] = "any-value" // a request attribute
			}
		}
		if r, _ := table.MatchBucket(fc.GetDomain(), static, nil); r == nil {
			t.Errorf("bucket %d %v matches no rule of examples/rlqs.yaml", i, static)
		}
	}
}
