package main

import (
	"encoding/json"
	"os"
	"testing"

	bootstrappb "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routepb "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// yamlProto decodes YAML (as Envoy reads it: proto JSON field names) into
// m, rejecting unknown fields, and runs Envoy's validation rules.
func yamlProto(t *testing.T, what string, v any, m proto.Message) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := protojson.Unmarshal(b, m); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if va, ok := m.(interface{ ValidateAll() error }); ok {
		if err := va.ValidateAll(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

func readYAML(t *testing.T, path string) []any {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var docs []any
	dec := yaml.NewDecoder(f)
	for {
		var v any
		if err := dec.Decode(&v); err != nil {
			break
		}
		docs = append(docs, v)
	}
	if len(docs) == 0 {
		t.Fatalf("%s: no YAML documents", path)
	}
	return docs
}

// TestExamples_Envoy checks the README's Envoy bootstrap against Envoy's
// own API and validation rules, typed filter configs included.
func TestExamples_Envoy(t *testing.T) {
	var b bootstrappb.Bootstrap
	yamlProto(t, "examples/envoy/envoy.yaml", readYAML(t, "../../examples/envoy/envoy.yaml")[0], &b)
	if got := b.GetStaticResources().GetClusters()[0].GetName(); got != "sluice" {
		t.Errorf("first cluster %q, want sluice", got)
	}
}

// TestExamples_Istio checks the EnvoyFilter patches: the rate-limit filter
// config and the route rate_limits.
func TestExamples_Istio(t *testing.T) {
	docs := readYAML(t, "../../examples/istio/envoyfilter.yaml")
	if len(docs) != 2 {
		t.Fatalf("%d documents, want 2", len(docs))
	}
	patch := func(doc any) map[string]any {
		spec := doc.(map[string]any)["spec"].(map[string]any)
		return spec["configPatches"].([]any)[0].(map[string]any)["patch"].(map[string]any)["value"].(map[string]any)
	}
	var filter anypb.Any
	yamlProto(t, "rate-limit filter", patch(docs[0])["typed_config"], &filter)
	m, err := filter.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
		t.Errorf("rate-limit filter: %v", err)
	}
	for _, rl := range patch(docs[1])["rate_limits"].([]any) {
		yamlProto(t, "rate_limits", rl, &routepb.RateLimit{})
	}
}
